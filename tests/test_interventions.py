"""The hook registry against independent manual computations on tiny models."""

import copy
import json

import pytest
import torch

from rnr_interp.engine.batch import batch_applied
from rnr_interp.engine.decoding import Decoding

from rnr_interp.engine.generate import forward, generate, last_logits, left_pad
from rnr_interp.interventions import (
    Ablate, AblateUnits, Clamp, Route, Steer, applied, dumps, from_json, loads, set_id, to_json,
)
from rnr_interp.models import build_tiny, load_model

FAMILIES = ["tiny-llama", "tiny-qwen2", "tiny-gpt2", "tiny-gemma", "tiny-olmo2", "tiny-gemma3"]
PROMPTS = ["hello 12+3", "what is 7*8?", "a"]


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return load_model(f"{request.param}:4")


def batch(lm):
    return left_pad([lm.encode(lm.render(p)) for p in PROMPTS], lm.tokenizer.pad_token_id)


def logits_of(lm, rows=None):
    ids, mask = batch(lm)
    with torch.inference_mode(), applied(lm, rows, batch_size=ids.shape[0]):
        return forward(lm, ids, mask)[0]


def reference(name, n_layers, edit):
    """The same random model rebuilt by plain transformers, with its layer list edited
    by `edit(layers) -> layers` (copied HF layers, no bridge, no hooks)."""
    model, tok = build_tiny(name, n_layers=n_layers, seed=0)
    owner = model.transformer if hasattr(model, "transformer") else model.model
    attr = "h" if hasattr(owner, "h") else "layers"
    layers = edit(list(getattr(owner, attr)))
    types = getattr(model.config, "layer_types", None)
    if types is not None:
        # A layer keeps its own attention kind (Gemma 3: sliding window or global) wherever
        # a route puts it; the HF model picks each position's mask by config.layer_types.
        types = [getattr(_attention(layer), "layer_type", None) or types[0] for layer in layers]
    for i, layer in enumerate(layers):
        _attention(layer).layer_idx = i
    setattr(owner, attr, torch.nn.ModuleList(layers))
    model.config.num_hidden_layers = len(layers)
    if types is not None:
        model.config.layer_types = types
    return model


def _attention(layer):
    return layer.attn if hasattr(layer, "attn") else layer.self_attn


def ref_logits(lm, model):
    ids, mask = batch(lm)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits


def real_positions(lm):
    return batch(lm)[1].bool()


def close(a, b, lm, atol=1e-4):
    m = real_positions(lm)
    return torch.allclose(a[m], b[m], atol=atol)


def test_bridge_matches_plain_transformers(lm):
    family = lm.spec.split(":")[0]
    assert close(logits_of(lm), ref_logits(lm, build_tiny(family, 4)[0]), lm)


def test_identity_route_reproduces_baseline_exactly(lm):
    base = logits_of(lm)
    assert torch.equal(logits_of(lm, [Route(tuple(range(lm.n_layers)))]), base)


@pytest.mark.parametrize("path", [(0, 1, 3), (0, 2, 3), (1, 2, 3)])
def test_skip_route_equals_model_without_block(lm, path):
    family = lm.spec.split(":")[0]
    ref = reference(family, 4, lambda layers: [layers[i] for i in path])
    assert close(logits_of(lm, [Route(path)]), ref_logits(lm, ref), lm)


@pytest.mark.parametrize("path", [(0, 1, 1, 2, 3), (0, 1, 2, 1, 2, 3)])
def test_repeat_route_equals_model_with_duplicated_block(lm, path):
    family = lm.spec.split(":")[0]
    ref = reference(family, 4, lambda layers: [copy.deepcopy(layers[i]) for i in path])
    assert close(logits_of(lm, [Route(path)]), ref_logits(lm, ref), lm)


def test_layer_ablation_equals_skip_route(lm):
    assert close(logits_of(lm, [Ablate("layer", 2)]), logits_of(lm, [Route((0, 1, 3))]), lm)


#: routes of one batch: the full path, skips (also of block 0), in-place and range repeats
MIXED_ROUTES = [(0, 1, 2, 3), (0, 1, 3), (1, 2, 3), (0, 1, 1, 2, 3), (0, 1, 2, 1, 2, 3), (0, 2, 2, 3)]


