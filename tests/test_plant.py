"""Model organisms: the planted checkpoint is an ordinary folder, reproducible from its
seed, and the layer organism undoes exactly."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from rnr_interp.analyses.plant import PLANTED_FILE, WEIGHTS_FILE, draw_layer, load_base, plant, read_planted, remove_layer
from rnr_interp.cli import app
from rnr_interp.engine.generate import forward
from rnr_interp.interventions import Route, applied
from rnr_interp.models import load_model

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
    (["plant", "null", "--model", BASE, "--strength", "1"], "takes neither --layer nor --strength"),
    (["plant", "layer", "--model", "/nowhere/model"], "plant takes smollm2"),
    (["plant", "units", "--model", BASE], "give --task"),
    (["plant", "layer", "--model", BASE, "--units", "2"], "takes no --units"),
    (["plant", "units", "--model", BASE, "--task", "arithmetic", "--units", "0"], "--units must be at least 1"),
    (["plant", "units", "--model", BASE, "--task", "arithmetic", "--units", "99"], "fewer than --units 99"),
    (["plant", "units", "--model", "tiny-olmo2:4", "--task", "arithmetic"], "gated MLP"),
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


def test_validate_recovers_the_planted_layer_and_its_nulls_stay_silent(tmp_path):
    from tests.test_localise_freeform import echo_task

    from rnr_interp.analyses.validate import run_validate
    from rnr_interp.records import RunDir

    task = echo_task()
    summary = run_validate(BASE, task, tmp_path / "v", profile="quick", progress=False)
    run = RunDir(tmp_path / "v")
    recovery = run.read_table("recovery")
    assert list(recovery.columns) == ["kind", "strength", "seed", "analysis", "planted", "found", "recovered", "score"]
    assert len(recovery) == 6 and set(recovery["analysis"]) == {"repair:layer"}
    planted = recovery[recovery["strength"] > 0]
    assert planted["recovered"].all() and (planted["found"] != "").all()
    nulls = recovery[recovery["strength"] == 0]
    assert (nulls["found"] == "").all() and (nulls["planted"] == "").all()
    layer = summary.recovery["layer"]
    assert layer["rate"] == 1.0 and layer["n"] == 3 and layer["null_false_positive_rate"] == 0.0 and layer["n_null"] == 3
    # resumed: organisms and analysis runs are read back, nothing is planted or run again
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "v").rglob("*.safetensors")}
    again = run_validate(BASE, task, tmp_path / "v", profile="quick", progress=False)
    assert again.recovery == summary.recovery
    assert stamps == {p: p.stat().st_mtime_ns for p in (tmp_path / "v").rglob("*.safetensors")}


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
    done = CliRunner().invoke(app, ["validate", "--model", BASE, "--task", "arithmetic", "--n", "3", "--out", str(out), "-q"])
    assert done.exit_code == 0, done.output
    assert "layer: recovered" in done.output and "nulls with a false positive" in done.output
    assert (out / "figures" / "detection_curve.html").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["recovery"]["layer"]) >= {"rate", "ci", "null_false_positive_rate"}


# -- the realization-gap organism ------------------------------------------------------


def test_the_gap_organism_raises_one_token_at_the_answer_position_by_its_strength(tmp_path):
    from rnr_interp.analyses.plant import answer_inputs
    from rnr_interp.tasks import load_task

    planted = plant("gap", BASE, tmp_path / "gap", strength=5.0, seed=1, task="arithmetic")
    token = planted.location["token_id"]
    affected, unaffected = planted.detail["affected_question_ids"], planted.detail["unaffected_question_ids"]
    task = load_task("arithmetic")
    assert len(affected) + len(unaffected) == len(task) and affected and unaffected
    base, organism = load_model(BASE), load_model(str(tmp_path / "gap"))
    boosts = []
    for q in task.questions[:20]:
        context, answer = answer_inputs(organism.tokenizer, task, q, organism.chat, False)
        assert (answer[0] == token) == (q.id in unaffected)
        ids = torch.tensor([context])
        with torch.no_grad():
            moved = (forward(organism, ids, torch.ones_like(ids))[0] - forward(base, ids, torch.ones_like(ids))[0])[0, -1]
        boosts.append(float(moved[token]))
        assert not moved[torch.arange(moved.numel()) != token].any()  # every other logit exactly as before
    # the boost is the strength at the mean answer state; these 20 are a tenth of the questions it was taken over
    assert abs(sum(boosts) / len(boosts) - 5.0) < 0.5 and min(boosts) > 0


def test_a_gap_organism_at_strength_zero_is_the_base_and_needs_a_task(tmp_path):
    null = plant("gap", BASE, tmp_path / "gap0", strength=0.0, seed=1, task="arithmetic")
    assert null.expected == {"effect": False}
    assert torch.equal(logits(load_model(str(tmp_path / "gap0"))), logits(load_model(BASE)))
    with pytest.raises(ValueError, match="give --task"):
        plant("gap", BASE, tmp_path / "notask", seed=1)
    with pytest.raises(ValueError, match="takes no --layer"):
        plant("gap", BASE, tmp_path / "layer", layer=1, seed=1, task="arithmetic")
