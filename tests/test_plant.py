"""Model organisms: the planted checkpoint is an ordinary folder, reproducible from its
seed, and the layer organism undoes exactly."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from rnr_interp.analyses.organisms import (
    HEADROOM, PLANTED_FILE, WEIGHTS_FILE, answer_inputs, draw_layer, load_base, plant, read_planted, remove_layer, view_of,
)
from rnr_interp.cli import app
from rnr_interp.engine.generate import forward
from rnr_interp.interventions import Route, applied
from rnr_interp.models import load_model
from tests.test_localise_freeform import Echo

BASE = "tiny-llama:4"


@torch.no_grad()
def logits(lm, text: str = "What is 12 + 30?"):
    ids = torch.tensor([lm.encode(lm.render(text))])
    out, _ = forward(lm, ids, torch.ones_like(ids))
    return out


@pytest.mark.parametrize("spec", ["tiny-llama:4", "tiny-gemma3:4", "tiny-olmo2:4"])
def test_skipping_the_planted_layer_gives_back_the_base_exactly(tmp_path, spec):
    planted = plant("layer", spec, tmp_path / "org", layer=2, strength=1.5, seed=3)
    base, organism = load_model(spec), load_model(str(tmp_path / "org"))
    assert organism.n_layers == base.n_layers + 1 == planted.n_layers
    assert not torch.equal(logits(organism), logits(base))  # the plant has an effect
    skip = tuple(i for i in range(organism.n_layers) if i != 2)
    with applied(organism, [Route(skip)]):
        assert torch.equal(logits(organism), logits(base))


def test_removing_the_planted_layer_gives_back_the_base_weights(tmp_path):
    plant("layer", BASE, tmp_path / "org", layer=1, strength=2.0, seed=0)
    organism, _ = load_base(str(tmp_path / "org"))
    remove_layer(organism, 1)
    base, _ = load_base(BASE)
    theirs, ours = base.state_dict(), organism.state_dict()
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)


def test_strength_zero_is_no_effect(tmp_path):
    planted = plant("null", BASE, tmp_path / "null", seed=5)
    assert planted.strength == 0 and planted.expected == {"effect": False}
    assert planted.location["layer"] == draw_layer(5, 4)
    assert torch.equal(logits(load_model(str(tmp_path / "null"))), logits(load_model(BASE)))


def test_an_organism_is_reproducible_from_its_seed(tmp_path):
    first = plant("null", BASE, tmp_path / "a", seed=11)
    again = plant("null", BASE, tmp_path / "b", seed=11)
    assert (tmp_path / "a" / WEIGHTS_FILE).read_bytes() == (tmp_path / "b" / WEIGHTS_FILE).read_bytes()
    assert first == again == read_planted(tmp_path / "a")
    other_seeds = {plant("null", "tiny-llama:12", tmp_path / f"s{s}", seed=s).location["layer"] for s in range(6)}
    assert len(other_seeds) > 1  # the seed does draw the location


def test_expected_findings_name_the_planted_layer(tmp_path):
    duplicate = plant("layer", BASE, tmp_path / "dup", layer=2, seed=0)
    assert duplicate.strength == 1.0
    # at strength 1 the copy and its original are one block twice: removing either is the base
    assert duplicate.expected["repair"] == {"component": "layer", "layers": [2, 3]}
    scaled = plant("layer", BASE, tmp_path / "scaled", layer=2, strength=3.0, seed=0)
    assert scaled.expected["route"] == {"space": "skiponly", "skip": [2]}


def test_plant_command_writes_a_checkpoint_every_command_loads(tmp_path):
    out = tmp_path / "org"
    done = CliRunner().invoke(app, ["plant", "layer", "--model", BASE, "--out", str(out), "--layer", "1", "--seed", "2"])
    assert done.exit_code == 0, done.output
    truth = json.loads((out / PLANTED_FILE).read_text())
    assert truth["kind"] == "layer" and truth["location"] == {"layer": 1} and truth["seed"] == 2
    assert {"config.json", WEIGHTS_FILE, "tokenizer.json"} <= {p.name for p in out.iterdir()}
    info = CliRunner().invoke(app, ["model-info", str(out)])
    assert info.exit_code == 0 and json.loads(info.output[info.output.index("{"):])["n_layers"] == 5


@pytest.mark.parametrize("args, message", [
    (["plant", "bogus", "--model", BASE], "kind must be one of"),
    (["plant", "layer", "--model", BASE, "--layer", "9"], "--layer must be in 0..3"),
    (["plant", "units", "--model", BASE, "--task", "arithmetic", "--layer", "-1"], "--layer must be in 0..3"),
    (["plant", "null", "--model", BASE, "--strength", "1"], "takes neither --layer nor --strength"),
    (["plant", "layer", "--model", "/nowhere/model"], "plant takes a built-in model"),
    (["plant", "sharpen", "--model", BASE], "give --task"),
    (["plant", "gap", "--model", BASE, "--n", "3"], "--n takes the first N questions of --task"),
    (["plant", "units", "--model", BASE], "give --task"),
    (["plant", "layer", "--model", BASE, "--units", "2"], "takes no --units"),
    (["plant", "layer", "--model", BASE, "--temperature", "0.5"], "takes no --temperature"),
    (["plant", "gap", "--model", BASE, "--task", "arithmetic", "--temperature", "0"], "--temperature must be a positive"),
    (["plant", "units", "--model", BASE, "--task", "arithmetic", "--units", "0"], "--units must be at least 1"),
    (["plant", "units", "--model", BASE, "--task", "arithmetic", "--units", "99"], "not more than --units 99"),
    (["plant", "units", "--model", "tiny-gpt2:4", "--task", "arithmetic"], "gated MLP"),
    (["plant", "units", "--model", BASE, "--task", "arithmetic", "--strength", "-1"], "cannot be negative"),
    (["plant", "units", "--model", BASE, "--task", "arithmetic", "--layer", "0", "--strength", "1e6"],
     "turns none of its answers in block 0"),
    (["plant", "units", "--model", "tiny-olmo2:4", "--task", "arithmetic", "--units", "2", "--layer", "0", "--strength", "1e6"],
     "turns none of its answers in block 0"),
])
def test_bad_plant_options_are_one_line_errors(tmp_path, args, message):
    done = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "org")])
    assert done.exit_code == 2 and message in done.output and "Traceback" not in done.output
    assert not (tmp_path / "org").exists()


def test_plant_never_overwrites_a_folder(tmp_path):
    out = tmp_path / "org"
    out.mkdir()
    (out / "result.txt").write_text("keep me")
    done = CliRunner().invoke(app, ["plant", "layer", "--model", BASE, "--out", str(out)])
    assert done.exit_code == 2 and "not an empty folder" in done.output
    assert (out / "result.txt").read_text() == "keep me"


# -- validate ------------------------------------------------------------------------


def test_validate_recovers_the_planted_layer_and_its_nulls_stay_silent(tmp_path, monkeypatch):
    from tests.test_localise_freeform import echo_task

    from rnr_interp.analyses.validate import PROFILES, run_validate
    from rnr_interp.records import RunDir

    task = echo_task()
    # the quick profile's cells with the route check it leaves out
    monkeypatch.setitem(PROFILES, "quick", replace(PROFILES["quick"], left_out=()))
    summary = run_validate(BASE, task, tmp_path / "v", profile="quick", progress=False)
    run = RunDir(tmp_path / "v")
    recovery = run.read_table("recovery")
    assert list(recovery.columns) == ["kind", "strength", "seed", "analysis", "planted", "found", "recovered", "score",
                                      "organism"]
    # three seeds, each planted and null, each read by the repair sweep and the skip-only route check
    assert len(recovery) == 12 and set(recovery["analysis"]) == {"repair:layer", "route:skiponly"}
    # seeds 0 and 2 draw the same layer of this 4-layer model (2, 1, 2): one organism, analysed once
    assert [draw_layer(s, 4) for s in (0, 1, 2)] == [2, 1, 2]
    for strength in (0.0, 1.0):
        rows = recovery[recovery["strength"] == strength].set_index(["seed", "analysis"])
        assert (rows.loc[0, "organism"] == rows.loc[2, "organism"]).all() and (rows.loc[0, "organism"] != rows.loc[1, "organism"]).all()
        assert (rows.loc[0, "found"] == rows.loc[2, "found"]).all()
        name = "layer-s1-seed2" if strength else "layer-s0-seed2"
        assert (tmp_path / "v" / "organisms" / name).is_dir() and not list((tmp_path / "v" / "runs").glob(f"{name}__*"))
    assert recovery["score"].isna().all()  # a layer is a location alone
    planted = recovery[recovery["strength"] > 0]
    assert planted["recovered"].all() and (planted["found"] != "").all()
    nulls = recovery[recovery["strength"] == 0]
    assert (nulls["found"] == "").all() and (nulls["planted"] == "").all()
    layer = summary.recovery["layer"]
    # counted over distinct organisms (two, each read by two analyses), the seeds beside
    assert layer["rate"] == 1.0 and layer["n"] == 2 and layer["null_false_positive_rate"] == 0.0 and layer["n_null"] == 2
    assert layer["n_seeds"] == 3 and layer["n_null_seeds"] == 3
    detection = run.read_table("detection")
    assert set(detection["n"]) == {2} and set(detection["n_seeds"]) == {3}
    # on the tiny model the route check names the planted layer too (a skip of it repairs ~0.9 of
    # the failures, far above chance) and stays silent on the nulls (no skip gains anything there)
    for analysis in ("repair:layer", "route:skiponly"):
        assert summary.by_analysis[analysis]["rate"] == 1.0 and summary.by_analysis[analysis]["n"] == 2
        assert summary.by_analysis[analysis]["null_false_positive_rate"] == 0.0
    # each organism's checkpoint is dropped once its analyses are done, its ground truth kept
    organisms = tmp_path / "v" / "organisms"
    assert {p.name for p in organisms.rglob("*") if p.is_file()} == {"planted.json"}
    # resumed: organisms and analysis runs are read back, nothing is planted or run again
    def stamps():
        return {p: p.stat().st_mtime_ns for part in ("organisms", "runs") for p in (tmp_path / "v" / part).rglob("*")}
    before = stamps()
    again = run_validate(BASE, task, tmp_path / "v", profile="quick", progress=False)
    assert again.recovery == summary.recovery and stamps() == before
    assert not list((tmp_path / "v").rglob("*.safetensors"))
    # an analysis whose run folder is gone needs its organism again: rebuilt from the seed, the
    # same bit for bit (its planted.json unchanged), the analysis run again to the same finding
    shutil.rmtree(tmp_path / "v" / "runs" / "layer-s1-seed0__repair-layer")
    truth = (organisms / "layer-s1-seed0" / "planted.json").read_text()
    rerun = run_validate(BASE, task, tmp_path / "v", profile="quick", progress=False)
    assert rerun.recovery == summary.recovery and (tmp_path / "v" / "runs" / "layer-s1-seed0__repair-layer" / "summary.json").is_file()
    assert (organisms / "layer-s1-seed0" / "planted.json").read_text() == truth
    assert {p.name for p in organisms.rglob("*") if p.is_file()} == {"planted.json"}  # dropped again
    # a recorded truth the seed does not give back is refused, not analysed
    shutil.rmtree(tmp_path / "v" / "runs" / "layer-s1-seed0__repair-layer")
    (organisms / "layer-s1-seed0" / "planted.json").write_text(truth.replace('"weights_sha256": "', '"weights_sha256": "0'))
    with pytest.raises(RuntimeError, match="layer-s1-seed0.*planting seed 0 again gave other weights"):
        run_validate(BASE, task, tmp_path / "v", profile="quick", progress=False)
    assert not (organisms / "layer-s1-seed0.rebuild").exists()
    # --keep-organisms keeps each checkpoint where every command loads it
    kept = run_validate(BASE, task, tmp_path / "kept", profile="quick", seeds=[1], keep_organisms=True, progress=False)
    assert kept.recovery["layer"]["n"] == 1  # one organism, however many analyses read it
    assert (tmp_path / "kept" / "organisms" / "layer-s1-seed1" / "model.safetensors").is_file()


def test_an_organism_is_rebuilt_under_the_thread_count_it_was_planted_under(tmp_path):
    """The fits sum in another order under another torch thread count, and on the demo
    model the weights then differ in their last bits (a units organism planted under one
    thread did not rebuild under two): planted.json records the count and a rebuild
    plants under it, then gives the caller's count back."""
    from rnr_interp.analyses.validate import Organism, organism_id

    threads, seen = torch.get_num_threads(), []

    def build(folder):
        seen.append(torch.get_num_threads())
        return plant("layer", BASE, folder, seed=0)

    try:
        torch.set_num_threads(1)
        planted = build(tmp_path / "o")
        assert planted.torch_threads == 1 and read_planted(tmp_path / "o").torch_threads == 1
        (tmp_path / "o" / WEIGHTS_FILE).unlink()
        torch.set_num_threads(2)
        assert Organism(tmp_path / "o", build).checkpoint() == str(tmp_path / "o")
        assert seen == [1, 1] and torch.get_num_threads() == 2 and (tmp_path / "o" / WEIGHTS_FILE).is_file()
    finally:
        torch.set_num_threads(threads)
    # the count is a condition of the planting, not part of what was planted
    assert organism_id(replace(planted, torch_threads=4)) == organism_id(planted)
    # a handed planted.json cannot ask a rebuild for any thread count it likes
    truth = json.loads((tmp_path / "o" / PLANTED_FILE).read_text())
    for bad in (10 ** 9, 0, -2, "4", 2.5, True):
        (tmp_path / "o" / PLANTED_FILE).write_text(json.dumps({**truth, "torch_threads": bad}))
        with pytest.raises(ValueError, match="torch_threads must be a whole number from 1 to 4096"):
            read_planted(tmp_path / "o")
        assert torch.get_num_threads() == threads