@pytest.mark.parametrize("sparse", [True, False])
def test_rows_on_mixed_routes_equal_each_route_rebuilt(lm, sparse):
    """Every row of a batch of mixed routes (left-padded prompts) gets the logits of the
    plain model rebuilt with that route's layer list, with and without sparse slots."""
    family = lm.spec.split(":")[0]
    routes = MIXED_ROUTES[:len(PROMPTS)] if sparse else MIXED_ROUTES[-len(PROMPTS):]
    ids, mask = batch(lm)
    with torch.inference_mode(), batch_applied(lm, [[Route(r)] for r in routes], sparse_slots=sparse) as active:
        assert active.owns_slot_rows() is sparse
        mixed = forward(lm, ids, mask)[0]
    for r, path in enumerate(routes):
        ref = ref_logits(lm, reference(family, 4, lambda layers: [copy.deepcopy(layers[i]) for i in path]))
        m = mask[r].bool()
        assert torch.allclose(mixed[r][m], ref[r][m], atol=1e-4), (path, sparse)


def block_rows(lm):
    """Counts the rows every block call runs on (the bridge's hook_resid_pre of each block)."""
    seen: list[int] = []
    hooks = [(f"blocks.{layer}.hook_resid_pre", lambda act, hook=None: seen.append(act.shape[0]) or act) for layer in range(lm.n_layers)]
    return seen, lm.bridge.hooks(fwd_hooks=hooks)


def test_sparse_slots_run_each_block_on_its_own_rows_only(lm):
    """A prefill of rows on mixed routes runs blocks on sum(len(route)) rows in all
    with sparse slots, and on len(schedule) x rows without."""
    from rnr_interp.interventions import route_schedule

    routes = [(0, 1, 3), (1, 2, 3), (0, 1, 1, 2, 3)]
    ids, mask = batch(lm)
    work = {}
    for sparse in (True, False):
        seen, hooks = block_rows(lm)
        with torch.inference_mode(), hooks, batch_applied(lm, [[Route(r)] for r in routes], sparse_slots=sparse):
            forward(lm, ids, mask)
        work[sparse] = sum(seen)
    assert work[True] == sum(map(len, routes))
    assert work[False] == len(route_schedule(routes)[0]) * len(routes)


@pytest.mark.parametrize("spec", ["tiny-llama:6", "tiny-qwen2:6", "tiny-gpt2:6", "tiny-gemma:6", "tiny-gemma2:6"])
def test_sparse_slots_generate_what_dense_slots_generate(spec, monkeypatch):
    """Rows on mixed routes (skips, a skipped first block, repeats, one row with an
    ablation as well) sample and decode greedily the same tokens with sparse slots as
    with the dense union schedule, with and without replayed prefills, while rows stop
    at different steps and leave the batch one by one (each position's cache entry
    keeps its own rows), down to positions that no row left runs."""
    import dataclasses

    import rnr_interp.engine.generate as engine
    from rnr_interp.engine.generate import prompt_states

    import rnr_interp.engine.batch as registry

    monkeypatch.setattr(engine, "COMPACT_SHARE", 0.0)  # finished rows leave at once
    held = []  # positions run by no row left (or none of a prefill group)
    monkeypatch.setattr(registry, "_hold_length", lambda *a, _f=registry._hold_length: held.append(1) or _f(*a))
    lm = load_model(spec)
    prompts = [lm.encode(lm.render(p)) for p in [*PROMPTS, "b c", "12 + 30 = ?"]]
    rows = [[Route((0, 1, 2, 3, 4, 5))], [Route((0, 1, 3, 4, 5))], [Route((1, 2, 3, 4, 5))],
            [Route((0, 1, 2, 2, 3, 4, 5)), Ablate("mlp", 4)], [Route((0, 1, 2, 3, 1, 2, 3, 4, 5))]]
    dec = Decoding(temperature=1.0, max_new_tokens=12)
    seeds = [[10 * b + j for j in range(2)] for b in range(len(prompts))]
    free = generate(lm, prompts, n=2, decoding=dec, seeds=seeds, interventions=rows, sparse_slots=False)
    # Stop tokens drawn at different steps, so rows finish one by one.
    stops = {g.tokens[(3 * i) % len(g.tokens)] for i, g in enumerate(g for row in free for g in row) if g.tokens}
    lm = dataclasses.replace(lm, stop_token_ids=tuple(sorted(stops)))
    for reuse in (None, prompt_states(lm, prompts)):
        for decoding in (dec, Decoding(max_new_tokens=12)):
            out = {sparse: generate(lm, prompts, n=2, decoding=decoding, seeds=seeds, interventions=rows, reuse=reuse,
                                    sparse_slots=sparse) for sparse in (True, False)}
            assert [[g.tokens for g in r] for r in out[True]] == [[g.tokens for g in r] for r in out[False]]
            assert [g.logprob for r in out[True] for g in r] == pytest.approx([g.logprob for r in out[False] for g in r], abs=1e-4)
            if decoding is dec:
                assert len({g.n_tokens for row in out[True] for g in row}) >= 3  # rows did stop at different steps
    assert held


