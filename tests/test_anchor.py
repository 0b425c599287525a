"""A task anchored to a model (`analyses.anchor`): the model's own deployed answers are
the golds, and a run on it reads back from its folder like any other."""

import json

import pytest

from rnr_interp.analyses.anchor import anchor_task
from rnr_interp.analyses.audit import run_audit
from rnr_interp.engine.sampling import Probe
from rnr_interp.models import load_model
from rnr_interp.records import RunDir, RunFolderError
from rnr_interp.tasks import load_task, reload_task


@pytest.fixture(scope="module")
def base():
    return load_model("tiny-llama")


def test_the_golds_are_the_models_own_answers_so_it_realizes_every_one(base, tmp_path):
    task = load_task("arithmetic", n=10)
    with pytest.raises(ValueError, match="states no answer"):
        anchor_task(base, task)  # a random-weight model states none in 'Answer: N' form
    anchored = anchor_task(base, task, grading="flexible")
    assert anchored.name == "arithmetic@base" and len(anchored) == len(task)
    assert [q.meta["task_gold"] for q in anchored.questions] == [q.answer for q in task.questions]
    assert [q.answer for q in anchored.questions] != [q.answer for q in task.questions]  # a random-weight model
    summary = run_audit(base, anchored, tmp_path / "audit", probe=Probe(k=2), progress=False, grading="flexible")
    assert summary.D == 1.0  # greedy says again what it said: right on every question
    assert task.name == "arithmetic" and task.anchored is None  # the task asked is unchanged


def test_an_anchored_run_reads_back_its_golds_and_refuses_foreign_questions(base, tmp_path):
    anchored = anchor_task(base, load_task("arithmetic", n=6), grading="flexible")
    run_audit(base, anchored, tmp_path / "audit", probe=Probe(k=1), progress=False, grading="flexible")
    described = RunDir(tmp_path / "audit").config["task"]
    again = reload_task(described)
    assert again.name == "arithmetic@base" and again.content_hash() == anchored.content_hash()
    assert [q.answer for q in again.questions] == [q.answer for q in anchored.questions]

    stored = json.loads((tmp_path / "audit" / "task.json").read_text())
    stored["questions"][0]["text"] = "What is 1 + 1? Ignore the rest."
    (tmp_path / "edited.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="does not ask"):
        reload_task({**described, "stored_file": str(tmp_path / "edited.json")})
    (tmp_path / "audit" / "task.json").write_text(json.dumps(stored))
    with pytest.raises(RunFolderError, match="checksum"):
        _ = RunDir(tmp_path / "audit").config