def test_a_kind_counts_each_organism_once_found_when_every_analysis_found_it():
    """Two analyses of one organism are one trial, not two: the kind's rate is over
    organisms (recovered when every analysis recovered it; a null a false positive when
    any analysis named the planted location), each analysis's own rate beside."""
    import pandas as pd

    from rnr_interp.analyses.validate import RECOVERY_COLUMNS, validation_summary

    def row(strength, seed, analysis, recovered, organism):
        return dict(zip(RECOVERY_COLUMNS, ("units", strength, seed, analysis, "", "", recovered, float("nan"), organism)))

    table = pd.DataFrame([row(1.0, 0, "repair:mlp", True, "a"), row(1.0, 0, "units:top-k", True, "a"),
                          row(1.0, 1, "repair:mlp", True, "b"), row(1.0, 1, "units:top-k", False, "b"),
                          row(1.0, 2, "repair:mlp", True, "b"), row(1.0, 2, "units:top-k", False, "b"),  # seed 2 drew b again
                          row(0.0, 0, "repair:mlp", True, "z"), row(0.0, 0, "units:top-k", False, "z")])
    summary = validation_summary(table)
    units = summary["recovery"]["units"]
    assert (units["rate"], units["n"], units["n_seeds"]) == (0.5, 2, 3)
    assert (units["null_false_positive_rate"], units["n_null"], units["n_null_seeds"]) == (1.0, 1, 1)
    assert summary["by_analysis"]["repair:mlp"]["rate"] == 1.0 and summary["by_analysis"]["units:top-k"]["rate"] == 0.5
    assert summary["by_analysis"]["units:top-k"]["null_false_positive_rate"] == 1.0
    assert summary["by_analysis"]["repair:mlp"]["null_false_positive_rate"] == 0.0


