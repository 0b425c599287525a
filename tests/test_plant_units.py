"""The units organism: k units added to one MLP that push each answer off the base
model's own first answer token. Reproducible from its seed, the base exactly when its
units are silenced or its strength is 0, content-dependent, and found by the ordinary
localisation commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from rnr_interp.analyses.plant import PLANTED_FILE, WEIGHTS_FILE, draw_layer, load_base, plant
from rnr_interp.cli import app
from rnr_interp.engine.rows import Row, generate_rows
from rnr_interp.engine.sampling import deployed_decoding
from rnr_interp.interventions import AblateUnits, applied, decoder_blocks
from rnr_interp.models import load_model
from tests.test_localise_freeform import echo_task
from tests.test_plant import logits

BASE = "tiny-llama:4"


@pytest.fixture(scope="module")
def echo():
    return echo_task()


def answers(lm, task) -> list[str | None]:
    gens = generate_rows(lm, task, [Row(q, (), "deployed") for q in task.questions], deployed_decoding(task))
    return [task.extract(g.text) for g in gens]


def test_a_units_organism_is_reproducible_from_its_seed(tmp_path, echo):
    first = plant("units", BASE, tmp_path / "a", task=echo, seed=4)
    again = plant("units", BASE, tmp_path / "b", task=echo, seed=4)
    assert (tmp_path / "a" / WEIGHTS_FILE).read_bytes() == (tmp_path / "b" / WEIGHTS_FILE).read_bytes()
    assert first == again and first.task == "echo" and first.location["layer"] == draw_layer(4, 4)
    assert first.expected["units"] == {"layer": first.location["layer"], "units": [128, 129, 130]}  # appended after 128
    assert first.expected["repair"] == {"component": "mlp", "layers": [first.location["layer"]]}
    assert len(first.detail["direction"]) == 64 and abs(torch.tensor(first.detail["direction"]).norm() - 1) < 1e-5


def test_silencing_the_planted_units_or_strength_zero_gives_back_the_base_exactly(tmp_path, echo):
    planted = plant("units", BASE, tmp_path / "u", task=echo, layer=2, seed=0)
    organism, base = load_model(str(tmp_path / "u")), load_model(BASE)
    prompt = echo.user_message(echo.questions[0])
    assert not torch.equal(logits(organism, prompt), logits(base, prompt))  # the units act at the answer start
    with applied(organism, [AblateUnits(2, planted.location["units"])]):
        assert torch.equal(logits(organism, prompt), logits(base, prompt))
    null = plant("units", BASE, tmp_path / "u0", task=echo, layer=2, seed=0, strength=0.0)
    assert null.expected == {"effect": False}
    assert torch.equal(logits(load_model(str(tmp_path / "u0")), prompt), logits(base, prompt))
    # every original weight is kept: the planted folder differs from the base only in the appended units
    theirs, ours = load_base(BASE)[0].state_dict(), load_base(str(tmp_path / "u"))[0].state_dict()
    grown = set()
    for name, weight in theirs.items():
        assert torch.equal(ours[name][tuple(slice(0, n) for n in weight.shape)], weight), name
        if ours[name].shape != weight.shape:
            grown.add(name)
            appended = ours[name].abs().sum() - weight.abs().sum()
            assert (appended > 0) == name.startswith("model.layers.2."), name  # zero units in the other blocks
    assert grown == {f"model.layers.{i}.mlp.{p}_proj.weight" for i in range(4) for p in ("gate", "up", "down")}


def test_the_units_push_each_answer_off_its_own_first_token_and_leave_recognition_alone(tmp_path, echo):
    from rnr_interp.analyses.localise.recognition import gold_first, recognize

    planted = plant("units", BASE, tmp_path / "u", task=echo, layer=2, seed=0)
    base, organism = load_model(BASE), load_model(str(tmp_path / "u"))
    before, after = answers(base, echo), answers(organism, echo)
    affected = set(planted.detail["affected_question_ids"])
    assert len(affected) >= 10 and set(planted.detail["unaffected_question_ids"])
    for q, was, now in zip(echo.questions, before, after):
        assert was == q.answer  # the echo task's golds are the base's own answers
        if q.id in affected:
            assert now != q.answer and (now or "")[:1] != q.answer[:1]  # its first token is avoided
        else:
            assert now == q.answer
    # content, not one favourite token: the new answers start in many ways
    assert len({(now or "")[:1] for q, now in zip(echo.questions, after) if q.id in affected}) >= 4
    # the answer statements recognition ranks are read as before (the screen's readout)
    recognised = [gold_first(recognize(lm, echo, echo.questions, variants=("answer",)), "answer") for lm in (base, organism)]
    assert len(recognised[0] ^ recognised[1]) <= 1 and len(recognised[0]) >= 5
