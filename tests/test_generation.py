"""The decoding engine: greedy equals transformers, seeded sampling, shared prefill."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rnr_interp.engine.decoding import Decoding

from rnr_interp.engine.generate import CACHE_HEADROOM, generate, left_pad, new_cache
from rnr_interp.models import smollm2_dir, load_model

QUESTIONS = ["What is 17 + 25?", "Name a colour.", "What is 9 times 8?", "Say hello."]


def hf_greedy(model, lm, prompts, max_new_tokens):
    ids, mask = left_pad(prompts, lm.tokenizer.pad_token_id)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=list(lm.stop_token_ids), pad_token_id=lm.tokenizer.pad_token_id)
    rows = []
    for row in out[:, ids.shape[1]:].tolist():
        cut = next((i for i, t in enumerate(row) if t in lm.stop_token_ids), len(row))
        rows.append(row[:cut])
    return rows


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-gpt2", "tiny-olmo2", "tiny-gemma3"])
def test_greedy_equals_transformers_generate_tiny(spec):
    lm = load_model(spec)
    from rnr_interp.models import build_tiny
    plain, _ = build_tiny(spec, 3)
    prompts = [lm.encode(lm.render(q)) for q in QUESTIONS]
    ours = generate(lm, prompts, decoding=Decoding(max_new_tokens=16))
    assert [r[0].tokens for r in ours] == hf_greedy(plain, lm, prompts, 16)


@pytest.mark.slow
def test_greedy_equals_transformers_generate_smollm2(smollm2):
    plain = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32).eval()
    prompts = [smollm2.encode(smollm2.render(q)) for q in QUESTIONS]
    ours = generate(smollm2, prompts, decoding=Decoding(max_new_tokens=24))
    assert [r[0].tokens for r in ours] == hf_greedy(plain, smollm2, prompts, 24)


def test_samples_reproducible_from_seed_and_independent_of_batch():
    lm = load_model("tiny-llama")
    prompts = [lm.encode(lm.render(q)) for q in QUESTIONS]
    dec = Decoding(temperature=1.0, max_new_tokens=12)
    seeds = [[100 * b + j for j in range(3)] for b in range(4)]
    a = generate(lm, prompts, n=3, decoding=dec, seeds=seeds)
    b = generate(lm, prompts, n=3, decoding=dec, seeds=seeds)
    assert [[g.tokens for g in r] for r in a] == [[g.tokens for g in r] for r in b]
    alone = generate(lm, prompts[2:3], n=3, decoding=dec, seeds=seeds[2:3])
    assert [g.tokens for g in alone[0]] == [g.tokens for g in a[2]]
    other = generate(lm, prompts, n=3, decoding=dec, seeds=[[s + 7 for s in r] for r in seeds])
    assert [[g.tokens for g in r] for r in other] != [[g.tokens for g in r] for r in a]


def test_rows_finishing_one_by_one_equal_each_row_alone():
    """Finished rows stay in the batch until they are `COMPACT_SHARE` of it, then leave
    together: every row still generates what it generates alone, up to the same stop."""
    import dataclasses

    lm = load_model("tiny-llama")
    prompts = [lm.encode(lm.render(q)) for q in QUESTIONS]
    dec = Decoding(temperature=1.0, max_new_tokens=16)
    seeds = [[100 * b + j for j in range(5)] for b in range(4)]
    free = generate(lm, prompts, n=5, decoding=dec, seeds=seeds)
    # Stop tokens the rows draw at different steps, so 20 rows finish one by one.
    stops = {g.tokens[(3 * i) % len(g.tokens)] for i, g in enumerate(g for row in free for g in row) if g.tokens}
    lm = dataclasses.replace(lm, stop_token_ids=tuple(sorted(stops)))
    batched = generate(lm, prompts, n=5, decoding=dec, seeds=seeds)
    lengths = {g.n_tokens for row in batched for g in row}
    assert len(lengths) > 4 and max(lengths) > min(lengths) + 4  # rows end at many different steps
    for b, prompt in enumerate(prompts):
        for j in range(5):
            [[alone]] = generate(lm, [prompt], n=1, decoding=dec, seeds=[[seeds[b][j]]])
            got = batched[b][j]
            assert (got.tokens, got.finish) == (alone.tokens, alone.finish), (b, j)
            assert abs(got.logprob - alone.logprob) < 1e-4


def test_shared_prefill_matches_separate_prefill():
    """Same seed path: K samples fanned out from one prefill equal K single-sample
    runs that each prefill the prompt themselves."""
    lm = load_model("tiny-qwen2")
    prompt = lm.encode(lm.render(QUESTIONS[0]))
    dec = Decoding(temperature=0.8, top_p=0.9, max_new_tokens=12)
    shared = generate(lm, [prompt], n=5, decoding=dec, seeds=[[11, 12, 13, 14, 15]])[0]
    separate = [generate(lm, [prompt], n=1, decoding=dec, seeds=[[s]])[0][0] for s in (11, 12, 13, 14, 15)]
    assert [g.tokens for g in shared] == [g.tokens for g in separate]
    assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(shared, separate))


def test_sampling_follows_the_model_distribution():
    """Statistical check of the inverse-CDF sampler: first-token counts over 4000 seeds
    against the softmax probabilities, by a chi-square goodness-of-fit test (stop tokens
    merged into one cell, since a stopped row records no token). p > 1e-3 fails with
    probability 1e-3 when the sampler is right; a sampler off by a few percent fails."""
    from scipy.stats import chisquare

    lm = load_model("tiny-llama")
    prompt = lm.encode(lm.render("x"))
    n = 4000
    gens = generate(lm, [prompt], n=n, decoding=Decoding(temperature=1.0, max_new_tokens=1), seeds=[list(range(n))])[0]
    with torch.inference_mode():
        probs = torch.softmax(lm.bridge(torch.tensor([prompt]))[0, -1].double(), -1)
    stops = list(lm.stop_token_ids)
    counts = torch.zeros_like(probs)
    for g in gens:
        counts[g.tokens[0] if g.tokens else stops[0]] += 1
    expected = probs.clone()
    expected[stops[0]] = probs[stops].sum()
    keep = torch.ones_like(probs, dtype=torch.bool)
    keep[stops[1:]] = False
    assert counts[keep].sum() == n
    assert chisquare(counts[keep].numpy(), expected[keep].numpy() * n).pvalue > 1e-3


@pytest.mark.parametrize("top_p", [1.0, 0.9, "mixed"])
def test_sampler_slices_give_the_whole_batch_bits(top_p, monkeypatch):
    """`_sample` runs its vocabulary-wide passes SAMPLER_ROWS rows at a time; every pass
    is row-wise, so tokens and log-probs equal one pass over the whole batch, bit for
    bit, including a last partial slice and greedy rows among sampled ones."""
    from rnr_interp.engine import generate as engine

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 5000, generator=g) * 4
    temps = torch.rand(37, generator=g) + 0.3
    temps[::6] = 0.0
    u = torch.rand(37, generator=g)
    assert 37 > engine.SAMPLER_ROWS and 37 % engine.SAMPLER_ROWS  # several slices, the last partial
    top_ps = torch.where(torch.arange(37) % 3 == 0, 0.8, 1.0) if top_p == "mixed" else torch.full((37,), top_p)
    sliced = engine._sample(logits, temps, top_ps, u)
    monkeypatch.setattr(engine, "SAMPLER_ROWS", 1000)
    whole = engine._sample(logits, temps, top_ps, u)
    assert torch.equal(sliced[0], whole[0]) and torch.equal(sliced[1], whole[1])
    assert torch.equal(whole[0][temps == 0], logits[temps == 0].argmax(-1))
    assert torch.equal(whole[1], torch.log_softmax(logits, -1).gather(-1, whole[0][:, None]).squeeze(-1))


def test_mixed_temperatures_first_column_is_greedy():
    lm = load_model("tiny-llama")
    prompts = [lm.encode(lm.render(q)) for q in QUESTIONS[:2]]
    dec = Decoding(temperature=1.0, max_new_tokens=10)
    mixed = generate(lm, prompts, n=4, columns=[Decoding(max_new_tokens=10)] + [dec] * 3, seeds=[[1, 2, 3, 4], [5, 6, 7, 8]])
    greedy = generate(lm, prompts, decoding=Decoding(max_new_tokens=10))
    assert [r[0].tokens for r in mixed] == [r[0].tokens for r in greedy]


def test_each_column_samples_with_its_own_top_p():
    """A column's top-p is its own: a sampled column at top-p 1 beside truncated ones
    draws what it draws alone, and the truncated ones what they draw without it."""
    lm = load_model("tiny-llama")
    prompts = [lm.encode(lm.render(q)) for q in QUESTIONS[:2]]
    wide, narrow = Decoding(temperature=1.0, max_new_tokens=12), Decoding(temperature=1.0, top_p=0.3, max_new_tokens=12)
    seeds = [[1, 2, 3], [4, 5, 6]]
    mixed = generate(lm, prompts, n=3, columns=[wide, narrow, narrow], seeds=seeds)
    alone_wide = generate(lm, prompts, n=3, decoding=wide, seeds=seeds)
    alone_narrow = generate(lm, prompts, n=3, decoding=narrow, seeds=seeds)
    assert [r[0].tokens for r in mixed] == [r[0].tokens for r in alone_wide]
    assert [[g.tokens for g in r[1:]] for r in mixed] == [[g.tokens for g in r[1:]] for r in alone_narrow]
    assert [r[1].tokens for r in alone_wide] != [r[1].tokens for r in alone_narrow]  # top-p changed the draw


def test_one_decoding_reaches_the_engine_once():
    lm = load_model("tiny-llama")
    prompt = [lm.encode(lm.render(QUESTIONS[0]))]
    with pytest.raises(ValueError, match="not both"):
        generate(lm, prompt, n=1, decoding=Decoding(), columns=[Decoding()])
    with pytest.raises(ValueError, match="share max_new_tokens"):
        generate(lm, prompt, n=2, columns=[Decoding(max_new_tokens=3), Decoding(max_new_tokens=4)])


def test_stop_strings_end_rows():
    lm = load_model("tiny-llama")
    prompts = [lm.encode(lm.render(q)) for q in QUESTIONS]
    full = generate(lm, prompts, decoding=Decoding(max_new_tokens=20))
    # Stop at the third character of each row's own greedy text: a string it will produce.
    for row, gens in zip(prompts, full):
        text = gens[0].text
        if len(text) < 6:
            continue
        [[g]] = generate(lm, [row], decoding=Decoding(max_new_tokens=20), stop_strings=[text[3:5]])
        assert g.finish == "stop" and g.text == text[:3]


def test_cache_layer_equals_concatenation():
    """The engine's cache layer (in-place writes into a buffer with headroom) holds what
    transformers' DynamicLayer (torch.cat) holds, through every operation the engine
    uses, and never rewrites a view it handed out earlier."""
    from transformers.cache_utils import DynamicLayer

    ours, reference = new_cache().layer_class_to_replicate(), DynamicLayer()
    noise = torch.Generator().manual_seed(0)

    def update(positions: int):
        k, v = (torch.randn(reference.keys.shape[0] if reference.is_initialized else 2, 2, positions, 4, generator=noise)
                for _ in range(2))
        got, want = ours.update(k, v), reference.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(got, want))

    update(7)  # the prefill
    handed_out = ours.keys[1, :, -5:]
    kept = handed_out.clone()
    for layer in (ours, reference):
        layer.batch_repeat_interleave(3)
    for _ in range(CACHE_HEADROOM * 2 + 3):  # past the headroom twice: new buffers
        update(1)
    for layer in (ours, reference):
        layer.batch_select_indices(torch.tensor([0, 2, 5]))
    update(1)
    handed_out_before_crop = ours.values[..., -3:, :]  # positions the crop frees and the next update refills
    kept_before_crop = handed_out_before_crop.clone()
    for layer in (ours, reference):
        layer.crop(-4)
    update(2)
    assert ours.get_seq_length() == reference.get_seq_length() == 7 + CACHE_HEADROOM * 2 + 3 + 1 - 4 + 2
    assert torch.equal(handed_out, kept) and torch.equal(handed_out_before_crop, kept_before_crop)


def test_cached_equals_uncached_past_the_cache_headroom():
    lm = load_model("tiny-llama")
    prompts = [lm.encode(lm.render(q)) for q in QUESTIONS]
    steps = CACHE_HEADROOM * 2 + 5
    kwargs = dict(n=3, columns=[Decoding(max_new_tokens=steps)] + [Decoding(temperature=1.0, max_new_tokens=steps)] * 2,
                  seeds=[[b * 10 + j for j in range(3)] for b in range(len(prompts))])
    cached = [[g.tokens for g in row] for row in generate(lm, prompts, use_cache=True, **kwargs)]
    uncached = [[g.tokens for g in row] for row in generate(lm, prompts, use_cache=False, **kwargs)]
    assert cached == uncached
    lengths = {len(tokens) for row in cached for tokens in row}
    assert max(lengths) > CACHE_HEADROOM * 2 and len(lengths) > 1  # crossed the headroom; rows left the batch