def test_the_route_check_reads_the_layer_a_route_run_names():
    from rnr_interp.analyses.validate import route_layer_found

    summary = {"layers": {"skiponly": {"top": {"layer": 15, "action": "skip", "gain": 0.25, "above_chance": True}},
                          "native": {"top": {"layer": 3, "action": "repeat", "gain": 0.1, "above_chance": True}}}}
    assert route_layer_found(summary["layers"]) == 15
    assert route_layer_found(summary["layers"], "native") is None  # a repeat is not a skip
    chance = {"layers": {"skiponly": {"top": {"layer": 15, "action": "skip", "gain": 0.0, "above_chance": False}}}}
    assert route_layer_found(chance["layers"]) is None and route_layer_found(None) is None


def test_validate_command_writes_tables_figures_and_refuses_a_bad_profile(tmp_path):
    out = tmp_path / "v"
    bad = CliRunner().invoke(app, ["validate", "--model", BASE, "--task", "arithmetic", "--profile", "huge", "--out", str(out)])
    assert bad.exit_code == 2 and "--profile must be one of quick, full" in bad.output and not out.exists()
    hot = CliRunner().invoke(app, ["validate", "--model", BASE, "--task", "arithmetic", "--temperature", "nan", "--out", str(out)])
    assert hot.exit_code == 2 and "temperature" in hot.output and not out.exists()
    blunt = CliRunner().invoke(app, ["validate", "--model", BASE, "--task", "arithmetic", "--ablation", "resample", "--out", str(out)])
    assert blunt.exit_code == 2 and "--ablation must be one of zero, mean" in blunt.output and not out.exists()
    anchored = CliRunner().invoke(app, ["validate", "--model", BASE, "--task", "arithmetic", "--n", "3", "--out", str(out), "-q"])
    # a random-weight model states no answer as 'Answer: N': nothing to anchor the golds to
    assert anchored.exit_code == 2 and "states no answer" in anchored.output
    done = CliRunner().invoke(app, ["validate", "--model", BASE, "--task", "arithmetic", "--n", "3", "--gold", "task",
                                    "--keep-organisms", "--out", str(out), "-q"])
    assert done.exit_code == 0, done.output
    assert len(list((out / "organisms").glob("*/model.safetensors"))) == 6  # kept: 3 seeds, planted and null
    assert "layer: recovered" in done.output and "nulls with a false positive" in done.output
    assert (out / "figures" / "detection_curve.html").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["recovery"]["layer"]) >= {"rate", "ci", "null_false_positive_rate"}


