"""Recognition, failure sets and silencing sweeps against independent computations."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch
import typer
from typer.testing import CliRunner

from rnr_interp.engine.generate import generate
from rnr_interp.interventions import Ablate, AblateUnits
from rnr_interp.models import build_tiny, load_model
from rnr_interp.metrics import paired_diff_ci
from rnr_interp.analyses.localise.recognition import FailureCriterion, option_sequences, rank, recognize, screen_cell
from rnr_interp.records import RunDir
from rnr_interp.analyses.localise.circular import rotated_probe
from rnr_interp.analyses.localise.cohort import PANEL_CAP, Split, select_cohort
from rnr_interp.analyses.localise.readings import permutation_summary
from rnr_interp.engine.rows import run_rows
from rnr_interp.engine.rows import Row
from rnr_interp.commands.localise import failures as failures_command
from rnr_interp.commands.localise import repair as repair_command
from rnr_interp.metrics import REPAIR_EFFECT, wilson_interval, wilson_power
from rnr_interp.analyses.localise.repair import COMPONENTS, ablation_probe, controls_table, localisation_summary, run_repair, silencing_sweep
from rnr_interp.engine.sampling import deployed_decoding
from rnr_interp.engine.sampling import prompt_ids
from rnr_interp.tasks import LETTERS, BoolQ, load_task, rotate_options
from rnr_interp.tasks.base import Question
from rnr_interp.tasks.synthetic import ArithmeticMC


def test_a_broken_mlp_tie_names_the_block_the_others_act_through():
    """`best_blocks` with a broken tie names the block the record names, lists the rest
    and keeps the record; a record of another tie (another part, another table) is not
    applied. `tie_note` says which rule named it."""
    from rnr_interp.analyses.localise.mediation import tie_break
    from rnr_interp.analyses.localise.choice import best_blocks, tie_note

    table = hand_table([(layer, "mlp", 1.0 if layer in (2, 5, 11) else 0.0, 0.0, (4, 4), (3, 3)) for layer in range(12)])
    through = tie_break([2, 5, 11], {(2, 5): -0.2, (2, 11): 0.9, (5, 11): 0.6})
    assert through["named"] == 11 and through["tied"] == [2, 5, 11]
    best = best_blocks(table, ties={"mlp": through})["mlp"]
    assert best["layer"] == 11 and best["tied_with"] == [2, 5] and best["tie_break"] == through
    assert best["repair_rate"] == 1.0 and best["damage_rate"] == 0.0
    assert "and the one every earlier tied block acts through, 11, is named" in tie_note("mlp", best, {
        "n_failure_selection": 4, "n_panel_selection": 3})
    # 5 does not act through 11: no later block is acted through by every earlier one
    apart = tie_break([2, 5, 11], {(2, 5): -0.2, (2, 11): 0.9, (5, 11): 0.3})
    best = best_blocks(table, ties={"mlp": apart})["mlp"]
    assert apart["named"] == 2 and best["layer"] == 2 and best["tied_with"] == [5, 11]
    assert "the earliest (no later one is acted through by every earlier one), 2" in tie_note("mlp", best, {
        "n_failure_selection": 4, "n_panel_selection": 3})
    assert "direct effect" not in tie_note("mlp", best, {"n_failure_selection": 4, "n_panel_selection": 3})
    # where the direct effects were read they name the block: the largest, whatever acts through what
    direct = {2: {"total": -0.14, "direct": 0.04, "share": -0.29, "n": 4}, 5: {"total": 1.3, "direct": 0.01, "share": 0.0, "n": 4},
              11: {"total": 1.69, "direct": 2.65, "share": 1.57, "n": 4}}
    written = tie_break([2, 5, 11], {(2, 5): -0.2, (2, 11): 0.9, (5, 11): 0.3}, direct)
    assert (written["named"], written["named_by"]) == (11, "direct effect") and (apart["named_by"] == "acts through")
    assert written["direct"] == [{"block": layer, **direct[layer]} for layer in (2, 5, 11)]
    best = best_blocks(table, ties={"mlp": written})["mlp"]
    assert best["layer"] == 11 and tie_note("mlp", best, {"n_failure_selection": 4, "n_panel_selection": 3}).endswith(
        "and the one whose own write carries the most of its repair to the logits, 11, is named; mean direct effect "
        "of each (nats): 2 +0.04, 5 +0.01, 11 +2.65")
    # the effect in nats names it, not the share (a block that barely moves the margin can have any share)
    assert tie_break([2, 11], {(2, 11): 0.0}, {2: {**direct[2], "share": 9.0}, 11: direct[11]})["named"] == 11
    assert tie_break([2, 11], {(2, 11): 0.9}, {})["named_by"] == "acts through"
    # a largest direct effect no bigger than another tied block's (either way) names nothing: none writes the
    # failure into the logits, and what acts through what names it (SmolLM2's units organism at block 17)
    flat = {1: -0.0023, 12: -0.0106, 13: 0.002, 16: 0.0002, 17: -0.0876}
    flat = {layer: {"total": 1.0, "direct": d, "share": d, "n": 4} for layer, d in flat.items()}
    moved = {(a, b): 0.9 for a in flat for b in flat if a < b}
    unwritten = tie_break(sorted(flat), moved, flat)
    assert (unwritten["named"], unwritten["named_by"]) == (17, "acts through") and len(unwritten["direct"]) == 5
    # one that stands out above the others but moves the margin by under 0.1 nats names nothing either
    assert tie_break(sorted(flat), moved, {**flat, 13: {**flat[13], "direct": 0.09}})["named_by"] == "acts through"
    assert tie_break(sorted(flat), moved, {**flat, 13: {**flat[13], "direct": 0.1}})["named"] == 13
    quiet = {layer: {**reading, "direct": reading["direct"] / 100} for layer, reading in flat.items()}
    assert tie_break(sorted(flat), moved, {**quiet, 13: {**flat[13], "direct": 0.05}})["named_by"] == "acts through"
    best = best_blocks(hand_table([(layer, "mlp", 1.0 if layer in flat else 0.0, 0.0, (4, 4), (3, 3)) for layer in range(18)]),
                       ties={"mlp": unwritten})["mlp"]
    assert tie_note("mlp", best, {"n_failure_selection": 4, "n_panel_selection": 3}).endswith(
        "the one every earlier tied block acts through, 17, is named; no tied block's own write stands out (by at "
        "least 0.1 nats and above every other's) in its direct effect on the logits (nats): 1 -0.00, 12 -0.01, "
        "13 +0.00, 16 +0.00, 17 -0.09")
    # a record of another tie is not this one's
    assert best_blocks(table, ties={"mlp": tie_break([2, 11], {(2, 11): 0.9})})["mlp"]["layer"] == 2
    assert "tie_break" not in best_blocks(table)["mlp"]


def test_moved_shares_read_how_far_silencing_one_block_moves_a_later_one(lm):
    """Known answers for the reading: a spec that writes the panel's mean write of the
    later block in its place moves it all the way (share 1); a spec that changes nothing,
    or shifts every question's write alike, moves it not at all (share 0). The names of
    the specs are the layers they stand for."""
    from rnr_interp.analyses.localise.directions import block_output
    from rnr_interp.analyses.localise.mediation import moved_shares, proximate
    from rnr_interp.interventions import Steer

    task = parity_task(12)
    failure, panel = task.questions[:6], task.questions[6:]
    panel_mean = block_output(lm, [prompt_ids(lm, task, q) for q in panel], 1, "mlp").mean(0)
    d = lm.bridge.cfg.d_model
    silence = {0: Ablate("mlp", 1, "mean", tuple(panel_mean.tolist())), 1: Ablate("mlp", 1)}
    moved = moved_shares(lm, task, failure, panel, silence)
    assert list(moved) == [(0, 1)] and moved[0, 1] == pytest.approx(1.0, abs=1e-4)
    assert proximate([0, 1], moved) == 1
    nothing = {0: Steer(0, (0.0,) * d, 0.0, "hook_mlp_out"), 1: Ablate("mlp", 1)}
    moved = moved_shares(lm, task, failure, panel, nothing)
    assert moved[0, 1] == pytest.approx(0.0, abs=1e-6) and proximate([0, 1], moved) == 0
    # a spec that shifts the later block's write alike on every question (here by 40 times
    # its failure direction, backward) moves no failure toward the panel: share 0, where a
    # share read on the failures alone says -40
    writes = block_output(lm, [prompt_ids(lm, task, q) for q in task.questions], 1, "mlp")
    v = writes[:6].mean(0) - writes[6:].mean(0)
    shift = {0: Steer(1, tuple(v.tolist()), 40.0, "hook_mlp_out"), 1: Ablate("mlp", 1)}
    moved = moved_shares(lm, task, failure, panel, shift)
    assert moved[0, 1] == pytest.approx(0.0, abs=1e-3) and proximate([0, 1], moved) == 0
    with pytest.raises(ValueError, match="needs failures and a panel"):
        moved_shares(lm, task, failure, [], silence)


def test_a_tie_is_broken_by_silencing_each_tied_block_as_the_sweep_did(lm):
    """`break_tie` silences each tied MLP block as the sweep did (its mean write under
    mean ablation; the units its table names after a --units sweep) and names what
    `mediation` reads from that; nothing to break without a tie or a panel."""
    from rnr_interp.analyses.localise.mediation import moved_shares, tie_break
    from rnr_interp.analyses.localise.choice import break_tie
    from rnr_interp.analyses.localise.silencing import silencers
    from rnr_interp.interventions import AblateUnits

    task = parity_task(12)
    selection = (task.questions[:6], task.questions[6:])
    table = hand_table([(layer, "mlp", 1.0, 0.0, (2, 2), (0, 2)) for layer in (0, 1)])
    blocks = silencers(lm, task, [(0, "mlp"), (1, "mlp")], "mean")
    expected = tie_break([0, 1], moved_shares(lm, task, *selection, {0: blocks[0, "mlp"], 1: blocks[1, "mlp"]}))
    assert break_tie(lm, task, table, selection, "mean") == {"mlp": expected}
    units = table.assign(silenced_units=["3|7", "5|1"])
    expected = tie_break([0, 1], moved_shares(lm, task, *selection, {0: AblateUnits(0, (3, 7)), 1: AblateUnits(1, (5, 1))}))
    assert break_tie(lm, task, units, selection) == {"mlp": expected}
    assert break_tie(lm, task, table, (selection[0], [])) == {}
    assert break_tie(lm, task, table.assign(repair_rate_selection=[1.0, 0.5]), selection) == {}
    # read where the sweep read (`--read-at answer`): each question at the end of its context
    contexts = {q.id: [*prompt_ids(lm, task, q), 11, 12, 13] for q in task.questions}
    at_contexts = moved_shares(lm, task, *selection, {0: blocks[0, "mlp"], 1: blocks[1, "mlp"]}, contexts=contexts)
    assert break_tie(lm, task, table, selection, "mean", contexts=contexts) == {"mlp": tie_break([0, 1], at_contexts)}
    assert at_contexts[0, 1] != pytest.approx(moved_shares(lm, task, *selection, {0: blocks[0, "mlp"], 1: blocks[1, "mlp"]})[0, 1])
    # with the deployed replies, the direct effects are read and name the block
    from rnr_interp.analyses.localise.mediation import direct_shares

    replies = {q.id: "A" for q in task.questions}
    failing = [dataclasses.replace(q, answer="B") for q in selection[0]]
    silenced = {0: blocks[0, "mlp"], 1: blocks[1, "mlp"]}
    direct = direct_shares(lm, task, failing, replies, silenced)
    assert direct[0]["n"] == 6 and direct[0]["direct"] != pytest.approx(direct[1]["direct"])
    with_direct = break_tie(lm, task, table, (failing, selection[1]), "mean", replies=replies)["mlp"]
    assert with_direct == tie_break([0, 1], moved_shares(lm, task, failing, selection[1], silenced), direct)
    assert with_direct["named"] == max((0, 1), key=lambda layer: direct[layer]["direct"])
    # no reply parts from its gold on a token: what acts through what names it
    assert break_tie(lm, task, table, (failing, selection[1]), "mean", replies={})["mlp"]["named_by"] == "acts through"


def test_an_answer_forks_from_the_gold_at_the_first_token_they_differ_on(lm):
    """`answer_fork`: the context up to the first answer token a wrong reply and the gold
    part on (what the reply writes before its answer and the tokens they share), the
    gold's token and the reply's; nothing where the reply is right, states no answer, or
    one answer begins the other."""
    from rnr_interp.analyses.localise.positions import answer_fork

    task = load_task("copy", n=1)
    q = dataclasses.replace(task.questions[0], answer="37")
    context, gold, wrong = answer_fork(lm, task, q, "Sure. Answer: 31")
    decode = lm.tokenizer.decode
    assert context[:len(prompt_ids(lm, task, q))] == prompt_ids(lm, task, q)
    assert decode(context).endswith("Sure. Answer: 3") and (decode([gold]), decode([wrong])) == ("7", "1")
    assert answer_fork(lm, task, q, "Answer: 37") is None
    assert answer_fork(lm, task, q, "I cannot say.") is None
    assert answer_fork(lm, task, q, "Answer: 3") is None


@pytest.mark.parametrize("name", ["tiny-llama:3", "tiny-gemma2:3", "tiny-gpt2:3"])
def test_a_blocks_direct_share_is_what_its_own_write_carries_to_the_logits(name):
    """`direct_shares`: the total effect of silencing a block on the gold-vs-failure margin
    where each reply leaves the gold is the model's own logits' (read back through the
    bridge's final norm and unembedding, and the soft cap: Gemma 2 has one; GPT-2's final
    norm is a LayerNorm); the last block writes
    straight to the logits (share 1); an earlier one's own write carries a share of its
    effect that is not 1."""
    from rnr_interp.analyses.localise.directions import last_position, unembedded
    from rnr_interp.analyses.localise.mediation import direct_shares
    from rnr_interp.analyses.localise.positions import answer_fork
    from rnr_interp.engine.generate import forward, left_pad
    from rnr_interp.interventions import applied

    lm = load_model(name)
    task = load_task("copy", n=4)
    failure = [dataclasses.replace(q, answer="37") for q in task.questions]
    replies = {q.id: f"Answer: 3{d}" for q, d in zip(failure, "1245")}
    last = lm.n_layers - 1
    silence = {0: Ablate("mlp", 0), last: Ablate("mlp", last)}
    shares = direct_shares(lm, task, failure, replies, silence)
    forks = [answer_fork(lm, task, q, replies[q.id]) for q in failure]

    def margins(specs=()):
        out = []
        for context, gold, wrong in forks:
            ids, mask = left_pad([context], lm.pad_id, lm.device)
            with applied(lm, list(specs)):
                logits = forward(lm, ids, mask, last_only=True)[0][0, -1].float()
            out.append(float((logits[gold] - logits[wrong]).detach()))
        return np.array(out)

    intact = margins()
    site = ("hook_resid_post", last)
    contexts, golds = [f[0] for f in forks], [f[1] for f in forks]
    final = last_position(lm, contexts, [site])[site]
    own = forward(lm, *left_pad(contexts, lm.pad_id, lm.device), last_only=True)[0][:, -1].detach().float()
    assert unembedded(lm, final)[torch.arange(4), golds].numpy() == pytest.approx(own[torch.arange(4), golds].numpy(), abs=1e-4)
    for layer in (0, last):
        assert shares[layer]["n"] == 4
        assert shares[layer]["total"] == pytest.approx(float((margins([silence[layer]]) - intact).mean()), abs=1e-4)
    assert shares[last]["share"] == pytest.approx(1.0, abs=1e-4)
    assert shares[0]["share"] != pytest.approx(1.0, abs=1e-2)
    assert direct_shares(lm, task, failure, {q.id: "Answer: 37" for q in failure}, silence) == {}


class ParityMC(ArithmeticMC):
    """arithmetic_mc graded by a rule a random model meets about half the time (first
    character has an even code), so tiny models have both right and wrong answers."""

    name = "parity_mc"

    def extract(self, generation):
        return generation[:1] or None

    def grade(self, extracted, q):
        return extracted is not None and ord(extracted) % 2 == 0


def parity_task(n: int) -> ParityMC:
    return ParityMC(load_task("arithmetic_mc", n=n).questions, source="test")


class LetterHashMC(ArithmeticMC):
    """arithmetic_mc whose answer letter is read off the first character's code (mod 4),
    graded against the gold letter like any multiple-choice task: a random model gives
    a letter nearly always, right about one time in four, so rotated questions have
    answers to grade against their rotated gold."""

    name = "letter_hash_mc"

    def extract(self, generation):
        return LETTERS[ord(generation[0]) % 4] if generation else None


def letter_hash_task(n: int) -> LetterHashMC:
    return LetterHashMC(load_task("arithmetic_mc", n=n).questions, source="test")


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama:2")


def test_recognition_matches_plain_transformers(lm):
    task = load_task("arithmetic_mc", n=2)
    rows = recognize(lm, task, task.questions, batch_size=5)
    hf, _ = build_tiny("tiny-llama", n_layers=2)
    for q in task.questions:
        for variant in ("option", "letter"):
            sums, lens = [], []
            for seq in option_sequences(lm, task, q, variant):
                ids = torch.tensor([list(seq.context) + list(seq.continuation)])
                with torch.inference_mode():
                    logp = torch.log_softmax(hf(input_ids=ids).logits[0].float(), -1)
                n, width = len(seq.continuation), ids.shape[1]
                picked = logp[width - n - 1:width - 1].gather(-1, ids[0, width - n:, None])
                sums.append(float(picked.sum()))
                lens.append(n)
            expected = {"letter": np.array(sums)} if variant == "letter" else {
                "option:sum": np.array(sums), "option:mean": np.array(sums) / np.array(lens)}
            for readout, scores in expected.items():
                row = next(r for r in rows if r["question_id"] == q.id and r["readout"] == readout)
                np.testing.assert_allclose(row["scores"], scores, atol=1e-4)
                assert row["ranking"] == rank(scores)
                assert row["gold_first"] == (int(np.argmax(scores)) == q.gold_index)


def test_recognition_variants_use_different_prompts(lm):
    task = load_task("arithmetic_mc", n=1)
    q = task.questions[0]
    opt, let = option_sequences(lm, task, q, "option"), option_sequences(lm, task, q, "letter")
    # Option texts after the bare question; "Answer: X" after the lettered prompt.
    assert lm.tokenizer.decode(list(opt[0].continuation)) == q.choices[0]
    assert lm.tokenizer.decode(list(let[1].continuation)) == "Answer: B"
    assert list(let[0].context) == prompt_ids(lm, task, q)
    assert "A." not in lm.tokenizer.decode(list(opt[0].context))


def test_select_cohort_criteria():
    task = load_task("arithmetic_mc", n=5)
    qs = task.questions
    recog = [{"question_id": q.id, "readout": "option:mean", "gold_first": i in (0, 1, 2)} for i, q in enumerate(qs)]
    deployed = pd.DataFrame({"question_id": [q.id for q in qs], "correct": [False, True, False, True, True]})
    c = select_cohort(qs, recog, deployed, readout="option:mean", panel=2)
    assert [q.id for q in c.failure] == [qs[0].id, qs[2].id]
    assert [q.id for q in c.panel] == [qs[1].id, qs[3].id]
    assert "first 2 of 3" in c.panel_criterion and "option:mean" in c.failure_criterion
    none = select_cohort(qs, [{**r, "gold_first": False} for r in recog], deployed, readout="option:mean")
    assert none.failure == [] and "none of the 5" in none.why_empty()


def test_panel_defaults_to_every_right_question_up_to_the_cap():
    task = load_task("arithmetic_mc", n=PANEL_CAP + 6)
    qs = task.questions
    recog = [{"question_id": q.id, "readout": "option:mean", "gold_first": False} for q in qs]
    all_right = pd.DataFrame({"question_id": [q.id for q in qs], "correct": True})
    c = select_cohort(qs, recog, all_right)
    assert PANEL_CAP >= 64 and c.panel == qs[:PANEL_CAP]
    assert f"cap {PANEL_CAP}, the first {PANEL_CAP} of {len(qs)}" in c.panel_criterion
    few = select_cohort(qs, recog, all_right.assign(correct=[i % 7 == 0 for i in range(len(qs))]))
    assert few.panel == qs[::7] and f"all {len(qs[::7])} taken" in few.panel_criterion


def test_split_is_seeded_disjoint_and_covers_the_set():
    qs = load_task("arithmetic_mc", n=31).questions
    for seed in (0, 1):
        sel, out = Split(seed=seed)(qs)
        assert len(sel) == 16 and len(out) == 15 and not {q.id for q in sel} & {q.id for q in out}
        assert {q.id for q in sel} | {q.id for q in out} == {q.id for q in qs}
        assert sel == [q for q in qs if q in sel]  # task order kept inside each part
        assert Split(seed=seed)(qs) == (sel, out)
    assert Split(seed=0)(qs)[0] != Split(seed=1)(qs)[0]
    assert Split(seed=0)(qs[:1]) == (qs[:1], [])
    with pytest.raises(ValueError, match="fraction"):
        Split(fraction=1.0)


def hand_table(rows):
    """A repair table from (layer, component, repair_sel, damage_sel, repair_out k/n, damage_out k/n)."""
    out = []
    for layer, c, rs, ds, (rk, rn), (dk, dn) in rows:
        rlo, rhi = wilson_interval(rk, rn)
        dlo, dhi = wilson_interval(dk, dn)
        out.append({"layer": layer, "component": c, "repair_rate": 0.0, "damage_rate": 0.0, "selectivity": 0.0,
                    "repair_rate_selection": rs, "damage_rate_selection": ds, "selectivity_selection": rs - ds,
                    "repair_rate_heldout": rk / rn, "damage_rate_heldout": dk / dn,
                    "repair_rate_heldout_lo": rlo, "repair_rate_heldout_hi": rhi,
                    "damage_rate_heldout_lo": dlo, "damage_rate_heldout_hi": dhi,
                    "n_failure_heldout": rn, "n_panel_heldout": dn,
                    "n_failure_selection": rn, "n_panel_selection": dn, "n_failure": 2 * rn, "n_panel": 2 * dn})
    return pd.DataFrame(out)


def test_controls_are_taken_at_the_chosen_mlp_layer_and_own_bests_apart():
    """The paper's controls: attention and whole layer at the MLP's chosen layer (held
    out), never their own best layer; their own bests are reported apart, labelled."""
    table = hand_table([
        (0, "mlp", 0.2, 0.0, (1, 10), (0, 20)), (0, "attn", 0.9, 0.0, (8, 10), (1, 20)), (0, "layer", 0.1, 0.0, (1, 10), (0, 20)),
        (1, "mlp", 0.8, 0.1, (6, 10), (2, 20)), (1, "attn", 0.1, 0.0, (2, 10), (0, 20)), (1, "layer", 0.5, 0.5, (5, 10), (9, 20)),
        (2, "mlp", 0.9, 0.5, (9, 10), (10, 20)), (2, "attn", 0.0, 0.0, (0, 10), (0, 20)), (2, "layer", 0.6, 0.0, (7, 10), (3, 20)),
    ])
    s = localisation_summary(table)
    assert s["chosen"]["layer"] == 1  # best selection selectivity (0.7), not best held-out repair (layer 2)
    at = s["at_chosen_layer"]
    assert {c: e["layer"] for c, e in at.items()} == {"mlp": 1, "attn": 1, "layer": 1}
    assert {k: at["attn"]["repair"][k] for k in ("rate", "ci", "k", "n")} == {"rate": 0.2, "ci": list(wilson_interval(2, 10)), "k": 2, "n": 10}
    # power of detecting the paper's 67.6% repair at n = 10, the selection and all-question rates beside it
    assert at["attn"]["repair"]["power"] == pytest.approx(wilson_power(REPAIR_EFFECT, 10))
    assert at["attn"]["repair"]["power"] < 0.8 and not at["attn"]["repair"]["power_test"]["testable"]
    assert at["mlp"]["repair"]["selection"]["rate"] == 0.8 and at["mlp"]["repair"]["all"]["rate"] == 0.0
    assert "Wilson" in at["mlp"]["damage"]["power_test"]["test"] and at["mlp"]["damage"]["power_test"]["effect"] == "damage"
    assert at["layer"]["damage"]["rate"] == pytest.approx(9 / 20) and at["layer"]["damage"]["n"] == 20
    assert s["own_best"]["attn"]["heldout"]["layer"] == 0 and s["own_best"]["layer"]["heldout"]["layer"] == 2
    controls = controls_table(s)
    assert list(controls["block"]) == ["chosen MLP (layer 1)", "attention at the chosen layer 1",
                                       "whole layer at the chosen layer 1", "attention's own best (layer 0)",
                                       "whole layer's own best (layer 2)"]
    assert list(controls["repair_heldout"]) == [0.6, 0.2, 0.5, 0.8, 0.7]
    only_mlp = localisation_summary(table[(table["component"] == "mlp") | (table["layer"] == 1)])
    assert only_mlp["at_chosen_layer"] == at and set(only_mlp["own_best"]) == {"mlp"}  # no own best without a full sweep
    nothing = localisation_summary(table.assign(repair_rate_selection=0.0))
    assert nothing["chosen"] is None and controls_table(nothing).empty


def test_a_tie_on_the_selection_part_is_named_with_the_layers_it_ties():
    """One failure and no panel to choose on (a planted layer 18|19 organism on SmolLM2):
    layers 3, 18 and 19 each repair it; the earliest is named and the tie is stated,
    never hidden behind the earlier-layer rule."""
    from rnr_interp.analyses.localise.choice import best_blocks, tie_note

    nan = float("nan")
    table = hand_table([(layer, "layer", 1.0 if layer in (3, 18, 19) else 0.0, nan, (1, 1), (0, 1)) for layer in range(24)])
    best = best_blocks(table)["layer"]
    assert best["layer"] == 3 and best["tied_with"] == [18, 19]
    assert tie_note("layer", best, {"n_failure_selection": 1, "n_panel_selection": 0}) == (
        "the best layer block is a tie on the selection part (1 failures, 0 panel): layers 3, 18, 19 rank alike and "
        "the earliest, 3, is named")
    # a block ahead on damage is no tie
    table.loc[table.layer == 3, "damage_rate_selection"] = 0.5
    best = best_blocks(table)["layer"]
    assert best["layer"] == 18 and best["tied_with"] == [19]
    table.loc[table.layer == 19, "repair_rate_selection"] = 0.5
    assert best_blocks(table)["layer"]["tied_with"] == []
    assert tie_note("layer", best_blocks(table)["layer"], {}) is None and tie_note("mlp", None, {}) is None


def test_cell_screen_applies_its_stated_criterion():
    """A cell fails when recognition is above chance (Wilson interval of the excess
    above 0), beats generation by the margin AND the paired interval of the difference
    is above 0; none alone is enough."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(4, 80))
        rec, gen = rng.random(n) < rng.random(), rng.random(n) < rng.random()
        chance = 1 / rng.integers(2, 6, n)
        crit = FailureCriterion(margin=float(rng.choice([0.0, 0.1, 0.2])))
        cell = screen_cell(rec, gen, chance, crit)
        diff = rec.mean() - gen.mean()
        lo, _ = paired_diff_ci(gen, rec)
        r_lo, r_hi = wilson_interval(int(rec.sum()), n)
        assert cell["recognition_chance"] == pytest.approx(chance.mean())
        assert cell["recognition_excess_ci"] == pytest.approx([r_lo - chance.mean(), r_hi - chance.mean()])
        assert cell["difference"] == pytest.approx(diff) and cell["difference_ci"][0] == pytest.approx(lo)
        assert cell["n_recognised_not_generated"] == int((rec & ~gen).sum())
        assert cell["failure"] == (r_lo > chance.mean() and diff >= crit.margin and lo > 0)
    big_but_noisy = screen_cell([True, True, False], [False, False, False], [0.25] * 3)  # +0.67, but 3 questions
    assert big_but_noisy["difference"] > 0.1 and not big_but_noisy["failure"]
    sure_but_small = screen_cell([True] * 1000 + [False] * 9000, [True] * 500 + [False] * 9500, [0.05] * 10000,
                                 FailureCriterion(margin=0.1))
    assert sure_but_small["difference_ci"][0] > 0 and not sure_but_small["failure"]
    # recognition 0.40 beats generation 0.05 by far, but with 4 options chance is 0.25 and 20 questions
    # cannot place 0.40 above it; a guessing mixture (known share k = 0.15 / 0.75) calls half of it lucky
    at_chance = screen_cell([True] * 8 + [False] * 12, [True] + [False] * 19, [0.25] * 20)
    assert at_chance["difference_ci"][0] > 0 and at_chance["recognition_excess_ci"][0] < 0 and not at_chance["failure"]
    assert at_chance["lucky_share_of_recognised"] == pytest.approx(0.5)
    assert "0.1" in FailureCriterion().describe() and "chance" in FailureCriterion().describe()
    with pytest.raises(ValueError, match="equally many"):
        screen_cell([True], [True, False], [0.5])


