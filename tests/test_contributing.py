"""docs/contributing.md's worked example is code that runs: its module, imported as a
user's would be, registers an analysis that the command line, the report, regrade and
the summary checks all serve without any other change."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rnr_interp.records import RunDir, SummaryError, summaries
from rnr_interp.report import kinds

DOC = Path(__file__).resolve().parents[1] / "docs" / "contributing.md"


def example_source() -> str:
    """The doc's module: its first python code block."""
    return re.search(r"```python\n(.*?)```", DOC.read_text(), flags=re.S).group(1)


@pytest.fixture
def example(tmp_path, monkeypatch):
    """The example imported as a module of its own, its registration undone afterwards."""
    monkeypatch.setattr(kinds, "ANALYSES", dict(kinds.ANALYSES))
    monkeypatch.setattr(summaries, "SUMMARY_TYPES", dict(summaries.SUMMARY_TYPES))
    path = tmp_path / "agreement_analysis.py"
    path.write_text(example_source())
    spec = importlib.util.spec_from_file_location("agreement_analysis", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "agreement_analysis", module)
    spec.loader.exec_module(module)
    return module


def cli(example) -> typer.Typer:
    from rnr_interp.cli import OneLineErrors
    from rnr_interp.commands.audit import regrade
    from rnr_interp.commands.report import report

    app = typer.Typer(cls=OneLineErrors)
    app.command("agreement")(example.agreement)
    app.command("regrade")(regrade)
    app.command("report")(report)
    return app


def test_the_worked_example_runs_reports_and_regrades(example, tmp_path):
    app, out = cli(example), tmp_path / "run"
    res = CliRunner().invoke(app, ["agreement", "--model", "tiny-llama", "--task", "arithmetic", "--n", "3", "--k", "3",
                                   "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    summary = RunDir(out).read_summary()
    assert isinstance(summary, example.AgreementSummary)
    assert (summary.n_questions, summary.k) == (3, 3) and 0 <= summary.unanimous <= 3
    assert f"{summary.agreement:.3f} of K=3 samples give the deployed answer" in res.output
    # the agreement is the records' own: each sample against its question's deployed answer
    records = RunDir(out).read_records()
    deployed = dict(records[records.probe == "deployed"][["question_id", "extracted"]].values)
    samples = records[records.probe != "deployed"]
    agree = [(e is not None and e == deployed[q]) for q, e in zip(samples.question_id, samples.extracted)]
    assert summary.agreement == pytest.approx(sum(agree) / len(agree))

    res = CliRunner().invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    page = (out / "report.html").read_text()
    assert "Summary (agreement)" in page and "samples giving the deployed answer" in page

    regraded = tmp_path / "regraded"
    res = CliRunner().invoke(app, ["regrade", str(out), "--out", str(regraded)])
    assert res.exit_code == 0, res.output
    again = RunDir(regraded).read_summary()
    assert again.agreement == summary.agreement and again.regraded["records_parts"] == len(RunDir(out).parts())


def test_the_examples_summary_is_checked_like_the_packages(example, tmp_path):
    run = RunDir.create(tmp_path / "run", {"kind": "agreement"})
    with pytest.raises(SummaryError, match="field 'agreement' of the agreement summary should be a number"):
        run.write_summary({"model": "m", "task": "t", "n_questions": 1, "k": 1, "agreement": "all", "unanimous": 1})
    path = run.path / "summary.json"
    path.write_text(json.dumps({"kind": "agreement", "model": "m", "task": "t", "n_questions": 1, "k": 1}))
    with pytest.raises(SummaryError, match="field 'agreement' is missing from the agreement summary"):
        run.read_summary()


def test_an_analysis_is_registered_once(example):
    with pytest.raises(ValueError, match="'agreement' registered twice"):
        kinds.register(kinds.ANALYSES["agreement"])