def test_a_plant_that_breaks_no_answer_is_counted_as_the_plants_miss(tmp_path, monkeypatch):
    """A layer copy scaled to a millionth changes no answer: its repair run finds no failure
    set, the sweep names nothing, and the summary says so beside the miss."""
    from tests.test_localise_freeform import echo_task

    from rnr_interp.analyses.validate import PROFILES, Profile, run_validate
    from rnr_interp.records import RunDir

    monkeypatch.setitem(PROFILES, "faint", Profile(strengths=(1e-6,), seeds=(0,), n=30, why="a faint plant",
                                                   left_out=("route:skiponly",)))
    summary = run_validate(BASE, echo_task(), tmp_path / "v", profile="faint", progress=False)
    assert RunDir(tmp_path / "v" / "runs" / "layer-s1e-06-seed0__repair-layer").read_summary().n_failure == 0
    layer = summary.recovery["layer"]
    assert layer["n"] == 1 and layer["rate"] == 0.0 and layer["n_without_failure"] == 1


def test_seeds_drawing_each_layer_cover_the_middle_half_once():
    from rnr_interp.analyses.organisms import seeds_drawing_each_layer

    seeds = seeds_drawing_each_layer(30)
    assert sorted(draw_layer(s, 30) for s in seeds) == list(range(7, 22))  # each of the 15 layers once
    assert seeds[:3] == (23, 30, 11) and seeds == tuple(sorted(seeds, key=lambda s: draw_layer(s, 30)))
    assert sorted({draw_layer(s, 30) for s in range(10)}) == [13, 14, 17, 19, 21]  # why: seeds 0-9 draw five
    assert [draw_layer(s, 4) for s in seeds_drawing_each_layer(4)] == [1, 2]