@pytest.mark.parametrize("component", ["mlp", "attn"])
def test_zero_ablation_equals_manual_forward(lm, component):
    """Drop the component's output by patching the plain HF submodule to return zeros."""
    family = lm.spec.split(":")[0]
    model, _ = build_tiny(family, 4)
    layer = (model.transformer.h if hasattr(model, "transformer") else model.model.layers)[1]
    sub = getattr(layer, component) if hasattr(layer, component) else layer.self_attn
    orig_forward = sub.forward

    def zeroed(*a, **k):
        out = orig_forward(*a, **k)
        return (torch.zeros_like(out[0]), *out[1:]) if isinstance(out, tuple) else torch.zeros_like(out)

    sub.forward = zeroed
    assert close(logits_of(lm, [Ablate(component, 1)]), ref_logits(lm, model), lm)
    assert not close(logits_of(lm, [Ablate(component, 1)]), logits_of(lm), lm)


@pytest.mark.parametrize("component", ["mlp", "attn", "layer"])
def test_mean_ablation_writes_the_blocks_mean_write(lm, component):
    """A block's mean write measured over one position is its write there, so mean
    ablation leaves that prompt as it was (zero ablation does not); over several
    prompts the mean pools their positions and leaves the padding out."""
    from rnr_interp.analyses.localise.silencing import block_means

    one = [lm.encode(lm.render("a"))[-1:]]
    mean = block_means(lm, one, [(1, component)])[1, component]
    assert torch.allclose(last_logits(lm, one, [Ablate(component, 1, "mean", tuple(mean.tolist()))]), last_logits(lm, one), atol=1e-4)
    assert not torch.allclose(last_logits(lm, one, [Ablate(component, 1)]), last_logits(lm, one), atol=1e-4)
    prompts = [lm.encode(lm.render(p)) for p in PROMPTS]
    each = [block_means(lm, [p], [(1, component)])[1, component] for p in prompts]
    pooled = sum(len(p) * m for p, m in zip(prompts, each)) / sum(len(p) for p in prompts)
    assert torch.allclose(block_means(lm, prompts, [(1, component)], batch_size=3)[1, component], pooled, atol=1e-4)


def test_a_mean_ablation_carries_its_mean_and_only_it_does():
    with pytest.raises(ValueError, match="needs the block's mean write"):
        Ablate("mlp", 1, "mean")
    with pytest.raises(ValueError, match="needs the block's mean write"):
        Ablate("mlp", 1, "zero", (0.5,))
    with pytest.raises(ValueError, match="mode must be one of zero, mean"):
        Ablate("mlp", 1, "resample")
    spec = Ablate("attn", 2, "mean", (0.5, -1.0))
    assert loads(dumps([spec])) == (spec,) and spec.label().startswith("ablate:attn:2:mean:")
    assert Ablate("attn", 2).label() == "ablate:attn:2"  # a zero ablation's records read as they always did


def test_steer_alpha_zero_is_noop_and_nonzero_moves(lm):
    v = tuple(torch.randn(lm.bridge.cfg.d_model, generator=torch.Generator().manual_seed(1)).tolist())
    assert torch.equal(logits_of(lm, [Steer(1, v, 0.0)]), logits_of(lm))
    assert not close(logits_of(lm, [Steer(1, v, 4.0)]), logits_of(lm), lm)


