"""Fine-tune the demo model on arithmetic, two ways, to get checkpoints worth auditing.

    python -m rnr_interp.analyses.finetune --recipe grpo --out runs/ckpt/grpo
    python -m rnr_interp.analyses.finetune --recipe sft  --out runs/ckpt/sft
    python -m rnr_interp.analyses.finetune --recipe grpo --model tiny-llama:2 --steps 2 --out /tmp/x   # smoke

Recipes (both train on `arithmetic` problems drawn with another seed than the audit's,
with the audit's problems removed, so the audit measures held-out questions):

- grpo: RL with a verifiable reward, group-relative policy gradient. Per step, P prompts
  get G samples each from the engine (`rnr_interp.engine.generate`, temperature T); reward =
  `task.grade`; advantage = (r - mean) / std within the prompt's group (0 when the group
  is all right or all wrong); loss = -mean_i A_i * mean_t log p(token_t), the sampled
  tokens' log-probs recomputed with grad through the plain HF model. One update per
  batch (on-policy, so the PPO ratio is 1 and needs no clipping); no KL term.
- sft: supervised fine-tuning on templated gold solutions "Answer: N" + the turn end,
  cross-entropy on the answer tokens only.

The policy is the plain HF model (it can `save_pretrained`). The sampler is a bridged
copy whose parameters *are* the policy's (a deepcopy told to reuse every parameter), so
it samples from the current weights with no syncing. Each run writes a checkpoint folder
(weights + tokenizer + `finetune.json` with the config and per-step log) that
`rnr_interp.models.load_model(path)` reads.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from rnr_interp.engine.decoding import Decoding

from rnr_interp.engine.generate import generate
from rnr_interp.models import TINY_ARCHITECTURES, LoadedModel, build_tiny, wrap
from rnr_interp.engine.sampling import candidate_seed, prompt_ids
from rnr_interp.tasks import arithmetic, load_task
from rnr_interp.tasks.base import Question, Task


@dataclass(frozen=True)
class Config:
    recipe: str = "grpo"  # grpo | sft
    model: str = "smollm2"  # or tiny-llama[:L] etc. (smoke tests)
    out: str = "runs/ckpt/grpo"
    steps: int = 10
    prompts_per_step: int = 8
    group: int = 8  # G, samples per prompt (grpo)
    lr: float = 2e-5
    temperature: float = 0.7  # grpo sampling temperature (at 1.0 SmolLM2 is right ~2% of the time: few informative groups)
    train_n: int = 400  # training problems drawn (before removing the audit's)
    train_seed: int = 1
    audit_n: int = 64  # the audit's questions (arithmetic, seed 0) are held out
    micro_batch: int = 16  # sequences per backward pass
    seed: int = 0


# -- models ---------------------------------------------------------------------------


def load_policy(spec: str, seed: int = 0):
    """The plain (unbridged) HF model and tokenizer for a spec: the demo checkpoint
    folder, a tiny random model, or a checkpoint folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name, _, arg = spec.partition(":")
    if name in TINY_ARCHITECTURES:
        return build_tiny(name, n_layers=int(arg) if arg else 3, seed=seed)
    if spec == "smollm2":
        from rnr_interp.models import smollm2_dir

        path = smollm2_dir()
    else:
        path = Path(spec)
    return (AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=False),
            AutoTokenizer.from_pretrained(path, trust_remote_code=False))


def sampler_for(policy, tokenizer, spec: str) -> LoadedModel:
    """A bridged copy of `policy` for the engine that shares its parameters, so it
    always samples from the weights being trained (the bridge rewrites the module tree
    in place, which is why the policy itself is not wrapped)."""
    twin = copy.deepcopy(policy, memo={id(p): p for p in policy.parameters()})
    return wrap(spec, twin, tokenizer, prepend_bos=True if spec.partition(":")[0] in TINY_ARCHITECTURES else None)


def turn_end_id(tokenizer) -> int:
    vocab = tokenizer.get_vocab()
    return vocab["<|im_end|>"] if "<|im_end|>" in vocab else tokenizer.eos_token_id


# -- data -------------------------------------------------------------------------------


def training_questions(cfg: Config) -> list[Question]:
    """Arithmetic problems from another seed than the audit's, minus any problem text
    the audit asks (2-digit sums collide now and then)."""
    held_out = {q.text for q in load_task("arithmetic", n=cfg.audit_n).questions}
    return [q for q in arithmetic(n=cfg.train_n, seed=cfg.train_seed).questions if q.text not in held_out]


# -- log-probs with grad ------------------------------------------------------------------


def completion_logprobs(model, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int) -> Float[Tensor, "b"]:
    """Mean log-prob per completion token under `model` (temperature 1), with grad.
    Sequences are prompt + completion, right-padded; only completion positions count."""
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    target = torch.zeros_like(ids, dtype=torch.bool)
    for i, (p, s) in enumerate(zip(prompts, seqs)):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
        target[i, len(p):len(s)] = True
    device = next(model.parameters()).device
    ids, mask, target = ids.to(device), mask.to(device), target.to(device)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    tmask = target[:, 1:].float()
    return (logp * tmask).sum(-1) / tmask.sum(-1).clamp(min=1)


