"""The fused attention path computes what the bridge's eager attention computes (left
padding, KV cache, grouped-query heads), keeps the hooks the project uses, and gives way
to the eager path whenever the attention pattern is hooked."""

import pytest
import torch

from rnr_interp.models import fast_attention
from rnr_interp.engine.decoding import Decoding
from rnr_interp.engine.generate import forward, generate, left_pad, new_cache
from rnr_interp.interventions import capturing
from rnr_interp.models import load_model

QUESTIONS = ["What is 17 + 25?", "Hi", "Name a colour, please, and say why you like it."]


def fused_calls(monkeypatch) -> list[int]:
    """Counts calls of the fused path (one entry per attention call)."""
    calls: list[int] = []
    attend = fast_attention.SDPAAttentionBridge._attend

    def counting(self, *args, **kwargs):
        calls.append(1)
        return attend(self, *args, **kwargs)

    monkeypatch.setattr(fast_attention.SDPAAttentionBridge, "_attend", counting)
    return calls


@torch.inference_mode()
def prefill_and_decode(lm, prompts, steps: int = 4) -> torch.Tensor:
    """Every position's logits of a left-padded prefill, then `steps` cached greedy
    decoding steps: [steps + 1, batch, positions, vocab] padded with the prefill's."""
    ids, mask = left_pad(prompts, lm.pad_id)
    logits, cache = forward(lm, ids, mask, new_cache())
    out = [logits]
    for _ in range(steps):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        logits, cache = forward(lm, logits[:, -1].argmax(-1)[:, None], mask, cache)
        out.append(logits)
    return torch.cat(out, dim=1)