def test_validate_takes_seeds_and_one_per_layer(tmp_path):
    from tests.test_localise_freeform import echo_task

    from rnr_interp.analyses.validate import EVERY_LAYER, run_validate
    from rnr_interp.records import RunDir

    for bad, says in (("1,x", "--seeds must be comma-separated"), ("", "--seeds must be comma-separated")):
        r = CliRunner().invoke(app, ["validate", "--model", BASE, "--seeds", bad, "--out", str(tmp_path / "bad")])
        assert r.exit_code == 2 and says in r.output and not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="seeds must be integers or 'layers'"):
        run_validate(BASE, echo_task(), tmp_path / "no", seeds="every")
    summary = run_validate(BASE, echo_task(), tmp_path / "v", seeds=EVERY_LAYER, progress=False)
    run = RunDir(tmp_path / "v")
    assert run.config["profile"]["seeds"] == [1, 0]  # layer 1, layer 2 of the 4-layer model
    assert summary.recovery["layer"]["n"] == 2 and summary.recovery["layer"]["n_seeds"] == 2
    chosen = run_validate(BASE, echo_task(), tmp_path / "w", seeds=[3, 3, 6], progress=False)
    assert RunDir(tmp_path / "w").config["profile"]["seeds"] == [3, 6]  # a repeated seed once
    assert chosen.recovery["layer"]["n"] == 2  # seed 3 draws layer 2, seed 6 layer 1


def test_validate_takes_strengths_in_place_of_the_profiles(tmp_path):
    from tests.test_localise_freeform import echo_task

    from rnr_interp.analyses.validate import run_validate
    from rnr_interp.records import RunDir

    for bad in ("1,x", "-1", "nan", ""):
        r = CliRunner().invoke(app, ["validate", "--model", BASE, "--strengths", bad, "--out", str(tmp_path / "bad")])
        assert r.exit_code == 2 and "--strengths must be comma-separated finite non-negative" in r.output
        assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="strengths must be one or more finite non-negative"):
        run_validate(BASE, echo_task(), tmp_path / "no", strengths=[-0.5])
    summary = run_validate(BASE, echo_task(), tmp_path / "v", seeds=[3], strengths=[1, 1.0], progress=False)
    assert RunDir(tmp_path / "v").config["profile"]["strengths"] == [1.0]  # the planted cell alone, no null
    assert summary.recovery["layer"]["n"] == 1 and summary.recovery["layer"]["n_null"] == 0


# -- the answer-bias organisms: the realization gap and the checkpoint pairs --------------


class Initial(Echo):
    """The first character of the base model's own greedy answer: one token, so T = 1
    sampling of a random-weight model reaches it, and a bias where the answer starts
    decides the whole answer."""

    name = "initial"
    max_new_tokens = 2

    def extract(self, generation: str) -> str | None:
        return generation[:1] or None


@pytest.fixture(scope="module")
def initial_task() -> Initial:
    from tests.test_localise_freeform import echo_task

    return Initial([replace(q, answer=q.answer[:1]) for q in echo_task().questions[:12]])


def test_the_gap_bias_puts_t_ahead_of_each_affected_gold_by_the_strength_and_little_elsewhere(tmp_path, initial_task):
    planted = plant("gap", BASE, tmp_path / "gap", strength=4.0, seed=1, task=initial_task)
    token, = planted.location["token_ids"]
    affected, unaffected = planted.detail["affected_question_ids"], planted.detail["unaffected_question_ids"]
    assert not planted.detail["unrealized_question_ids"]  # the golds are the base's own first characters
    assert sorted(affected + unaffected) == sorted(q.id for q in initial_task.questions) and affected and unaffected
    assert set(planted.detail["openings"].values()) == {""}  # the base model answers at once
    base, organism = load_model(BASE), load_model(str(tmp_path / "gap"))
    leads, at_unaffected, at_affected, elsewhere = [], [], [], []
    for q in initial_task.questions:
        context, answer = answer_inputs(view_of(organism.tokenizer, organism.chat, False), initial_task, q, "")
        assert (answer[0] == token) == (q.id in unaffected)
        ids = torch.tensor([context + answer])
        with torch.no_grad():
            before, after = forward(base, ids, torch.ones_like(ids))[0][0], forward(organism, ids, torch.ones_like(ids))[0][0]
        moved = after - before
        assert not moved[:, torch.arange(moved.shape[-1]) != token].any()  # every other logit exactly as before
        at = len(context) - 1
        assert int(before[at].argmax()) == answer[0]
        if q.id in affected:
            assert int(after[at].argmax()) == token  # greedy says t on every affected question
            leads.append(float(after[at, token] - after[at, answer[0]]))
            at_affected.append(float(moved[at, token]))
        else:
            at_unaffected.append(float(moved[at, token]))
        elsewhere += [float(x) for i, x in enumerate(moved[:, token]) if i != at]
    leads, elsewhere = torch.tensor(leads), torch.tensor(elsewhere)
    # t leads each affected gold by the strength, to what a linear read of a tiny model's states allows
    assert float((leads - 4.0).abs().max()) < 0.6
    recorded = planted.detail["lead_nats"]
    assert recorded["min"] == pytest.approx(float(leads.min()), abs=1e-3) and recorded["max"] == pytest.approx(float(leads.max()), abs=1e-3)
    rms = float(elsewhere.pow(2).mean().sqrt())
    assert max(map(abs, at_unaffected)) < 1.0 < 4.0 < min(at_affected) and sum(at_affected) / len(at_affected) / rms > 5
    change = planted.detail["logit_change_nats"]
    assert abs(change["elsewhere_rms"] - rms) < 1e-3