def test_all_units_equals_mlp_ablation():
    # Llama-style MLPs have no output bias, so zeroing every unit is zeroing the output.
    lm = load_model("tiny-llama:4")
    all_units = AblateUnits(2, tuple(range(lm.bridge.cfg.d_mlp)))
    assert close(logits_of(lm, [all_units]), logits_of(lm, [Ablate("mlp", 2)]), lm, atol=1e-5)


def test_per_row_batched_equals_one_at_a_time(lm):
    rows = [[Ablate("mlp", 0)], [Ablate("attn", 3), AblateUnits(1, (0, 5, 7))], [Ablate("layer", 1)]]
    batched = logits_of(lm, rows)
    ids, mask = batch(lm)
    for r, specs in enumerate(rows):
        with torch.inference_mode(), applied(lm, specs):
            single = forward(lm, ids[r:r + 1], mask[r:r + 1])[0]
        m = mask[r].bool()
        assert torch.allclose(batched[r][m], single[0][m], atol=1e-5)


def test_interventions_past_block_p_replay_blocks_before_it(lm, monkeypatch):
    """A row whose interventions sit in block p or later replays blocks 0..p-1 of its
    prefill from the stored full-path states (rows grouped by p); the generations are
    those of running every block, and corrupting the stored residual shows the replay
    is taken."""
    import rnr_interp.engine.generate as engine
    from rnr_interp.engine.generate import prompt_states

    prompts = [lm.encode(lm.render(p)) for p in PROMPTS]
    rows = [[Ablate("mlp", 2)], [Ablate("attn", 3), AblateUnits(2, (0, 5, 7))], [Ablate("layer", 2)], []]
    vector = tuple(torch.linspace(-1, 1, lm.bridge.cfg.d_model).tolist())
    rows[3] = [Steer(3, vector, 4.0, site="hook_resid_pre")]
    prompts.append(prompts[0])
    with torch.inference_mode(), batch_applied(lm, rows) as active:
        assert active.row_prefixes() == [2, 2, 2, 3]
    dec = Decoding(max_new_tokens=8)
    replayed = []
    original = engine.replaying
    monkeypatch.setattr(engine, "replaying", lambda lm_, resid, keys, *a: replayed.append(len(keys)) or original(lm_, resid, keys, *a))
    states = prompt_states(lm, prompts[:2])  # made in another batch than the one that reuses them
    states += prompt_states(lm, prompts[2:])
    a = generate(lm, prompts, decoding=dec, interventions=rows, reuse=states)
    b = generate(lm, prompts, decoding=dec, interventions=rows)
    assert replayed == [2, 3]  # one prefill group per prefix
    assert [r[0].tokens for r in a] == [r[0].tokens for r in b]
    assert [r[0].logprob for r in a] == pytest.approx([r[0].logprob for r in b], abs=1e-4)
    for state in states:
        state.resid_pre = state.resid_pre * -3.0
    c = generate(lm, prompts, decoding=dec, interventions=rows, reuse=states)
    assert [r[0].logprob for r in c] != pytest.approx([r[0].logprob for r in b], abs=1e-4)


def test_row_prefixes_are_the_blocks_before_a_row_changes_anything(lm):
    cases = [([[Ablate("mlp", 2)], [], [AblateUnits(3, (1,))]], [2, 0, 3]), ([[Ablate("mlp", 2)], [Ablate("attn", 0)]], [2, 0]),
             ([[Route((0, 1, 1, 2, 3))]] * 3, [2, 2, 2]), ([[Route((0, 1, 2, 3)), Ablate("mlp", 3)]] * 2, [0, 0]),
             ([[Route((0, 1, 2, 3))]] * 2, [0, 0]), ([[Route((0, 1, 3))], [Route((0, 1, 2, 2, 3))], []], [2, 3, 3])]
    for rows, prefixes in cases:
        with torch.inference_mode(), batch_applied(lm, rows) as active:
            assert active.row_prefixes() == prefixes, rows


def test_context_manager_restores_model_even_on_error(lm):
    base = logits_of(lm)
    with pytest.raises(RuntimeError, match="boom"):
        with applied(lm, [Route((0, 0, 1)), Ablate("mlp", 1)]):
            raise RuntimeError("boom")
    assert torch.equal(logits_of(lm), base)
    assert len(lm.bridge.blocks) == lm.n_layers