def real_positions(lm, prompts, logits: torch.Tensor) -> torch.Tensor:
    """The logits at non-padding positions only (a padding query has no real key to
    attend to; what it outputs is never read)."""
    _, mask = left_pad(prompts, lm.pad_id)
    keep = torch.cat([mask, torch.ones(mask.shape[0], logits.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
    return logits[keep.bool()]


# tiny-llama and tiny-qwen2: 4 query heads over 2 KV heads; tiny-gemma: 4 over 1.
# The HF attention setting only changes the mask the bridge is handed: a float mask
# (eager), a bool mask (sdpa, with padding or a cache) or none (sdpa, one unpadded prompt).
@pytest.mark.parametrize("questions", [QUESTIONS, QUESTIONS[:1]], ids=["padded", "unpadded"])
@pytest.mark.parametrize("hf_mask", ["eager", "sdpa"])
@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-qwen2", "tiny-gemma"])
def test_fused_equals_eager_with_padding_and_cache(spec, hf_mask, questions, monkeypatch):
    lm = load_model(spec)
    lm.hf_model.config._attn_implementation = hf_mask
    prompts = [lm.encode(lm.render(q)) for q in questions]
    calls = fused_calls(monkeypatch)
    fused = prefill_and_decode(lm, prompts)
    assert len(calls) == 5 * lm.n_layers  # every layer of the prefill and of each step was fused
    fast_attention.uninstall(lm.bridge)
    eager = prefill_and_decode(lm, prompts)
    assert len(calls) == 5 * lm.n_layers  # ... and uninstall really is the eager path
    torch.testing.assert_close(real_positions(lm, prompts, fused), real_positions(lm, prompts, eager),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-gemma"])
def test_fused_generations_equal_eager(spec):
    lm = load_model(spec)
    prompts = [lm.encode(lm.render(q)) for q in QUESTIONS]
    # column 0 greedy, columns 1-2 sampled at T=1 from their seeds; rows finish at different steps
    kwargs = dict(n=3, columns=[Decoding(max_new_tokens=20)] + [Decoding(temperature=1.0, max_new_tokens=20)] * 2,
                  seeds=[[b * 10 + j for j in range(3)] for b in range(len(prompts))])
    fused = generate(lm, prompts, **kwargs)
    fast_attention.uninstall(lm.bridge)
    eager = generate(lm, prompts, **kwargs)
    assert [[g.tokens for g in row] for row in fused] == [[g.tokens for g in row] for row in eager]
    assert len({g.n_tokens for row in fused for g in row}) > 1  # not all rows ran the same length


# Every hook point inside the attention that the fused path keeps: an edit there must
# change the output exactly as it does on the eager path.
KEPT_HOOKS = ["hook_in", "hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_cos", "hook_sin",
              "hook_z", "hook_out"]


@pytest.mark.parametrize("hook", KEPT_HOOKS)
def test_hooks_inside_attention_fire_and_edit_on_the_fused_path(hook, monkeypatch):
    lm = load_model("tiny-llama")
    prompts = [lm.encode(lm.render(q)) for q in QUESTIONS]
    name = f"blocks.1.attn.{hook}"
    seen = []

    def halve(act, hook=None):
        seen.append(act.shape)
        return act * 0.5

    plain = prefill_and_decode(lm, prompts, steps=2)
    calls = fused_calls(monkeypatch)
    with lm.bridge.hooks(fwd_hooks=[(name, halve)]):
        fused = prefill_and_decode(lm, prompts, steps=2)
    assert len(calls) == 3 * lm.n_layers and len(seen) == 3  # fused, and the hook fired each forward
    fast_attention.uninstall(lm.bridge)
    with lm.bridge.hooks(fwd_hooks=[(name, halve)]):
        eager = prefill_and_decode(lm, prompts, steps=2)
    assert seen[0] == seen[3]  # the hook saw the same shape on both paths
    torch.testing.assert_close(real_positions(lm, prompts, fused), real_positions(lm, prompts, eager),
                               rtol=1e-5, atol=1e-4)
    assert not torch.allclose(real_positions(lm, prompts, fused), real_positions(lm, prompts, plain), atol=1e-3)


@pytest.mark.parametrize("hook", fast_attention.PATTERN_HOOKS)
def test_a_hooked_pattern_takes_the_eager_path(hook, monkeypatch):
    lm = load_model("tiny-llama")
    prompts = [lm.encode(lm.render(q)) for q in QUESTIONS]
    name = f"blocks.0.attn.{hook}"

    def attend_to_first_key(act, hook=None):
        # scores: a large bonus to key 0; pattern: all weight on the last key
        if hook.name.endswith("hook_attn_scores"):
            return act + torch.nn.functional.one_hot(torch.tensor(0), act.shape[-1]).to(act) * 100.0
        return torch.nn.functional.one_hot(torch.tensor(act.shape[-1] - 1), act.shape[-1]).to(act).expand_as(act)

    calls = fused_calls(monkeypatch)
    plain = prefill_and_decode(lm, prompts, steps=2)
    n_fused = len(calls)
    with lm.bridge.hooks(fwd_hooks=[(name, attend_to_first_key)]):
        hooked = prefill_and_decode(lm, prompts, steps=2)
    # layer 0 fell back to eager; the other layers stayed fused
    assert len(calls) - n_fused == 3 * (lm.n_layers - 1)
    fast_attention.uninstall(lm.bridge)
    with lm.bridge.hooks(fwd_hooks=[(name, attend_to_first_key)]):
        eager = prefill_and_decode(lm, prompts, steps=2)
    torch.testing.assert_close(real_positions(lm, prompts, hooked), real_positions(lm, prompts, eager),
                               rtol=1e-5, atol=1e-4)
    assert not torch.allclose(real_positions(lm, prompts, hooked), real_positions(lm, prompts, plain), atol=1e-3)


def test_reading_the_pattern_takes_the_eager_path():
    """Reads too: the registry's `capturing` and TransformerLens's `run_with_cache`."""
    lm = load_model("tiny-llama")
    ids, _ = left_pad([lm.encode("Hi there")], lm.pad_id)
    name = "blocks.2.attn.hook_pattern"
    with torch.inference_mode():
        with capturing(lm, [name]) as got:
            lm.bridge(ids)
        _, cache = lm.bridge.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern"))
    for pattern in (got[name][0], cache[name]):
        assert pattern.shape[-2:] == (ids.shape[1], ids.shape[1])
        torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)))


def test_only_plain_rotary_attention_is_swapped():
    def fused_layers(spec):
        return sum(type(m) is fast_attention.SDPAAttentionBridge for m in load_model(spec).bridge.modules())

    assert fused_layers("tiny-llama:2") == 2
    assert fused_layers("tiny-gemma2") == 0  # score softcapping: eager only
    assert fused_layers("tiny-gpt2") == 0  # not a rotary attention bridge
    assert fused_layers("tiny-olmo2") == fused_layers("tiny-gemma3") == 0  # query/key norms: eager only


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_heads", [1, 3, 9])
def test_one_query_attention_equals_sdpa(kv_heads, dtype):
    """A decoding step's attention (one query, grouped-query heads stacked as matmul rows)
    equals SDPA over the same cache and mask, padding keys included."""
    g = torch.Generator().manual_seed(0)
    query = torch.randn(5, 9, 1, 16, generator=g).to(dtype)
    key, value = (torch.randn(5, kv_heads, 30, 16, generator=g).to(dtype) for _ in range(2))
    additive = torch.zeros(5, 1, 1, 30, dtype=dtype)
    additive[1, ..., :7] = torch.finfo(dtype).min  # a left-padded row
    got = fast_attention._attend_one_query(query, key, value, additive, 0.25)
    want = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=additive, scale=0.25,
                                                            enable_gqa=kv_heads != 9)
    assert got.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(got, want, **tol)
    moved = value.clone()
    moved[1, :, :7] += 100  # the padded row's masked keys: their values must not count
    torch.testing.assert_close(fast_attention._attend_one_query(query, key, moved, additive, 0.25)[1], got[1])


def test_decoding_steps_take_the_one_query_path(monkeypatch):
    lm = load_model("tiny-llama")
    prompts = [lm.encode(lm.render(q)) for q in QUESTIONS]
    calls = []
    one_query = fast_attention._attend_one_query
    monkeypatch.setattr(fast_attention, "_attend_one_query", lambda *a: calls.append(a[0].shape) or one_query(*a))
    prefill_and_decode(lm, prompts, steps=3)
    assert len(calls) == 3 * lm.n_layers and all(shape[2] == 1 for shape in calls)
