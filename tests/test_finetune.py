"""analyses.finetune on a tiny model: the GRPO pieces do what they claim, both
recipes run a few steps and write a checkpoint that `load_model` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rnr_interp.models import load_model

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "finetune.py"


@pytest.fixture(scope="module")
def ft():
    from rnr_interp.analyses import finetune

    return finetune


def test_group_advantages(ft):
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 3.0]])
    a = ft.group_advantages(r)
    assert torch.allclose(a[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-4)
    assert (a[1] == 0).all()  # an all-correct group carries no signal
    assert a[2, 3] > 0 and (a[2, :3] < 0).all() and abs(float(a[2].sum())) < 1e-4


def test_sampler_shares_the_policy_weights(ft):
    policy, tok = ft.load_policy("tiny-llama:2")
    sampler = ft.sampler_for(policy, tok, "tiny-llama:2")
    ids = torch.tensor([[1, 10, 11, 12]])
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.1)
        # Equal to float32 rounding, not bitwise: the sampler's bridge runs the fused
        # attention path, the plain policy HF's eager attention. Unshared weights would
        # miss the +0.1 on every parameter by far more.
        torch.testing.assert_close(policy(ids).logits, sampler.hf_model(ids).logits, rtol=1e-5, atol=1e-5)


def test_policy_gradient_step_moves_logprobs_by_advantage(ft):
    """One update with advantages (+1, -1) raises the first completion's log-prob and
    lowers the second's, measured through the recomputed log-probs."""
    policy, tok = ft.load_policy("tiny-llama:2")
    opt = torch.optim.SGD(policy.parameters(), lr=0.05)
    prompts, comps = [[1, 20, 21], [1, 20, 21]], [[30, 31, 32], [40, 41]]
    with torch.no_grad():
        before = ft.completion_logprobs(policy, prompts, comps, 0)
    ft.weighted_logprob_step(policy, opt, prompts, comps, [1.0, -1.0], 0, micro_batch=1)
    with torch.no_grad():
        after = ft.completion_logprobs(policy, prompts, comps, 0)
    assert after[0] > before[0] and after[1] < before[1]


def test_completion_logprobs_ignore_padding(ft):
    policy, _ = ft.load_policy("tiny-llama:2")
    with torch.no_grad():
        alone = ft.completion_logprobs(policy, [[1, 5, 6]], [[7, 8]], 0)
        padded = ft.completion_logprobs(policy, [[1, 5, 6], [1, 5, 6, 9, 9, 9]], [[7, 8], [7, 8, 9, 9]], 0)
    assert torch.allclose(alone[0], padded[0], atol=1e-5)


@pytest.mark.parametrize("recipe", ["grpo", "sft"])
def test_recipe_smoke_writes_loadable_checkpoint(ft, tmp_path, recipe):
    out = ft.main(["--recipe", recipe, "--model", "tiny-llama:2", "--steps", "2", "--prompts-per-step", "3",
                   "--group", "4", "--lr", "1e-3", "--audit-n", "8", "--train-n", "20", "--out", str(tmp_path / recipe)])
    meta = json.loads((out / "finetune.json").read_text())
    assert [row["step"] for row in meta["log"]] == [0, 1]
    lm = load_model(str(out))
    assert lm.n_layers == 2
    base, _ = ft.load_policy("tiny-llama:2")
    trained = dict(lm.hf_model.named_parameters())
    if recipe == "sft":  # a supervised step always changes the weights
        assert meta["log"][1]["loss"] < meta["log"][0]["loss"] * 1.5
        w = next(v for k, v in trained.items() if "embed_tokens" in k)
        assert not torch.equal(w, base.model.embed_tokens.weight)


def test_training_questions_exclude_the_audit(ft):
    cfg = ft.Config(train_n=300, audit_n=64)
    from rnr_interp.tasks import load_task

    audit = {q.text for q in load_task("arithmetic", n=64).questions}
    train = ft.training_questions(cfg)
    assert train and not audit & {q.text for q in train}