def test_failures_over_cells_writes_the_screen_and_its_scatter(tmp_path):
    """`rnr failures` over models x tasks: one failures run per cell, the screen table
    recounted from each cell's recognition table and deployed records, the criterion
    applied, the scatter drawn; cells of one task decoded differently are refused."""
    from rnr_interp.analyses.localise.repair import run_failures, screen_table

    app = typer.Typer()
    app.command("failures")(failures_command)
    app.command("noop")(lambda: None)
    out = tmp_path / "screen"
    res = CliRunner().invoke(app, ["failures", "--model", "tiny-llama:2", "--model", "tiny-qwen2:2", "--task", "arithmetic_mc",
                                   "--n", "12", "--max-new-tokens", "3", "--margin", "0.05", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    screen = RunDir(out)
    table = screen.read_table("screen")
    assert list(table["model"]) == ["tiny-llama:2", "tiny-qwen2:2"] and table["task"].str.startswith("arithmetic_mc (").all()
    for row in table.itertuples():
        cell = RunDir(row.path)
        rec = cell.read_table("recognition").query("readout == 'option:mean'").set_index("question_id")["gold_first"]
        dep = cell.read_records().query("probe == 'deployed'").set_index("question_id")["correct"]
        assert row.recognition_score == pytest.approx(rec.mean()) and row.generation_score == pytest.approx(dep.mean())
        assert row.recognition_chance == pytest.approx(1 / 4)  # arithmetic_mc has 4 options
        assert row.failure == (row.recognition_excess_lo > 0 and row.difference >= 0.05 and row.difference_lo > 0)
    assert "recognition score - generation score >= 0.05" in screen.read_summary().criterion
    assert (out / "figures" / "screen_scatter.html").is_file() and "cells are failure cells" in res.output
    task = parity_task(4)
    lm = load_model("tiny-llama:2")
    a = run_failures(lm, task, tmp_path / "a", decoding=deployed_decoding(task, 2), progress=False)
    run_failures(lm, task, tmp_path / "b", decoding=deployed_decoding(task, 3), progress=False)
    assert a.screen["n_questions"] == 4
    with pytest.raises(ValueError, match="decoded differently"):
        screen_table([RunDir(tmp_path / "a"), RunDir(tmp_path / "b")])


def test_sweep_rates_equal_separate_unbatched_runs(lm):
    task = parity_task(5)
    decoding = deployed_decoding(task, max_new_tokens=3)
    base = generate(lm, [prompt_ids(lm, task, q) for q in task.questions], decoding=decoding)
    right = [q for q, g in zip(task.questions, base) if task.grade(task.extract(g[0].text), q)]
    wrong = [q for q in task.questions if q not in right]
    assert right and wrong, "the parity grader should split a random model's answers"
    split = Split(seed=3)
    table = silencing_sweep(lm, task, wrong, right, decoding=decoding, batch_size=64, split=split)
    assert len(table) == lm.n_layers * len(COMPONENTS)
    (w_sel, w_out), (_, r_out) = split(wrong), split(right)
    changed = 0
    for row in table.itertuples():
        ok = {}
        for q in task.questions:
            g = generate(lm, [prompt_ids(lm, task, q)], decoding=decoding,
                         interventions=[Ablate(row.component, row.layer)])[0][0]
            ok[q.id] = task.grade(task.extract(g.text), q)
        assert row.repair_rate == pytest.approx(np.mean([ok[q.id] for q in wrong]))
        assert row.damage_rate == pytest.approx(np.mean([not ok[q.id] for q in right]))
        assert row.repair_rate_selection == pytest.approx(np.mean([ok[q.id] for q in w_sel]))
        fixed = sum(ok[q.id] for q in w_out)
        assert row.n_failure_heldout == len(w_out) and row.repair_rate_heldout == pytest.approx(fixed / len(w_out))
        assert (row.repair_rate_heldout_lo, row.repair_rate_heldout_hi) == pytest.approx(wilson_interval(fixed, len(w_out)))
        damaged = [not ok[q.id] for q in r_out]
        assert row.damage_rate_heldout == pytest.approx(np.mean(damaged) if damaged else float("nan"), nan_ok=True)
        changed += row.repair_rate > 0 or row.damage_rate > 0
    assert changed, "no ablation changed any answer: the comparison would be vacuous"


def test_sweep_rows_replaying_early_blocks_equal_rows_without(monkeypatch):
    """run_rows replays, row by row, the blocks before the silenced one: the records are
    those of running every block, and each batch replays once per first layer past 0."""
    import rnr_interp.engine.generate as engine

    lm = load_model("tiny-llama:4")
    task = parity_task(3)
    decoding = deployed_decoding(task, max_new_tokens=6)
    rows = [Row(q, (Ablate(c, layer),), ablation_probe(c, layer))
            for q in task.questions for layer in range(lm.n_layers) for c in COMPONENTS]
    replayed = []
    original = engine.replaying
    monkeypatch.setattr(engine, "replaying", lambda lm_, resid, keys, *a: replayed.append(len(keys)) or original(lm_, resid, keys, *a))
    plain = run_rows(lm, task, rows, decoding, batch_size=4, reuse_prefix=False)
    assert replayed == []
    reused = run_rows(lm, task, rows, decoding, batch_size=4)
    # 12 rows per question by layer, in batches of 4: layers 0-1, 1-2, 2-3
    assert replayed == [1, 1, 2, 2, 3] * len(task.questions)
    key = ["question_id", "probe"]
    a, b = (df.sort_values(key).reset_index(drop=True) for df in (reused, plain))
    same = ["question_id", "probe", "text", "extracted", "correct", "n_tokens", "finish"]
    pd.testing.assert_frame_equal(a[same], b[same])
    assert np.allclose(a["logprob"], b["logprob"], atol=1e-4)
    assert plain["text"].nunique() > len(task.questions), "no ablation changed a generation: vacuous"


def test_rows_replay_by_default_where_replay_pays_only(monkeypatch):
    """The default of `reuse_prefix` is the device's (`generate.replay_pays`): on for a
    CPU model, off for a GPU one, where the per-group prefills cost more than they save."""
    import types

    import rnr_interp.engine.generate as engine
    import rnr_interp.engine.rows as row_runner

    lm = load_model("tiny-llama:2")
    assert engine.replay_pays(lm)
    assert not engine.replay_pays(types.SimpleNamespace(device=torch.device("cuda", 0)))
    task = parity_task(2)
    rows = [Row(q, (Ablate("mlp", 1),), ablation_probe("mlp", 1)) for q in task.questions]
    replayed = []
    original = engine.replaying
    monkeypatch.setattr(engine, "replaying", lambda *a: replayed.append(1) or original(*a))
    run_rows(lm, task, rows, deployed_decoding(task, max_new_tokens=2))
    assert replayed, "a CPU model's rows did not replay by default"
    replayed.clear()
    monkeypatch.setattr(row_runner, "replay_pays", lambda lm_: False)
    run_rows(lm, task, rows, deployed_decoding(task, max_new_tokens=2))
    assert replayed == []


def test_mlp_sweep_adds_same_layer_controls_at_the_chosen_layer_only(tmp_path, lm):
    task = parity_task(24)
    d = deployed_decoding(task, max_new_tokens=3)
    s = run_repair(lm, task, tmp_path / "r", panel=8, decoding=d, sweep="mlp", progress=False)
    table = RunDir(tmp_path / "r").read_table("repair")
    assert sorted(table.loc[table["component"] == "mlp", "layer"]) == list(range(lm.n_layers))
    if s.chosen is None:
        assert set(table["component"]) == {"mlp"}
        return
    chosen = s.chosen["layer"]
    assert set(zip(table.loc[table["component"] != "mlp", "component"], table.loc[table["component"] != "mlp", "layer"])) \
        == {("attn", chosen), ("layer", chosen)}
    assert {c: e["layer"] for c, e in s.at_chosen_layer.items()} == {"mlp": chosen, "attn": chosen, "layer": chosen}
    assert set(s.own_best) == {"mlp"}
    full = run_repair(lm, task, tmp_path / "full", panel=8, decoding=d, progress=False)
    assert full.chosen["layer"] == chosen
    assert json.dumps(full.at_chosen_layer) == json.dumps(s.at_chosen_layer)  # NaN-tolerant equality


def test_repair_run_folder_and_cli(tmp_path, lm):
    app = typer.Typer()
    app.command("repair")(repair_command)
    app.command("failures")(failures_command)
    out = tmp_path / "repair"
    res = CliRunner().invoke(app, ["repair", "--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "6",
                                   "--panel", "3", "--max-new-tokens", "4", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    run = RunDir(out)
    s = run.read_summary()
    assert s.kind == "repair" and set(s.own_best) == set(COMPONENTS) and "selection" in s.choice_rule
    assert s.permutation_control is None and "permutation_control" not in run.config  # off by default
    assert "permutation control" not in res.output
    assert s.split["n_failure_selection"] + s.split["n_failure_heldout"] == s.n_failure
    assert "cap 3" in s.panel_criterion and s.screen["criterion"]
    table = run.read_table("repair")
    assert {"layer", "component", "repair_rate", "damage_rate", "n_failure", "n_panel", "repair_rate_heldout",
            "repair_rate_heldout_lo", "damage_rate_heldout_hi", "n_failure_heldout"} <= set(table.columns)
    assert run.read_table("controls").equals(controls_table(s.to_json())) or controls_table(s.to_json()).empty
    assert len(table) == 2 * 3
    failure = run.read_json("failure_set")
    assert failure["criterion"] and (table["n_failure"] == len(failure["question_ids"])).all()
    assert (table["n_panel"] == len(run.read_json("healthy_panel")["question_ids"])).all()
    if not failure["question_ids"]:
        assert s.failure_empty_reason and "failure set" in res.output
    recs = run.read_records()
    assert set(recs["probe"]) >= {"deployed"} and (recs["probe"] == recs["intervention"].replace("", "deployed")).all()
    assert all((out / "figures" / f"{n}.html").is_file() for n in ("repair_heatmap", "damage_heatmap", "selectivity"))
    assert (out / "figures" / "controls.html").is_file() == (not run.read_table("controls").empty)
    assert ("held-out rates" in res.output) == (not run.read_table("controls").empty)
    # The same command on the same folder resumes without generating anything new.
    parts = len(run.parts())
    assert CliRunner().invoke(app, ["repair", "--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "6",
                                    "--panel", "3", "--max-new-tokens", "4", "--out", str(out), "--quiet"]).exit_code == 0
    assert len(RunDir(out).parts()) == parts
    # a free-form task is ranked by its answer statements, never by an option readout
    res = CliRunner().invoke(app, ["failures", "--model", "tiny-llama:3", "--task", "arithmetic", "--n", "2",
                                   "--readout", "option:mean", "--out", str(tmp_path / "f")])
    assert res.exit_code != 0 and "not multiple choice" in res.output
    # --permute-control: a new config (another folder), the control in summary and output
    res = CliRunner().invoke(app, ["repair", "--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "6",
                                   "--panel", "3", "--max-new-tokens", "4", "--out", str(out), "--quiet", "--permute-control"])
    assert res.exit_code == 2 and "different config" in res.output and "permutation_control" in res.output
    res = CliRunner().invoke(app, ["repair", "--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "6",
                                   "--panel", "3", "--max-new-tokens", "4", "--out", str(tmp_path / "p"), "--quiet",
                                   "--permute-control"])
    assert res.exit_code == 0, res.output
    control = RunDir(tmp_path / "p").read_summary().permutation_control
    assert "permutation control: " in res.output
    assert ("rotated by 1" in res.output) == ("skipped" not in control)


def _records(rows):
    """Records of (question, probe, extracted) graded against that question's gold."""
    return pd.DataFrame([{"question_id": q.id, "probe": probe, "extracted": a, "gold": q.answer, "correct": a == q.answer}
                         for q, probe, a in rows])


def test_permutation_summary_tells_content_from_letter_position():
    qs = [Question(id=f"q{i}", text="?", answer=LETTERS[g], choices=("w", "x", "y", "z"), gold_index=g)
          for i, g in enumerate([0, 3, 1, 2, 2, 1])]
    rot = [rotate_options(q) for q in qs]
    assert [r.answer for r in rot] == ["B", "A", "C", "D", "D", "C"]
    block = "ablate:mlp:1"
    records = _records(
        [(q, "deployed", "A") for q in qs]
        # unrotated: q0, q4, q5 repaired; q1 repaired by a bias moved to D; q2 answered C (wrong); q3 none
        + [(q, block, a) for q, a in zip(qs, ["A", "D", "C", None, "C", "B"])]
        + [(r, rotated_probe("deployed"), "A") for r in rot]  # q1's rotated gold is A: the baseline gets it
        # rotated: q0 and q5 follow their content, q1 keeps its letter D, q2 lands on its rotated gold,
        # q4 moves to a third letter
        + [(r, rotated_probe(block), a) for r, a in zip(rot, ["B", "D", "C", None, "A", "C"])])
    s = permutation_summary(records, qs, [block])
    assert s["shift"] == 1 and s["n"] == 6 and "(i + 1) mod n" in s["rotation"] and "letter position" in s["reading"]
    assert (s["baseline"]["k"], s["baseline"]["n"]) == (1, 6)
    c = s["probes"][block]
    assert (c["repair"]["k"], c["repair"]["n"]) == (3, 6) and c["repair"]["ci"] == pytest.approx(list(wilson_interval(3, 6)))
    assert (c["unrotated_repair"]["k"], c["unrotated_repair"]["n"]) == (4, 6)
    assert c["repairs"] == {"n": 4, "follow_content": 2, "follow_position": 1, "other": 1}
    ch = c["answer_changes"]
    assert (ch["n"], ch["changed"], ch["to_gold"], ch["to_other"], ch["unchanged"]) == (6, 5, 3, 2, 1)
    assert ch["after_counts"] == {"B": 1, "D": 1, "C": 2}


def test_repair_permutation_control_rows_grading_and_resume(tmp_path, lm):
    from rnr_interp.analyses.localise.repair import ablation_probe

    task = letter_hash_task(40)
    d = deployed_decoding(task, max_new_tokens=3)
    s = run_repair(lm, task, tmp_path / "r", panel=8, decoding=d, permutation_control=True, progress=False)
    assert s.chosen is not None, "the fixture should choose a block"
    run = RunDir(tmp_path / "r")
    assert run.config["permutation_control"] == {"shift": 1}
    held = run.read_json("failure_set")["heldout_ids"]
    block = ablation_probe("mlp", s.chosen["layer"])
    control = s.permutation_control
    assert control["block"] == block and set(control["probes"]) == {block} and control["n"] == len(held) > 0
    recs = run.read_records()
    by_id = {q.id: q for q in task.questions}
    for probe in (rotated_probe("deployed"), rotated_probe(block)):
        mine = recs[recs["probe"] == probe]
        assert sorted(mine["question_id"]) == sorted(held)
        for row in mine.itertuples():
            moved = rotate_options(by_id[row.question_id])
            # graded against the rotated gold, which is never the gold as loaded
            assert row.gold == moved.answer != by_id[row.question_id].answer
            assert row.correct == (row.extracted == moved.answer)
        k = int(mine["correct"].sum())
        entry = control["baseline"] if probe == rotated_probe("deployed") else control["probes"][block]["repair"]
        assert (entry["k"], entry["n"]) == (k, len(held))
        assert entry["ci"] == pytest.approx(list(wilson_interval(k, len(held))))
    unrotated = recs[(recs["probe"] == block) & recs["question_id"].isin(held)]
    assert control["probes"][block]["unrotated_repair"]["k"] == int(unrotated["correct"].sum())
    assert recs["correct"][recs["probe"].str.startswith("rotated:")].any(), "nothing right under rotation: vacuous"
    # the report page shows the control, labelled, with the rotated rate and its interval
    from rnr_interp.report.html import build_page

    page, _ = build_page(run)
    rotated = control["probes"][block]["repair"]
    assert "permutation control (held-out failures)" in page and "option i shown at position (i + 1) mod n" in page
    assert f"{rotated['k']} of {rotated['n']}: {rotated['rate']:.3f} [{rotated['ci'][0]:.3f}, {rotated['ci'][1]:.3f}]" in page
    assert "follow the letter position" in page or "follows the letter position" in page
    # resumed: the rotated rows are read back, not generated again
    parts = len(run.parts())
    again = run_repair(lm, task, tmp_path / "r", panel=8, decoding=d, permutation_control=True, progress=False)
    assert len(RunDir(tmp_path / "r").parts()) == parts
    assert json.dumps(again.permutation_control) == json.dumps(control)


def test_the_permutation_control_of_a_units_sweep_silences_the_units_the_sweep_did(tmp_path, lm):
    """Under --units the chosen block's rotated rows silence the very units its repair
    table names (read back from the table, not chosen again)."""
    from rnr_interp.analyses.localise.circular import rotated_probe

    task = letter_hash_task(40)
    s = run_repair(lm, task, tmp_path / "u", panel=8, decoding=deployed_decoding(task, max_new_tokens=3), units=16,
                   sweep="mlp", permutation_control=True, progress=False)
    assert s.chosen is not None, "the fixture should choose a block"
    run = RunDir(tmp_path / "u")
    named = run.read_table("repair").set_index(["component", "layer"]).loc[("mlp", s.chosen["layer"]), "silenced_units"]
    rotated = run.read_records()
    rotated = rotated[rotated["probe"] == rotated_probe(ablation_probe("mlp", s.chosen["layer"]))]
    assert len(rotated) == s.permutation_control["n"] > 0 and named.count("|") == 15
    assert set(rotated["intervention"]) == {AblateUnits(s.chosen["layer"], tuple(int(u) for u in named.split("|"))).label()}


def test_a_sweep_reads_each_block_where_each_answer_starts_when_asked(tmp_path, lm, monkeypatch):
    """`run_repair(read_at="answer")` (`rnr repair --read-at answer`) reads every block's
    failure direction at the end of each selection question's reading context, built from
    the run's own deployed replies, as `rnr units` and `rnr steer --read-at answer` read
    the chosen block: to score its units (`--units K`) and to break a tie (with or without
    units); config and summary say so; by default the prompts are read; a place that is
    not one is refused before any folder."""
    from rnr_interp.analyses.localise import repair, silencing
    from rnr_interp.analyses.localise.positions import reading_contexts

    task = letter_hash_task(40)
    d = deployed_decoding(task, max_new_tokens=8)
    seen, ties = [], []
    real, real_tie = silencing.mlp_unit_sets, repair.break_tie
    monkeypatch.setattr(silencing, "mlp_unit_sets", lambda *a, **k: seen.append(k["contexts"]) or real(*a, **k))
    monkeypatch.setattr(repair, "break_tie", lambda *a, **k: ties.append(k["contexts"]) or real_tie(*a, **k))
    s = run_repair(lm, task, tmp_path / "a", panel=8, decoding=d, units=4, sweep="mlp", read_at="answer", progress=False)
    run = RunDir(tmp_path / "a")
    assert run.config["read_at"] == "answer" and s.read_at == "answer" and s.units == 4
    deployed = run.read_records(filters=[("probe", "=", "deployed")])
    replies = dict(zip(deployed["question_id"], deployed["text"]))
    contexts = seen[0]
    assert len(contexts) == s.split["n_failure_selection"] + s.split["n_panel_selection"] > 0
    assert set(contexts) <= {*run.read_json("failure_set")["question_ids"], *run.read_json("healthy_panel")["question_ids"]}
    by_id = {q.id: q for q in task.questions}
    assert contexts == {i: reading_contexts(lm, task, [by_id[i]], replies, "answer")[0] for i in contexts}
    assert ties == [contexts]
    seen.clear(), ties.clear()
    default = run_repair(lm, task, tmp_path / "p", panel=8, decoding=d, units=4, sweep="mlp", progress=False)
    assert seen == ties == [None] and default.read_at is None and "read_at" not in RunDir(tmp_path / "p").config
    ties.clear()
    whole = run_repair(lm, task, tmp_path / "w", panel=8, decoding=d, sweep="mlp", read_at="answer", progress=False)
    assert whole.read_at == "answer" and whole.units is None and ties == [contexts]
    with pytest.raises(ValueError, match="read_at must be one of"):
        run_repair(lm, task, tmp_path / "bad", panel=8, decoding=d, read_at="end", progress=False)
    assert not (tmp_path / "bad").exists()
    app = typer.Typer()
    app.command("repair")(repair_command)
    app.command("failures")(failures_command)
    res = CliRunner().invoke(app, ["repair", "--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "6",
                                   "--read-at", "end", "--out", str(tmp_path / "cli")])
    assert res.exit_code == 2 and "--read-at must be one of" in res.output and not (tmp_path / "cli").exists()
    res = CliRunner().invoke(app, ["repair", "--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "6", "--panel", "3",
                                   "--max-new-tokens", "4", "--sweep", "mlp", "--read-at", "answer", "--out", str(tmp_path / "cli"),
                                   "--quiet"])
    assert res.exit_code == 0, res.output
    assert "broken reading each block's failure direction where each deployed reply's answer starts" in res.output
    assert RunDir(tmp_path / "cli").config["read_at"] == "answer"


def test_permutation_control_refuses_tasks_not_graded_by_letter(tmp_path, lm):
    boolq = BoolQ([Question(id="b0", text="Is it?", answer="yes", choices=("yes", "no"), gold_index=0, context="It is.")])
    with pytest.raises(ValueError, match="not option letters"):
        run_repair(lm, boolq, tmp_path / "b", permutation_control=True, progress=False)
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_smollm2_arc_easy_end_to_end(smollm2, shared_data, tmp_path):
    # 16 questions give SmolLM2 a failure set of ~3 (it answers "A." nearly always);
    # panel 2 and 4 new tokens ("A." / "Answer: B") keep 30 x 3 x ~5 rows near 3 min.
    task = load_task("arc_easy", data=shared_data / "arc" / "ARC-Easy-Test.jsonl", n=16)
    s = run_repair(smollm2, task, tmp_path / "repair", panel=2, decoding=deployed_decoding(task, max_new_tokens=4),
                   batch_size=64, progress=False)
    table = RunDir(tmp_path / "repair").read_table("repair")
    assert len(table) == smollm2.n_layers * 3
    print(json.dumps({k: v for k, v in s.to_json().items() if k != "table"}, indent=1, default=str))
    if s.n_failure == 0:
        assert s.failure_empty_reason
        assert table["repair_rate"].isna().all()
    else:
        assert table["repair_rate"].between(0, 1).all()


def test_a_mean_ablation_repair_silences_every_row_by_its_mean_and_says_so(tmp_path, lm):
    task = letter_hash_task(40)
    d = deployed_decoding(task, max_new_tokens=3)
    s = run_repair(lm, task, tmp_path / "mean", panel=8, decoding=d, sweep="mlp", ablation="mean",
                   permutation_control=True, progress=False)
    run = RunDir(tmp_path / "mean")
    assert run.config["ablation"] == "mean" and s.ablation == "mean"
    silenced = run.read_records()
    silenced = silenced[silenced["probe"].str.contains("ablate:")]
    assert len(silenced) and silenced["intervention"].str.match(r"ablate:(mlp|attn|layer):\d+:mean:[0-9a-f]{8}$").all()
    # the default is the paper's zero ablation, and its run folder reads as it always did
    zero = run_repair(lm, task, tmp_path / "zero", panel=8, decoding=d, sweep="mlp", progress=False)
    assert zero.ablation == "zero" and "ablation" not in RunDir(tmp_path / "zero").config
    def mlp_rates(folder):
        table = RunDir(folder).read_table("repair")
        return table[table["component"] == "mlp"].set_index("layer")[["repair_rate", "damage_rate"]]

    assert not mlp_rates(tmp_path / "zero").equals(mlp_rates(tmp_path / "mean")), "mean and zero ablation silenced alike"
    with pytest.raises(ValueError, match="ablation must be one of zero, mean"):
        run_repair(lm, task, tmp_path / "bad", ablation="resample", progress=False)
    assert not (tmp_path / "bad").exists()


def test_localisation_reads_right_and_wrong_under_the_grading_asked(tmp_path, lm):
    from rnr_interp.analyses.localise.steering import run_steer

    task = load_task("arithmetic", n=12)
    d = deployed_decoding(task, max_new_tokens=6)
    s = run_repair(lm, task, tmp_path / "r", readout="answer", panel=4, decoding=d, sweep="mlp", grading="flexible",
                   progress=False)
    run = RunDir(tmp_path / "r")
    records = run.read_records()
    assert run.grading == "flexible" and (records["correct"] == records["correct_flexible"]).all()
    assert s.n_failure + s.n_panel <= s.n_questions
    run_repair(lm, task, tmp_path / "s", readout="answer", panel=4, decoding=d, sweep="mlp", progress=False)
    strict = RunDir(tmp_path / "s")
    assert strict.grading == "strict" and (strict.read_records()["correct"] == strict.read_records()["correct_strict"]).all()
    # steering on a repair run's cohort reads right and wrong as that run did, or refuses
    with pytest.raises(ValueError, match="graded flexible, this run strict: pass --grading flexible"):
        run_steer(lm, task, tmp_path / "steer", repair_run=tmp_path / "r", readout="answer", panel=4, decoding=d,
                  progress=False)


def test_cell_screen_refuses_a_run_without_its_generation_table(tmp_path):
    """A failures run written before runs stored their generation table (or not
    finished) is refused naming the table, not read from its deployed records."""
    from rnr_interp.analyses.localise.repair import cell_screen
    from rnr_interp.records import RunFolderError

    run = RunDir.create(tmp_path / "cell", {"kind": "failures", "readout": "letter"})
    run.write_table("recognition", pd.DataFrame({"question_id": ["q0"], "readout": ["letter"], "gold_first": [True],
                                                 "scores": [[0.0, -1.0]]}))
    with pytest.raises(RunFolderError, match="no generation table .* rerun it"):
        cell_screen(run, "letter")
