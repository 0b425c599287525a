"""A user's own intervention, written outside the package as a user would: one frozen
dataclass, registered by decorator, run in a batched generation next to rows without it."""

from dataclasses import dataclass

import pytest
import torch

from rnr_interp.engine.decoding import Decoding
from rnr_interp.engine.generate import generate
from rnr_interp.interventions import Intervention, KINDS, Steer, dumps, loads, register, set_id, site_hook
from rnr_interp.models import load_model


@register
@dataclass(frozen=True)
class Scale(Intervention):
    """Multiply the residual stream after block `layer` by `factor`."""

    layer: int
    factor: float

    def label(self):
        return f"scale:{self.layer}:{self.factor:g}"

    def layers(self):
        return (self.layer,)

    def edits(self, lm):
        return [(site_hook(lm, "hook_resid_post", self.layer), lambda act, hook: act * self.factor)]


PROMPTS = ["hello 12+3", "what is 7*8?", "a"]


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama:4")


def tokens(gens):
    return [row[0].tokens for row in gens]


def test_a_custom_spec_changes_its_own_row_only(lm):
    """Before the row mask was public, this spec on row 0 changed row 1's tokens (its
    hook edited the whole batch); now rows without it generate what they do alone."""
    prompts = [lm.encode(lm.render(p)) for p in PROMPTS]
    dec = Decoding(max_new_tokens=8)
    plain = tokens(generate(lm, prompts, decoding=dec))
    mixed = tokens(generate(lm, prompts, decoding=dec, interventions=[[Scale(1, -3.0)], [], [Scale(1, -3.0)]]))
    alone = tokens(generate(lm, [prompts[0]], decoding=dec, interventions=[Scale(1, -3.0)]))
    assert mixed[1] == plain[1]
    assert mixed[0] == alone[0] != plain[0]
    assert mixed[2] != plain[2]


def test_a_custom_spec_beside_builtin_specs_in_one_row(lm):
    prompts = [lm.encode(lm.render(p)) for p in PROMPTS[:2]]
    vector = tuple(torch.linspace(-1, 1, lm.bridge.cfg.d_model).tolist())
    both = [Scale(2, 0.5), Steer(0, vector, 3.0)]
    dec = Decoding(max_new_tokens=8)
    batched = tokens(generate(lm, prompts, decoding=dec, interventions=[both, []]))
    assert batched[0] == tokens(generate(lm, prompts[:1], decoding=dec, interventions=both))[0]
    assert batched[1] == tokens(generate(lm, prompts[1:], decoding=dec))[0]


def test_a_registered_spec_round_trips_through_records():
    assert KINDS["Scale"] is Scale
    assert loads(dumps([Scale(1, 2.0)])) == (Scale(1, 2.0),)
    assert set_id([Scale(1, 2.0)]) == "scale:1:2"


def test_registration_refuses_what_records_cannot_hold():
    with pytest.raises(TypeError, match="frozen dataclass"):
        @register
        class Loose(Intervention):
            def label(self):
                return "loose"

            def layers(self):
                return ()
    with pytest.raises(TypeError, match="not a subclass of Intervention"):
        register(dict)
    with pytest.raises(ValueError, match="already registered"):
        @register
        @dataclass(frozen=True)
        class Steer(Intervention):  # noqa: F811 - the clash is the point
            def label(self):
                return "mine"

            def layers(self):
                return ()


def test_your_own_hooks_and_cache_compose_with_a_custom_spec(lm):
    """Inside `applied`, the bridge's own run_with_cache reads what the spec wrote."""
    from rnr_interp.interventions import applied

    ids = torch.tensor([lm.encode(lm.render(PROMPTS[0]))])
    name = site_hook(lm, "hook_resid_post", 1)
    with torch.inference_mode():
        _, plain = lm.bridge.run_with_cache(ids, names_filter=[name])
        with applied(lm, [Scale(1, 2.0)]):
            _, scaled = lm.bridge.run_with_cache(ids, names_filter=[name])
    assert torch.allclose(scaled[name], 2.0 * plain[name])


def test_a_custom_spec_in_a_sweep_of_rows_with_replayed_prefills(lm):
    """The row runner every sweep uses, with stored prefills replayed up to the spec's
    block: each row generates what it generates alone, without replay."""
    from rnr_interp.engine.rows import PrefillCache, Row, generate_rows
    from rnr_interp.tasks import load_task

    task = load_task("arithmetic", n=3)
    dec = Decoding(max_new_tokens=6)
    sets = [(Scale(2, -2.0),), (), (Scale(1, 0.5),), (Scale(3, 3.0),)]
    rows = [Row(q, specs) for q in task.questions for specs in sets]
    swept = generate_rows(lm, task, rows, dec, prefills=PrefillCache(lm, task, enabled=True))
    for row, gen in zip(rows, swept):
        alone = generate_rows(lm, task, [row], dec, prefills=PrefillCache(lm, task, enabled=False))[0]
        assert gen.tokens == alone.tokens, row.interventions
    assert len({tuple(g.tokens) for g in swept[:len(sets)]}) > 1  # the specs change something


@dataclass(frozen=True)
class DoubleBlockWrite(Intervention):
    """Block `layer` writes twice what it writes (resid_post + (resid_post - resid_pre)):
    state between two hook points, so it builds its hooks from the row mask itself."""

    layer: int

    def label(self):
        return f"double:{self.layer}"

    def layers(self):
        return (self.layer,)

    def hooks(self, lm, rows):
        saved = []

        def save(act, hook=None):
            saved.append(act)
            return act

        save.saves_input = True
        double = rows.edit(lambda act, hook: 2 * act - saved.pop())
        return [(site_hook(lm, "hook_resid_pre", self.layer), save), (site_hook(lm, "hook_resid_post", self.layer), double)]


def test_a_spec_that_builds_its_own_hooks_from_the_row_mask(lm):
    """Unregistered (it lives in memory only) and changing its own row only."""
    from rnr_interp.engine.generate import forward, left_pad
    from rnr_interp.interventions import applied

    ids, mask = left_pad([[5, 6, 7], [8, 9, 10]], lm.pad_id, lm.device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    pre, post = "blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"
    kept = {}
    with torch.inference_mode():
        with applied(lm, [[DoubleBlockWrite(1)], []]):
            ours = forward(lm, ids, mask)[0]
        by_hand = lm.bridge.run_with_hooks(
            ids, attention_mask=mask, position_ids=pos,
            fwd_hooks=[(pre, lambda act, hook: kept.setdefault("x", act)), (post, lambda act, hook: 2 * act - kept["x"])])
        plain = forward(lm, ids, mask)[0]
    assert torch.allclose(ours[0], by_hand[0], atol=1e-5) and not torch.allclose(ours[0], plain[0], atol=1e-3)
    assert torch.equal(ours[1], plain[1])
    assert "DoubleBlockWrite" not in KINDS