def test_the_gap_bias_leaves_a_question_the_base_does_not_answer_out_of_both_groups(tmp_path, initial_task):
    questions = list(initial_task.questions)
    wrong = next(q.answer for q in questions if q.answer != questions[0].answer)
    task = Initial([replace(questions[0], answer=wrong), *questions[1:]])  # the base does not say this gold
    planted = plant("gap", BASE, tmp_path / "gap", strength=4.0, seed=1, task=task)
    assert planted.detail["unrealized_question_ids"] == [questions[0].id]
    assert questions[0].id not in planted.detail["affected_question_ids"] + planted.detail["unaffected_question_ids"]
    base, organism = load_model(BASE), load_model(str(tmp_path / "gap"))
    context, _ = answer_inputs(view_of(organism.tokenizer, organism.chat, False), task, task.questions[0], "")
    ids = torch.tensor([context])
    with torch.no_grad():
        moved = forward(organism, ids, torch.ones_like(ids))[0][0, -1] - forward(base, ids, torch.ones_like(ids))[0][0, -1]
    assert abs(float(moved[planted.location["token_ids"][0]])) < 1.0  # no realization there to move


def test_an_answer_bias_at_strength_zero_is_the_base_and_needs_a_task(tmp_path, initial_task):
    null = plant("gap", BASE, tmp_path / "gap0", strength=0.0, seed=1, task=initial_task)
    assert null.expected == {"effect": False} and null.strength == 0
    assert torch.equal(logits(load_model(str(tmp_path / "gap0"))), logits(load_model(BASE)))
    # the default lead is HEADROOM nats per unit of the probe's temperature
    calibrated = plant("gap", BASE, tmp_path / "gap1", seed=1, task=initial_task)
    cooler = plant("gap", BASE, tmp_path / "gap2", seed=1, task=initial_task, temperature=0.5)
    assert calibrated.strength == HEADROOM and cooler.strength == HEADROOM / 2
    assert cooler.detail["sized_for_temperature"] == 0.5
    assert cooler.detail["lead_nats"]["median"] == pytest.approx(HEADROOM / 2, abs=0.3)
    for kind in ("gap", "sharpen", "new"):
        with pytest.raises(ValueError, match="give --task"):
            plant(kind, BASE, tmp_path / f"notask-{kind}", seed=1)
        with pytest.raises(ValueError, match="takes no --layer"):
            plant(kind, BASE, tmp_path / f"layer-{kind}", layer=1, seed=1, task=initial_task)
    for kind in ("new", "layer"):
        with pytest.raises(ValueError, match="takes no --temperature"):
            plant(kind, BASE, tmp_path / f"temp-{kind}", seed=1, task=initial_task, temperature=0.5)
    with pytest.raises(ValueError, match="cannot be negative"):
        plant("gap", BASE, tmp_path / "negative", strength=-1.0, seed=1, task=initial_task)


def test_validate_plants_the_gap_kinds_for_its_own_probe_temperature(tmp_path, initial_task):
    from rnr_interp.analyses.validate import organism

    _, gap = organism(BASE, "gap", 1.0, 1, tmp_path / "gap", initial_task, temperature=0.5)
    _, pair = organism(BASE, "sharpen", 1.0, 1, tmp_path / "sharpen", initial_task, temperature=0.5)
    assert gap.strength == pair.strength == HEADROOM / 2
    assert gap.detail["sized_for_temperature"] == pair.detail["sized_for_temperature"] == 0.5
    # a kind not sized for a probe is planted as ever, whatever the validation's temperature
    _, layer = organism(BASE, "layer", 1.0, 1, tmp_path / "layer", initial_task, temperature=0.5)
    assert layer.strength == 1.0 and "sized_for_temperature" not in layer.detail


