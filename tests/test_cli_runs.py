"""Command-line behaviour around runs: unfinished runs and quiet output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rnr_interp.analyses.audit import run_audit
from rnr_interp.cli import app
from rnr_interp.engine.decoding import Decoding
from rnr_interp.models import load_model
from rnr_interp.records import RunDir
from rnr_interp.engine.sampling import Probe
from rnr_interp.tasks import load_task


def test_pass_at_k_says_a_run_is_unfinished(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_audit(load_model("tiny-llama"), load_task("arithmetic", n=4), out, probe=Probe(k=2, temperature=1.0),
              deployed=Decoding(max_new_tokens=3), batch_size=2, progress=False)
    runner = CliRunner()
    finished = runner.invoke(app, ["pass-at-k", str(out)])
    assert finished.exit_code == 0 and "unfinished" not in finished.output
    # A run killed after its first chunk: the last records part never got written.
    parts = sorted(RunDir(out).parts())
    parts[-1].unlink()
    (out / "summary.json").unlink()
    unfinished = runner.invoke(app, ["pass-at-k", str(out)])
    assert unfinished.exit_code == 0
    assert "unfinished run: 2 of 4 questions sampled" in unfinished.output
    for part in parts[:-1]:
        part.unlink()
    empty = runner.invoke(app, ["pass-at-k", str(out)])
    assert empty.exit_code == 2 and "unfinished: no question sampled yet" in empty.output


@pytest.mark.slow
def test_quiet_prints_no_progress_bar_not_even_model_loading(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "rnr_interp.cli", "audit", "--model", "smollm2", "--task", "arithmetic",
           "--n", "1", "--k", "1", "--max-new-tokens", "2", "--out", str(tmp_path / "run"), "-q"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "Loading weights" not in out.stderr and "it/s" not in out.stderr, out.stderr


def test_route_summary_snapshots_an_unfinished_route_run(tmp_path: Path) -> None:
    from rnr_interp.analyses.routing.config import RouteConfig
    from rnr_interp.analyses.routing.run import run_route_audit

    run = tmp_path / "route"
    run_route_audit(load_model("tiny-llama:3"), load_task("arithmetic", n=3), run,
                    RouteConfig(samples=2, budget=2, batch_size=2), progress=False)
    RunDir(run).parts()[-1].unlink()  # killed in its second chunk
    (run / "summary.json").unlink()
    runner = CliRunner()
    result = runner.invoke(app, ["route-summary", str(run), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "unfinished run: 2 of 3 questions written; the summary below is over those 2" in result.output
    assert "tiny-llama:3 on arithmetic: 2 questions" in result.output
    snap = tmp_path / "route-2q"
    assert f"run folder: {snap}" in result.output
    assert RunDir(snap).read_summary().snapshot["questions_done"] == 2
    assert not (run / "summary.json").exists()
    assert runner.invoke(app, ["report", str(snap)]).exit_code == 0
    assert f"snapshot of {run.resolve()}: 2 of 3 questions written" in (snap / "report.html").read_text()

    again = runner.invoke(app, ["route-summary", str(run), "--quiet"])
    assert again.exit_code == 2 and "already a run folder; choose another --out" in again.output
    audit_run = tmp_path / "audit"
    run_audit(load_model("tiny-llama"), load_task("arithmetic", n=2), audit_run, probe=Probe(k=2, temperature=1.0),
              deployed=Decoding(max_new_tokens=3), batch_size=2, progress=False)
    other = runner.invoke(app, ["route-summary", str(audit_run), "--quiet"])
    assert other.exit_code == 2 and "is not a route run (its kind: 'audit')" in other.output


def test_route_summary_reads_records_only(tmp_path: Path, monkeypatch) -> None:
    """No model is loaded and the task's data file is not needed: the summary, with every
    selector's pick, comes from the records (self-verification's scores included); only
    the chance nulls need the golds, and the summary says they are missing."""
    import json

    import rnr_interp.models
    from rnr_interp.analyses.routing.config import RouteConfig
    from rnr_interp.analyses.routing.run import run_route_audit

    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(2)))
    run = tmp_path / "route"
    finished = run_route_audit(load_model("tiny-llama:3"), load_task("jsonl", data=data), run,
                               RouteConfig(samples=2, budget=2, batch_size=2, collapse=1.0), progress=False)
    data.unlink()

    def no_model(*args, **kwargs):
        raise AssertionError("route-summary loaded a model")

    monkeypatch.setattr(rnr_interp.models, "load_model", no_model)
    result = CliRunner().invoke(app, ["route-summary", str(run), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "unfinished" not in result.output and "tiny-llama:3 on jsonl: 2 questions" in result.output
    snap = RunDir(tmp_path / "route-2q").read_summary()
    assert all("null" in c for c in finished.cells.values())
    # without the task the exclusion rule reads the flexible parse, and says so
    task_bound = ("null", "unparsed_rate", "excluded")
    without_nulls = {cell: {k: v for k, v in c.items() if k not in task_bound} for cell, c in finished.cells.items()}
    assert json.dumps({cell: {k: v for k, v in c.items() if k not in task_bound} for cell, c in snap.cells.items()},
                      sort_keys=True) == json.dumps(without_nulls, sort_keys=True)
    assert snap.exclusion["parse"] == "flexible" and any(m.startswith("exclusion rule") for m in snap.missing)
    assert any(line.startswith("chance nulls: the run's task cannot be reloaded here") for line in snap.missing)
    for key in ("temperature", "selectors", "oracle_at_k"):
        assert json.dumps(getattr(snap, key), sort_keys=True) == json.dumps(getattr(finished, key), sort_keys=True), key


def test_task_seed_draws_other_questions_of_a_generated_task_and_a_file_task_refuses_it(tmp_path: Path) -> None:
    """`--task-seed` (every command that takes --task) draws a generated task's questions
    with that seed, recorded in the run's task source so a resume or reload gets the same
    ones; a task read from a file refuses it by name, before any folder is made."""
    out = tmp_path / "a"
    done = CliRunner().invoke(app, ["audit", "--model", "tiny-llama:1", "--task", "copy", "--task-seed", "3", "--n", "3",
                                    "--k", "1", "--out", str(out), "-q"])
    assert done.exit_code == 0, done.output
    described = RunDir(out).config["task"]
    assert "seed=3" in described["source"]
    drawn = load_task("copy", n=3, seed=3)
    assert described["questions_hash"] == drawn.content_hash() != load_task("copy", n=3).content_hash()
    for command in (["audit"], ["repair"], ["validate"]):
        done = CliRunner().invoke(app, [*command, "--model", "tiny-llama:1", "--task", "arc_easy", "--task-seed", "1",
                                        "--out", str(tmp_path / "refused")])
        assert done.exit_code == 2 and "task 'arc_easy' reads its questions from a file" in done.output, done.output
        assert not (tmp_path / "refused").exists()
    done = CliRunner().invoke(app, ["plant", "layer", "--model", "tiny-llama:1", "--task-seed", "1", "--out", str(tmp_path / "p")])
    assert done.exit_code == 2 and "--task-seed draws the questions of --task" in done.output