def group_advantages(rewards: Float[Tensor, "p g"], eps: float = 1e-6) -> Float[Tensor, "p g"]:
    """(r - group mean) / group std; 0 for a group whose rewards are all equal (it says
    nothing about which sample was better)."""
    mean = rewards.mean(-1, keepdim=True)
    std = rewards.std(-1, keepdim=True, unbiased=False)
    return torch.where(std > eps, (rewards - mean) / (std + eps), torch.zeros_like(rewards))


def weighted_logprob_step(policy, opt, prompts, completions, weights: Sequence[float], pad_id: int, micro_batch: int) -> float:
    """One optimizer step on loss = -sum_i w_i * mean_t log p_i / len(weights),
    accumulated over micro-batches; sequences with w_i = 0 are skipped."""
    keep = [i for i, w in enumerate(weights) if w != 0]
    total = len(weights)
    opt.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for start in range(0, len(keep), micro_batch):
        idx = keep[start:start + micro_batch]
        lp = completion_logprobs(policy, [prompts[i] for i in idx], [completions[i] for i in idx], pad_id)
        w = torch.tensor([weights[i] for i in idx], dtype=lp.dtype, device=lp.device)
        loss = -(w * lp).sum() / total
        loss.backward()
        loss_sum += float(loss.detach())
    if keep:
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
    return loss_sum


# -- recipes --------------------------------------------------------------------------------


def grpo_step(policy, opt, sampler: LoadedModel, task: Task, questions: Sequence[Question], cfg: Config, step: int,
              reward: Callable[[str, Question], float] | None = None) -> dict:
    """Sample G per prompt, reward, normalise within groups, one policy-gradient update."""
    reward = reward or (lambda text, q: float(task.grade(task.extract(text), q)))
    prompts = [prompt_ids(sampler, task, q) for q in questions]
    seeds = [[candidate_seed(cfg.seed * 1_000_003 + step, q.id, j) for j in range(cfg.group)] for q in questions]
    policy.eval()  # no dropout while sampling or scoring: the log-probs must be the sampler's
    gens = generate(sampler, prompts, n=cfg.group, seeds=seeds, stop_strings=task.stop_strings,
                    decoding=Decoding(temperature=cfg.temperature, max_new_tokens=task.max_new_tokens))
    rewards = torch.tensor([[reward(g.text, q) for g in row] for q, row in zip(questions, gens)])
    adv = group_advantages(rewards)
    flat_prompts = [p for p in prompts for _ in range(cfg.group)]
    # An empty completion (immediate stop) has no token to push up or down.
    flat_comps = [g.tokens for row in gens for g in row]
    weights = [float(a) if toks else 0.0 for a, toks in zip(adv.flatten().tolist(), flat_comps)]
    loss = weighted_logprob_step(policy, opt, flat_prompts, flat_comps, weights, sampler.tokenizer.pad_token_id, cfg.micro_batch)
    return {"loss": loss, "reward": float(rewards.mean()), "informative_groups": int((adv.abs().sum(-1) > 0).sum())}


def sft_step(policy, opt, sampler: LoadedModel, task: Task, questions: Sequence[Question], cfg: Config, step: int) -> dict:
    """Cross-entropy on "Answer: N" + turn end for each question."""
    tok = sampler.tokenizer
    prompts = [prompt_ids(sampler, task, q) for q in questions]
    targets = [tok(f"Answer: {q.answer}", add_special_tokens=False).input_ids + [turn_end_id(tok)] for q in questions]
    policy.eval()
    loss = weighted_logprob_step(policy, opt, prompts, targets, [1.0] * len(questions), tok.pad_token_id, cfg.micro_batch)
    return {"loss": loss}


RECIPES = {"grpo": grpo_step, "sft": sft_step}


def train(cfg: Config, progress: bool = True) -> Path:
    """Run a recipe and save the checkpoint folder; returns its path."""
    if cfg.recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {sorted(RECIPES)}, got {cfg.recipe!r}")
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    policy, tok = load_policy(cfg.model, cfg.seed)
    sampler = sampler_for(policy, tok, cfg.model)
    task = load_task("arithmetic", n=cfg.audit_n)  # for its prompt format and grader only
    questions = training_questions(cfg)
    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
    log = []
    for step in range(cfg.steps):
        batch = rng.sample(questions, min(cfg.prompts_per_step, len(questions)))
        stats = RECIPES[cfg.recipe](policy, opt, sampler, task, batch, cfg, step)
        stats = {"step": step, "seconds": round(time.time() - t0, 1), **stats}
        log.append(stats)
        if progress:
            print(json.dumps(stats), flush=True)
        if not all(math.isfinite(v) for v in stats.values()):
            raise FloatingPointError(f"non-finite training statistics at step {step}: {stats}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "finetune.json").write_text(json.dumps({"config": asdict(cfg), "n_train_questions": len(questions),
                                                   "seconds": round(time.time() - t0, 1), "log": log}, indent=1))
    return out


def main(argv: Sequence[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field, default in asdict(Config()).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(default), default=default)
    args = parser.parse_args(argv)
    return train(Config(**vars(args)))


if __name__ == "__main__":
    main()