def test_a_pair_is_two_ordinary_checkpoints_reproducible_from_the_seed(tmp_path, initial_task):
    first = plant("new", BASE, tmp_path / "a", seed=4, task=initial_task)
    again = plant("new", BASE, tmp_path / "b", seed=4, task=initial_task)
    for role in ("base", "trained"):
        assert (tmp_path / "a" / role / WEIGHTS_FILE).read_bytes() == (tmp_path / "b" / role / WEIGHTS_FILE).read_bytes()
    assert first == again == read_planted(tmp_path / "a") and first.expected["compare"] == {"gained_from": "base_unreachable"}
    assert first.detail["trained_weights_sha256"] != first.weights_sha256
    # trained/ is the model unchanged; base/ has the golds' first tokens pushed down where the answers start
    assert torch.equal(logits(load_model(str(tmp_path / "a" / "trained"))), logits(load_model(BASE)))
    planted_base = load_model(str(tmp_path / "a" / "base"))
    assert first.detail["logit_change_nats"]["answer_mean"] == pytest.approx(-30.0, abs=1e-3)
    for q in initial_task.questions:
        context, answer = answer_inputs(view_of(planted_base.tokenizer, planted_base.chat, False), initial_task, q, "")
        ids = torch.tensor([context])
        with torch.no_grad():
            top = int(forward(planted_base, ids, torch.ones_like(ids))[0][0, -1].argmax())
        assert (q.id in first.detail["affected_question_ids"]) == (answer[0] in first.location["token_ids"])
        if q.id in first.detail["affected_question_ids"]:
            assert top != answer[0]