def test_cached_equals_uncached_generation(lm):
    prompts = [lm.encode(lm.render(p)) for p in PROMPTS]
    dec = Decoding(max_new_tokens=10)
    for iv in (None, [Route((0, 1, 1, 2, 3))], [Route((0, 2, 3))], [[Ablate("attn", 0)], [], [AblateUnits(1, (1, 2))]]):
        a = generate(lm, prompts, n=2, decoding=dec, interventions=iv, use_cache=True)
        b = generate(lm, prompts, n=2, decoding=dec, interventions=iv, use_cache=False)
        assert [[g.tokens for g in r] for r in a] == [[g.tokens for g in r] for r in b], iv


def test_a_steer_at_the_prompt_end_moves_that_position_alone_in_every_decoding_path(lm):
    v = tuple(torch.randn(lm.bridge.cfg.d_model, generator=torch.Generator().manual_seed(1)).tolist())
    at_end, everywhere = Steer(1, v, 8.0, at="prompt"), Steer(1, v, 8.0)
    base, steered, every_position = logits_of(lm), logits_of(lm, [at_end]), logits_of(lm, [everywhere])
    # one forward over the prompts: the last position is the prompt's end, and only it moves (padding is not read)
    before_end = real_positions(lm).clone()
    before_end[:, -1] = False
    assert torch.equal(steered[before_end], base[before_end]) and not torch.allclose(steered[:, -1], base[:, -1], atol=1e-4)
    assert not torch.allclose(every_position[before_end], base[before_end], atol=1e-4)
    prompts = [lm.encode(lm.render(p)) for p in PROMPTS]
    dec = Decoding(max_new_tokens=8)
    cached, uncached, every = (generate(lm, prompts, decoding=dec, interventions=[s], use_cache=c)
                               for s, c in ((at_end, True), (at_end, False), (everywhere, True)))
    tokens = [[g.tokens for g in row] for row in cached]
    # a decoding step after the prompt is not steered, cached (one position a call) or not (the whole sequence)
    assert tokens == [[g.tokens for g in row] for row in uncached]
    ids, mask = batch(lm)
    with torch.inference_mode(), applied(lm, [at_end]):
        first = forward(lm, ids, mask, last_only=True)[0][:, -1].argmax(-1).tolist()
    assert [row[0][0] for row in tokens if row[0]] == [t for t, row in zip(first, tokens) if row[0]]
    # steering the prompt's end alone is another intervention than steering every position
    assert [[(g.tokens, g.token_logprobs) for g in row] for row in cached] != [[(g.tokens, g.token_logprobs) for g in row] for row in every]
    assert at_end.label().endswith(":at-prompt") and everywhere.label() == Steer(1, v, 8.0, "hook_resid_post", "every").label()
    assert loads(dumps([at_end])) == (at_end,) and from_json({k: w for k, w in to_json(everywhere).items() if k != "at"}) == everywhere
    with pytest.raises(ValueError, match="at must be one of every, prompt, reply"):
        Steer(1, v, 1.0, at="answer")


def test_a_steer_over_the_reply_leaves_the_prompt_and_steers_every_generated_position(lm):
    v = tuple(torch.randn(lm.bridge.cfg.d_model, generator=torch.Generator().manual_seed(1)).tolist())
    over_reply, at_end, everywhere = Steer(1, v, 8.0, at="reply"), Steer(1, v, 8.0, at="prompt"), Steer(1, v, 8.0)
    # one forward over the prompts: the reply starts at the last position, so only it moves, as with "prompt"
    assert torch.equal(logits_of(lm, [over_reply]), logits_of(lm, [at_end]))
    prompts = [lm.encode(lm.render(p)) for p in PROMPTS]
    dec = Decoding(max_new_tokens=8)
    cached, uncached, end_only, every = (
        [[(g.tokens, g.token_logprobs) for g in row] for row in generate(lm, prompts, decoding=dec, interventions=[s], use_cache=c)]
        for s, c in ((over_reply, True), (over_reply, False), (at_end, True), (everywhere, True)))
    # a cached step (one position) and an uncached one (the whole sequence again) steer the same positions
    assert [[t for t, _ in row] for row in cached] == [[t for t, _ in row] for row in uncached]
    for row, ref in zip(cached, uncached):
        for (_, lp), (_, ref_lp) in zip(row, ref):
            assert lp == pytest.approx(ref_lp, abs=1e-4)
    # the first token is the prompt end's in both; the generated positions are steered too, the prompt is not
    assert [row[0][0][:1] for row in cached] == [row[0][0][:1] for row in end_only]
    assert cached != end_only and cached != every
    assert over_reply.label().endswith(":at-reply") and loads(dumps([over_reply])) == (over_reply,)


