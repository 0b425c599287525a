"""Each analysis kind's summary.json is one typed class: written and read through it,
versioned, refused on read with one line naming the field that does not fit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rnr_interp.records import (
    SCHEMA_VERSION, SUMMARY_TYPES, AuditSummary, RouteSummary, RunDir, SummaryError, parse_summary,
)
from rnr_interp.report.kinds import ANALYSES

COMMITTED = Path(__file__).resolve().parents[1] / "experiments" / "runs"
AUDIT = {"n_questions": 3, "k": 2, "D": 0.5, "O_K": 0.75, "gap": 0.25, "D_ci": [0.1, 0.9], "O_K_ci": [0.2, 0.95],
         "gap_ci": [0.0, 0.5], "grading": "strict", "strict": {"D": 0.5}, "flexible": {"D": 0.6}}


def test_every_kind_has_one_summary_type_and_one_registered_analysis():
    assert set(SUMMARY_TYPES) == set(ANALYSES)
    for kind, analysis in ANALYSES.items():
        assert analysis.summary is SUMMARY_TYPES[kind] and analysis.summary.KIND == kind


def test_a_summary_round_trips_with_its_kind_and_version(tmp_path):
    run = RunDir.create(tmp_path / "run", {"kind": "audit"})
    written = run.write_summary(AUDIT)
    on_disk = json.loads((run.path / "summary.json").read_text())
    assert on_disk["kind"] == "audit" and on_disk["schema_version"] == SCHEMA_VERSION
    assert "null" not in on_disk  # an optional field without a value is not written
    assert run.read_summary() == written
    assert (written.beside(), written.graded("flexible")) == ("flexible", {"D": 0.6})


@pytest.mark.parametrize("change, field", [
    ({"D": "half"}, "'D' of the audit summary should be a number, got \"half\""),
    ({"D_ci": None}, "'D_ci' of the audit summary should be a list"),
    ({"k": True}, "'k' of the audit summary should be an integer or null"),
    ({"warnings": [1]}, "'warnings' of the audit summary should be a list or null"),
    ({"O_K_of_everything": 1}, "unknown field 'O_K_of_everything' in the audit summary"),
    ({"kind": "route"}, "field 'kind' is 'route', expected 'audit'"),
    ({"schema_version": SCHEMA_VERSION + 1}, "field 'schema_version' is"),
])
def test_a_summary_that_does_not_fit_is_refused_naming_the_field(tmp_path, change, field):
    run = RunDir.create(tmp_path / "run", {"kind": "audit"})
    (run.path / "summary.json").write_text(json.dumps({**AUDIT, **change}))
    with pytest.raises(SummaryError) as err:
        run.read_summary()
    message = str(err.value)
    assert field in message and str(run.path / "summary.json") in message and "\n" not in message


def test_a_missing_field_is_named_and_nothing_is_written(tmp_path):
    run = RunDir.create(tmp_path / "run", {"kind": "audit"})
    with pytest.raises(SummaryError, match="field 'gap' is missing from the audit summary"):
        run.write_summary({k: v for k, v in AUDIT.items() if k != "gap"})
    assert not run.has_summary()


def test_a_summary_without_a_version_is_version_0():
    old = parse_summary({k: v for k, v in AUDIT.items()}, "audit")
    assert isinstance(old, AuditSummary) and old.schema_version == 0


def test_an_unknown_kind_is_refused():
    with pytest.raises(SummaryError, match="unknown analysis kind 'poll'"):
        parse_summary({}, "poll")


@pytest.mark.parametrize("name", sorted(p.name for p in COMMITTED.iterdir() if (p / "summary.json").is_file()))
def test_committed_run_folders_read_with_their_version_and_numbers(name, tmp_path):
    """Summaries written before versions read as version 0, later ones as theirs."""
    raw = json.loads((COMMITTED / name / "summary.json").read_text())
    run = RunDir(COMMITTED / name)
    summary = run.read_summary()
    assert isinstance(summary, RouteSummary) and summary.schema_version == raw.get("schema_version", 0)
    same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # noqa: E731 (NaN != NaN)
    assert same((summary.deployed, summary.oracle_at_k, summary.cells), (raw["deployed"], raw["oracle_at_k"], raw["cells"]))
    # written back, the file holds the same fields, now with its version
    copy = tmp_path / name
    shutil.copytree(COMMITTED / name, copy, ignore=shutil.ignore_patterns("records", "artefacts"))
    RunDir(copy).write_summary(summary.but(schema_version=SCHEMA_VERSION))
    again = json.loads((copy / "summary.json").read_text())
    assert same({k: v for k, v in again.items() if k != "schema_version"}, {k: v for k, v in raw.items() if k != "schema_version"})


def test_regrade_refuses_a_kind_without_a_summary_from_records(tmp_path):
    from typer.testing import CliRunner

    from rnr_interp.cli import app

    run = RunDir.create(tmp_path / "screen", {"kind": "screen"})
    run.write_summary({"criterion": "c", "margin": 0.05, "level": 0.95, "n_cells": 0, "n_failure_cells": 0, "cells": []})
    res = CliRunner().invoke(app, ["regrade", str(run.path)])
    assert res.exit_code == 2 and "regrade rewrites audit and route runs" in res.output and "'screen' run" in res.output


def test_every_registered_name_resolves():
    """The registry names each analysis's run and settings by module and name: none is stale."""
    import dataclasses

    for kind, analysis in ANALYSES.items():
        assert callable(analysis.run.resolve()), kind
        assert analysis.config is None or dataclasses.is_dataclass(analysis.config.resolve()), kind


def test_report_of_a_summary_that_does_not_fit_is_one_line_naming_the_field(tmp_path):
    from typer.testing import CliRunner

    from rnr_interp.cli import app

    run = RunDir.create(tmp_path / "run", {"kind": "audit"})
    (run.path / "summary.json").write_text(json.dumps({**AUDIT, "O_K": None}))
    res = CliRunner().invoke(app, ["report", str(run.path)])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert res.output.startswith("error: ") and "field 'O_K' of the audit summary should be a number, got null" in res.output


def test_a_summary_made_directly_is_checked_when_written(tmp_path):
    run = RunDir.create(tmp_path / "run", {"kind": "audit"})
    made = AuditSummary(**{**AUDIT, "n_questions": "three"})  # a dataclass takes what it is given
    with pytest.raises(SummaryError, match="field 'n_questions' of the audit summary should be an integer"):
        run.write_summary(made)
    assert not run.has_summary()