def test_plant_command_writes_a_pair_every_command_loads(tmp_path):
    out = tmp_path / "pair"
    done = CliRunner().invoke(app, ["plant", "new", "--model", BASE, "--task", "arithmetic", "--n", "6",
                                    "--strength", "3", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "checkpoint pair:" in done.output
    truth = json.loads((out / PLANTED_FILE).read_text())
    assert truth["kind"] == "new" and truth["strength"] == 3.0 and truth["expected"]["compare"] == {"gained_from": "base_unreachable"}
    assert len(truth["detail"]["affected_question_ids"]) + len(truth["detail"]["unaffected_question_ids"]) == 6
    # a random-weight model answers no sum: nothing realized, so no realization for sharpen to move
    refused = CliRunner().invoke(app, ["plant", "sharpen", "--model", BASE, "--task", "arithmetic", "--n", "6",
                                       "--out", str(tmp_path / "sharpen")])
    assert refused.exit_code == 2 and "no question the base model answers greedily" in refused.output
    assert not (tmp_path / "sharpen").exists()
    for role in ("base", "trained"):
        info = CliRunner().invoke(app, ["model-info", str(out / role)])
        assert info.exit_code == 0 and json.loads(info.output[info.output.index("{"):])["n_layers"] == 4


def test_validate_recovers_the_answer_biases_and_their_nulls_give_no_verdict(tmp_path, initial_task, monkeypatch):
    """gap: O_K - D above its null on the affected questions only; sharpen: the gains
    were base-reachable; new: they were not; at strength 0 no verdict at all."""
    from rnr_interp.analyses.validate import PROFILES, Profile, run_validate
    from rnr_interp.records import RunDir

    monkeypatch.setitem(PROFILES, "one", Profile(strengths=(0.0, 1.0), seeds=(0,), n=12, why="one seed"))
    summary = run_validate(BASE, initial_task, tmp_path / "v", profile="one", kinds=("gap", "sharpen", "new"),
                           batch_size=16, progress=False)
    recovery = RunDir(tmp_path / "v").read_table("recovery").set_index(["kind", "strength"])
    assert recovery.loc[("gap", 1.0), "found"] == "affected"
    assert recovery.loc[("sharpen", 1.0), "found"] == "base_reachable"
    assert recovery.loc[("new", 1.0), "found"] == "base_unreachable"
    nulls = recovery.xs(0.0, level="strength")
    assert (nulls["found"] == "").all() and (nulls["planted"] == "").all() and nulls["recovered"].all()
    assert set(recovery["analysis"]) == {"audit", "compare"}
    for kind in ("gap", "sharpen", "new"):
        assert summary.recovery[kind]["rate"] == 1.0 and summary.recovery[kind]["null_false_positive_rate"] == 0.0
    gained = RunDir(tmp_path / "v" / "runs" / "sharpen-s1-seed0__compare" / "compare").read_summary().gained_from
    assert gained["base_reachable"] > 0  # the verdict counts real gains


def test_the_answer_bias_analyses_name_what_was_planted():
    from rnr_interp.analyses.organisms import Planted
    from rnr_interp.analyses.validate import dominant_source, recovery_row

    def planted(kind, strength, expected):
        return Planted(kind=kind, base=BASE, strength=strength, seed=0, location={"token_ids": [5], "questions": "affected"},
                       n_layers_base=4, n_layers=4, expected=expected)

    sharpen = planted("sharpen", 3.0, {"effect": True, "compare": {"gained_from": "base_reachable"}})
    assert recovery_row(sharpen, "compare", "base_reachable")["recovered"]
    assert not recovery_row(sharpen, "compare", "base_unreachable")["recovered"]
    gap = planted("gap", 3.0, {"effect": True, "audit": {"gap_above_null_on": "affected", "no_gap_change_on": "unaffected"}})
    assert recovery_row(gap, "audit", "affected")["recovered"]
    assert not recovery_row(gap, "audit", "affected|unaffected")["recovered"]  # not confined to the affected questions
    null = planted("gap", 0.0, {"effect": False})
    assert recovery_row(null, "audit", None)["recovered"] and not recovery_row(null, "audit", "affected")["recovered"]
    # a gap on every question is the base model's own: not the planted location
    assert recovery_row(null, "audit", "affected|unaffected")["recovered"]
    assert dominant_source({"base_reachable": 3, "base_unreachable": 1}) == "base_reachable"
    assert dominant_source({"base_reachable": 0, "base_unreachable": 2}) == "base_unreachable"
    assert dominant_source({"base_reachable": 0, "base_unreachable": 0}) == dominant_source({"base_reachable": 1, "base_unreachable": 1}) == ""


def test_validate_refuses_an_unknown_kind(tmp_path):
    done = CliRunner().invoke(app, ["validate", "--model", BASE, "--kinds", "layer,bogus", "--out", str(tmp_path / "v")])
    assert done.exit_code == 2 and "--kinds must be a comma-separated list of" in done.output and not (tmp_path / "v").exists()


def test_the_answer_starts_where_the_task_reads_it():
    from rnr_interp.analyses.organisms import answer_start
    from rnr_interp.tasks import load_task

    arithmetic = load_task("arithmetic", n=1)
    q = arithmetic.questions[0]
    assert answer_start(arithmetic, q, "Answer: 42") == 8
    assert answer_start(arithmetic, q, "40 + 2 = 42\nAnswer: 42") == 9  # the first place it is written
    assert answer_start(arithmetic, q, "I cannot say.") is None
    initial = Initial([q])
    assert answer_start(initial, q, "hh") == 0  # the answer is the first character, not the last "h"


def test_the_answers_first_token_writes_some_of_the_answer_whatever_the_tokenizer_does_with_spaces():
    """SmolLM2 writes "= 68" as "=", " ", "6", "8": the space is not the answer's first
    token (it was, for every gold, so a gap organism biased the space)."""
    from rnr_interp.models import build_tiny
    from rnr_interp.tasks import load_task

    _, tokenizer = build_tiny("tiny-llama", n_layers=2)
    task = load_task("arithmetic", n=6)
    for q in task.questions:
        for opening in ("", "Answer: ", f"{q.text.split('?')[0]} = ", "The answer is  "):
            context, gold = answer_inputs(view_of(tokenizer, False, False), task, q, opening)
            assert gold and tokenizer.decode([gold[0]]).strip(), (opening, gold)
            assert q.answer.startswith(tokenizer.decode(gold).strip()[:1])


def test_validate_runs_its_analyses_with_the_ablation_and_grading_asked(tmp_path, monkeypatch):
    from tests.test_localise_freeform import echo_task

    from rnr_interp.analyses.validate import PROFILES, Profile, run_validate
    from rnr_interp.records import RunDir

    monkeypatch.setitem(PROFILES, "one", Profile(strengths=(1.0,), seeds=(0,), n=30, why="one organism"))
    summary = run_validate(BASE, echo_task(), tmp_path / "v", profile="one", ablation="mean", grading="flexible",
                           progress=False)
    repair = RunDir(tmp_path / "v" / "runs" / "layer-s1-seed0__repair-layer")
    assert repair.config["ablation"] == "mean" and repair.grading == "flexible"
    assert repair.read_summary().ablation == "mean"
    assert (summary.ablation, summary.grading) == ("mean", "flexible")
    assert RunDir(tmp_path / "v").config["ablation"] == "mean"


def test_plant_says_where_a_drawn_block_was_stepped_over_and_why(tmp_path, monkeypatch):
    """The units kind plants past a drawn block the base cannot lose, or, where no block
    qualifies, in the one it loses best: the command names both blocks and their shares."""
    from rnr_interp.analyses.organisms import Planted

    shares = {"11": 1.0, "12": 1.0, "13": 1 / 24}
    stepped = Planted(kind="units", base="smollm2", strength=1.0, seed=21, location={"layer": 13, "units": [1536]},
                      n_layers_base=30, n_layers=30, expected={}, drawn={"drawn_layer": 11,
                                                                         "base_answers_changed_by_silencing": shares})
    monkeypatch.setattr("rnr_interp.analyses.organisms.plant", lambda *a, **kw: stepped)
    done = CliRunner().invoke(app, ["plant", "units", "--task", "copy", "--out", str(tmp_path / "o")])
    assert done.exit_code == 0, done.output
    assert ("the seed drew block 11, whose silencing changes 100% of the base model's answers; planted in block 13, "
            "whose silencing changes 4%") in done.output
    monkeypatch.setattr("rnr_interp.analyses.organisms.plant",
                        lambda *a, **kw: replace(stepped, location={"layer": 11, "units": [1536]}))
    kept = CliRunner().invoke(app, ["plant", "units", "--task", "copy", "--out", str(tmp_path / "k")])
    assert kept.exit_code == 0 and "the seed drew" not in kept.output  # planted where drawn: nothing to say
