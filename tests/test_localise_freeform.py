"""Localisation on free-form tasks: recognition ranks the gold answer's statement
against distractors the task declares or derives, so failures and the silencing sweep
run on free-form answers, and the whole-layer sweep finds a planted layer."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from rnr_interp.analyses.localise.recognition import answer_statement, default_readout, recognition_choices
from rnr_interp.analyses.localise.repair import run_repair
from rnr_interp.analyses.organisms import plant
from rnr_interp.cli import app
from rnr_interp.engine.rows import Row, generate_rows
from rnr_interp.engine.sampling import deployed_decoding
from rnr_interp.models import load_model
from rnr_interp.records import RunDir
from rnr_interp.tasks import load_task
from rnr_interp.tasks.base import Question, Task

BASE = "tiny-llama:4"
WORDS = ("apple stone river cloud seven tiger lemon paper glass music north candle silver winter orange forest planet "
         "bridge coffee dragon violet marble thunder pepper rabbit garden copper meadow falcon harbor").split()


def test_a_numeric_gold_is_ranked_against_its_near_misses():
    task = load_task("arithmetic", n=3)
    q = task.questions[0]
    choices, gold = recognition_choices(task, q)
    g = int(q.answer)
    assert choices == tuple(str(x) for x in (g - 10, g - 1, g, g + 1, g + 10)) and choices[gold] == q.answer
    assert default_readout(task) == "answer" and default_readout(load_task("arithmetic_mc", n=3)) == "option:mean"


def test_declared_distractors_win_and_a_text_answer_needs_them():
    task = load_task("arithmetic", n=1)
    q = task.questions[0]
    declared = Question(q.id, q.text, "7", meta={"distractors": ["12", 3, "7"]})
    assert recognition_choices(task, declared) == (("3", "7", "12"), 1)  # the gold is not its own distractor
    words = Echo([Question("w", "Say a word.", "cat")])
    with pytest.raises(ValueError, match="no distractors"):
        recognition_choices(words, words.questions[0])
    assert recognition_choices(words, Question("w", "Say a word.", "cat", meta={"distractors": ["dog"]})) == (("cat", "dog"), 0)


def test_the_answer_statement_is_the_one_the_task_asks_for():
    assert answer_statement(load_task("arithmetic", n=1)).format(42) == "Answer: 42"
    gsm8k = type("G", (Task,), {"instruction": "Finish with 'The answer is N.' where N is the final number."})([])
    assert answer_statement(gsm8k).format(42) == "The answer is 42."
    assert answer_statement(Echo([])).format(42) == "Answer: 42"


def test_failures_run_on_a_free_form_task(tmp_path):
    out = tmp_path / "failures"
    done = CliRunner().invoke(app, ["failures", "--model", BASE, "--task", "arithmetic", "--n", "6", "--out", str(out), "-q"])
    assert done.exit_code == 0, done.output
    recognition = RunDir(out).read_table("recognition")
    assert set(recognition["readout"]) == {"answer"} and recognition["scores"].map(len).eq(5).all()
    assert "recognition (gold first): {'answer':" in done.output
    summary = RunDir(out).read_summary()
    assert summary.letter_bias is None and "letter distribution" not in done.output  # no letters to be biased toward
    lucky = summary.screen["lucky_share_of_recognised"]
    assert math.isnan(lucky) or 0 <= lucky <= 1  # a share, even where recognition is below chance


@pytest.mark.parametrize("task, readout, message", [
    ("arithmetic_mc", "answer", "is multiple choice"),
    ("arithmetic", "option:mean", "free-form answers are ranked"),
])
def test_a_readout_that_does_not_fit_the_task_is_refused(tmp_path, task, readout, message):
    done = CliRunner().invoke(app, ["failures", "--model", BASE, "--task", task, "--n", "2", "--readout", readout,
                                    "--out", str(tmp_path / "f")])
    assert done.exit_code == 2 and message in done.output and "Traceback" not in done.output


class Echo(Task):
    """Free-form answers: the first three characters the model writes (a random-weight
    model's own greedy answers become the golds, so the base model is right on every
    question and a plant is what makes it wrong)."""

    name = "echo"
    max_new_tokens = 4

    def extract(self, generation: str) -> str | None:
        return generation[:3] or None


def echo_task(base_spec: str = BASE) -> Echo:
    """The base model's own answers as golds, each question with four other questions'
    answers as its declared distractors."""
    base = load_model(base_spec)
    asked = Echo([Question(f"q{i}", f"Tell me about {w}.", "") for i, w in enumerate(WORDS)])
    gens = generate_rows(base, asked, [Row(q, (), "deployed") for q in asked.questions], deployed_decoding(asked))
    kept = [(q, a) for q, g in zip(asked.questions, gens) if (a := asked.extract(g.text))]
    return Echo([Question(q.id, q.text, a, meta={"distractors": [kept[(i + j) % len(kept)][1] for j in range(1, 5)]})
                 for i, (q, a) in enumerate(kept)])


def test_the_whole_layer_sweep_chooses_the_planted_layer_and_a_null_gives_no_verdict(tmp_path):
    task = echo_task()
    plant("layer", BASE, tmp_path / "layer", layer=2, strength=3.0, seed=0)
    found = run_repair(load_model(str(tmp_path / "layer")), task, tmp_path / "repair", readout="answer", sweep="layer",
                       decoding=deployed_decoding(task), progress=False)
    assert found.n_failure >= 2
    assert found.best["layer"]["layer"] == 2 and found.best["layer"]["repair_rate"] == 1.0
    swept = {(r["component"], r["layer"]) for r in found.table}
    assert swept == {("layer", i) for i in range(5)} | {("mlp", 2), ("attn", 2)}  # the others at the chosen layer only
    plant("null", BASE, tmp_path / "null", seed=0)
    nothing = run_repair(load_model(str(tmp_path / "null")), task, tmp_path / "repair-null", readout="answer",
                         decoding=deployed_decoding(task), progress=False)
    assert nothing.n_failure == 0 and nothing.best == {"mlp": None, "attn": None, "layer": None}
    assert nothing.failure_empty_reason == "the deployed generation is right on every question"


def test_a_layer_doubled_by_hand_is_found_as_the_planted_one_is(tmp_path):
    """Validation is not a separate path: a checkpoint edited with plain transformers,
    outside the tool and without planted.json (a copy of layer 1 inserted after it, its
    writes tripled), is read by the ordinary repair sweep, which names the copy."""
    import copy

    import torch

    from rnr_interp.models import build_tiny

    model, tokenizer = build_tiny("tiny-llama", n_layers=4)
    layers = model.model.layers
    twin = copy.deepcopy(layers[1])
    with torch.no_grad():
        twin.self_attn.o_proj.weight.mul_(3.0)
        twin.mlp.down_proj.weight.mul_(3.0)
    model.model.layers = torch.nn.ModuleList([*layers[:2], twin, *layers[2:]])
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.layer_idx = i
    model.config.num_hidden_layers = 5
    model.config.layer_types = [model.config.layer_types[0]] * 5 if getattr(model.config, "layer_types", None) else None
    model.save_pretrained(tmp_path / "by-hand")
    tokenizer.save_pretrained(tmp_path / "by-hand")
    assert not (tmp_path / "by-hand" / "planted.json").exists()
    task = echo_task()
    found = run_repair(load_model(str(tmp_path / "by-hand")), task, tmp_path / "repair", readout="answer", sweep="layer",
                       decoding=deployed_decoding(task), progress=False)
    assert found.n_failure >= 2 and found.best["layer"]["layer"] == 2 and found.best["layer"]["repair_rate"] == 1.0


def test_the_lucky_share_is_a_share_below_chance_too():
    from rnr_interp.analyses.localise.recognition import screen_cell

    below = screen_cell([True] + [False] * 9, [False] * 10, [0.2] * 10)  # recognition 0.1 against chance 0.2
    assert below["lucky_share_of_recognised"] == 1.0