def test_a_clamp_moves_each_position_within_its_span_by_what_it_takes_to_reach_its_values(lm):
    """A clamp of one unit direction at the prompt's end is the steer along it by (value -
    the component there), known from the block's write read at that position; a clamp of
    two rows given at any length and not orthogonal reaches act . row = value for each and
    moves nothing outside their span; clamped to where it already is, or by a fraction 0,
    nothing moves."""
    from rnr_interp.analyses.localise.directions import block_output

    prompt = [lm.encode(lm.render(PROMPTS[1]))]
    draw = torch.Generator().manual_seed(2)
    d, e = (torch.randn(lm.bridge.cfg.d_model, generator=draw, dtype=torch.float64) for _ in range(2))
    unit = d / d.norm()
    write = block_output(lm, prompt, 1, "mlp")[0].double()
    there = float(write @ unit)
    clamp = Clamp(1, (tuple(unit.tolist()),), (there + 5.0,), site="hook_mlp_out", at="prompt")
    steer = Steer(1, tuple(unit.tolist()), 5.0, site="hook_mlp_out", at="prompt")
    base = last_logits(lm, prompt)
    assert torch.allclose(last_logits(lm, prompt, [clamp]), last_logits(lm, prompt, [steer]), atol=1e-4)
    assert not torch.allclose(last_logits(lm, prompt, [clamp]), base, atol=1e-3)
    for still in (Clamp(1, (tuple(unit.tolist()),), (there,), "hook_mlp_out", "prompt"),
                  Clamp(1, (tuple(unit.tolist()),), (there + 5.0,), "hook_mlp_out", "prompt", fraction=0.0)):
        assert torch.allclose(last_logits(lm, prompt, [still]), base, atol=1e-4)
    rows = torch.stack([3 * d, d + e])
    values = (float(rows[0] @ write) + 4.0, float(rows[1] @ write) - 2.0)
    two = Clamp(1, tuple(map(tuple, rows.tolist())), values, site="hook_mlp_out")
    moved = two.edits(lm)[0][1](write[None, None].clone(), None)[0, 0]
    assert (rows @ moved).tolist() == pytest.approx(list(values), abs=1e-6)
    q, _ = torch.linalg.qr(rows.T)
    assert torch.allclose(moved - q @ (q.T @ moved), write - q @ (q.T @ write), atol=1e-8)  # nothing off the span moves
    assert loads(dumps([clamp])) == (clamp,) and clamp.label().startswith("clamp:1:hook_mlp_out:1:1:")
    assert clamp.label().endswith(":at-prompt") and two.label() != Clamp(1, two.basis, (0.0, 0.0), "hook_mlp_out").label()
    with pytest.raises(ValueError, match="linearly independent"):
        Clamp(1, ((0.0, 0.0),), (1.0,))
    with pytest.raises(ValueError, match="one value per basis row"):
        Clamp(1, ((1.0, 0.0),), (1.0, 2.0))


def test_specs_serialise_round_trip():
    specs = [Ablate("attn", 3), Steer(2, (0.5, -1.0), 2.0, "hook_mlp_out"), AblateUnits(1, (9, 2)), Route((0, 1, 1, 2))]
    assert loads(dumps(specs)) == tuple(specs)
    assert json.loads(json.dumps(to_json(specs[1])))["kind"] == "Steer"
    assert set_id(specs[:1]) == "ablate:attn:3"
    with pytest.raises(ValueError, match="unknown intervention kind"):
        from_json({"kind": "Nope"})


def test_bad_specs_give_clear_errors():
    lm = load_model("tiny-llama:3")
    with pytest.raises(ValueError, match="component"):
        Ablate("head", 1)
    with pytest.raises(ValueError, match="layers 0..2"):
        with applied(lm, [Ablate("mlp", 7)]):
            pass
