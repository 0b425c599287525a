"""The reproduction's validation part and the findings' planted column: a localisation or
routing row that found nothing reads beside the smallest planted effect a validation of
the same model and task detects, or says that no validation was run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from rnr_interp.metrics import wilson_interval
from rnr_interp.records import RunDir
from rnr_interp.reproduce.driver import Reproduction, default_parts
from rnr_interp.reproduce.findings import (
    NOT_TESTABLE, REPRODUCED, VALIDATION_PART, localisation_findings, routing_findings,
)
from rnr_interp.reproduce.parts import PARTS
from rnr_interp.reproduce.profiles import DEMO, FULL, SMOKE

ARC_EASY = {"name": "arc", "source": "/data/arc/ARC-Easy-Test.jsonl", "n_questions": 64}
ARC_CHALLENGE = {"name": "arc", "source": "/data/arc/ARC-Challenge-Test.jsonl", "n_questions": 64}


def _repair_run(path: Path, model: str, task: dict, repair: tuple[int, int] = (1, 6),
                damage: tuple[int, int] = (0, 6)) -> None:
    """A finished repair run on `model` and `task` whose held-out repair and damage rates
    are `repair` and `damage` (k of n); by default too few questions to judge (not testable here)."""
    run = RunDir.create(path, {"kind": "repair", "model": model, "task": task})
    entry = {"layer": 4, "component": "mlp"}
    for what, (k, n) in (("repair", repair), ("damage", damage)):
        entry[what] = {"rate": k / n, "ci": list(wilson_interval(k, n)), "k": k, "n": n}
    run.write_summary({"kind": "repair", "model": model, "task": task["name"], "n_questions": task["n_questions"],
                       "n_failure": 12, "n_panel": 6, "at_chosen_layer": {"mlp": entry}})


def _validation_run(path: Path, model: str, task: dict, recovered: dict[tuple[str, float], tuple[int, int]],
                    nulls: dict[str, tuple[int, int]], recovery: dict | None = None) -> None:
    """A finished validation run: `recovered` (analysis, strength) -> (recovered, n);
    `nulls` analysis -> (false positives, n); `recovery` the summary's, per kind."""
    run = RunDir.create(path, {"kind": "validate", "model": model, "task": task, "gold": "base"})
    rows = []
    for (analysis, strength), (k, n) in recovered.items():
        lo, hi = wilson_interval(k, n)
        rows.append({"kind": "layer", "analysis": analysis, "strength": strength, "n": n, "rate": k / n, "lo": lo, "hi": hi})
    run.write_table("detection", pd.DataFrame(rows))
    by_analysis = {a: {"rate": 1.0, "ci": [0.0, 1.0], "n": 1, "null_false_positive_rate": k / n,
                       "null_ci": list(wilson_interval(k, n)), "n_null": n} for a, (k, n) in nulls.items()}
    run.write_summary({"kind": "validate", "model": model, "task": f"{task['name']}@base", "n_questions": 60,
                       "profile": "full", "gold": "base", "recovery": recovery or {}, "by_analysis": by_analysis})


def test_the_smallest_strength_detected_is_read_beside_an_untestable_repair(tmp_path):
    _repair_run(tmp_path / "4_localisation" / "arc_easy" / "repair", "smollm2", ARC_EASY)
    # the Wilson lower bound of 6/10 is 0.31, of 9/10 is 0.60: 0.5x is the smallest detected
    _validation_run(tmp_path / VALIDATION_PART / "arc_easy", "smollm2", ARC_EASY,
                    {("repair:layer", 0.0): (10, 10), ("repair:layer", 0.25): (6, 10), ("repair:layer", 0.5): (9, 10),
                     ("repair:layer", 1.0): (10, 10), ("route:skiponly", 1.0): (2, 10)},
                    {"repair:layer": (1, 10), "route:skiponly": (0, 10)})
    repair, steering = localisation_findings(tmp_path / "4_localisation")
    assert repair.verdict == NOT_TESTABLE
    lo, hi = wilson_interval(9, 10)
    null_lo, null_hi = wilson_interval(1, 10)
    assert repair.planted == (f"validation arc_easy (full profile, golds base, 60 questions): repair:layer detects 0.5x "
                              f"the default plant (recovered 0.90 [{lo:.2f}, {hi:.2f}] of 10 organisms); its nulls named the "
                              f"planted location 0.10 [{null_lo:.2f}, {null_hi:.2f}] of 10 organisms")
    assert "route:" not in repair.planted  # localisation rows read the repair analyses only
    assert steering.verdict == NOT_TESTABLE and steering.planted == repair.planted


def test_none_detected_names_the_largest_strength_tried(tmp_path):
    _repair_run(tmp_path / "4_localisation" / "arc_easy" / "repair", "smollm2", ARC_EASY)
    _validation_run(tmp_path / VALIDATION_PART / "arc_easy", "smollm2", ARC_EASY,
                    {("repair:layer", 1.0): (3, 3)}, {"repair:layer": (0, 3)})
    planted = localisation_findings(tmp_path / "4_localisation")[0].planted
    assert "repair:layer none of the strengths tried detected (largest 1x the default plant: recovered 1.00 [0.44, 1.00] of 3 organisms)" in planted


def test_planted_organisms_that_broke_no_answer_are_named_beside_the_miss(tmp_path):
    _repair_run(tmp_path / "4_localisation" / "arc_easy" / "repair", "smollm2", ARC_EASY)
    _validation_run(tmp_path / VALIDATION_PART / "arc_easy", "smollm2", ARC_EASY,
                    {("repair:layer", 1.0): (0, 2)}, {"repair:layer": (0, 2)},
                    recovery={"layer": {"rate": 0.0, "n": 2, "n_without_failure": 2}})
    planted = localisation_findings(tmp_path / "4_localisation")[0].planted
    assert "none of the strengths tried detected" in planted
    assert planted.endswith("; 2 of its 2 planted layer organisms left no failure to localise (nothing there to find)")


def test_a_finding_without_its_validation_says_so_and_gives_the_command(tmp_path):
    _repair_run(tmp_path / "4_localisation" / "arc_easy" / "repair", "smollm2", ARC_EASY)
    # another split of the same task name, and another model on this split: neither is this cell's
    _validation_run(tmp_path / VALIDATION_PART / "arc_challenge", "smollm2", ARC_CHALLENGE,
                    {("repair:layer", 1.0): (10, 10)}, {"repair:layer": (0, 10)})
    _validation_run(tmp_path / "elsewhere" / VALIDATION_PART / "arc_easy", "gemma3", ARC_EASY,
                    {("repair:layer", 1.0): (10, 10)}, {"repair:layer": (0, 10)})
    repair = localisation_findings(tmp_path / "4_localisation")[0]
    assert repair.planted == ("no validation run for this model and task: rnr validate --model smollm2 --task arc_easy "
                              f"--n 64 --out {(tmp_path / VALIDATION_PART / 'arc_easy').as_posix()}")


def test_a_reproduced_row_reads_no_validation(tmp_path):
    _repair_run(tmp_path / "4_localisation" / "arc_easy" / "repair", "smollm2", ARC_EASY, repair=(2000, 2000), damage=(0, 2000))
    rows = localisation_findings(tmp_path / "4_localisation")
    assert rows[0].verdict == REPRODUCED and rows[0].planted == ""


def test_routing_rows_read_the_route_analyses_of_each_routed_task(tmp_path):
    for name in ("arithmetic", "gsm8k"):
        run = RunDir.create(tmp_path / "2_routing" / name, {"kind": "route", "model": "smollm2", "task": {
            "name": name, "source": f"/data/{name}.jsonl", "n_questions": 40}})
        (run.path / "summary.json").write_text("{}")  # finished; the column reads the manifest alone
    _validation_run(tmp_path / VALIDATION_PART / "arithmetic", "smollm2",
                    {"name": "arithmetic", "source": "/elsewhere/arithmetic.jsonl", "n_questions": 24},
                    {("repair:layer", 1.0): (10, 10), ("route:skiponly", 1.0): (10, 10)},
                    {"repair:layer": (0, 10), "route:skiponly": (0, 10)})
    rows = routing_findings(tmp_path / "2_routing")  # no cross-cell aggregate: both not testable
    assert [r.verdict for r in rows] == [NOT_TESTABLE, NOT_TESTABLE]
    planted = rows[0].planted
    assert planted.startswith("[arithmetic] validation arithmetic (full profile")
    assert "route:skiponly detects 1x the default plant" in planted and "repair:layer" not in planted
    assert "[gsm8k] no validation run for this model and task: rnr validate --model smollm2 --task gsm8k --n 40" in planted


def test_validation_is_opt_in_where_the_profile_says_and_old_roots_are_refused(tmp_path):
    assert VALIDATION_PART not in default_parts(DEMO)
    assert VALIDATION_PART in default_parts(SMOKE) and VALIDATION_PART in default_parts(FULL)
    assert set(DEMO.opt_in) <= {p.name for p in PARTS}
    # the same profile resumes; another value is refused
    Reproduction.open(tmp_path, DEMO).save()
    assert Reproduction.open(tmp_path, DEMO).profile == DEMO
    with pytest.raises(ValueError, match="differing: validate_profile"):
        Reproduction.open(tmp_path, replace(DEMO, validate_profile="full"))
    # a root made before the validation settings existed is refused, naming them
    state = json.loads((tmp_path / "reproduce.json").read_text())
    for key in ("validate_profile", "validate_gold"):
        del state["profile"][key]
    (tmp_path / "reproduce.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="made before the profile setting.s. validate_gold, validate_profile existed"):
        Reproduction.open(tmp_path, DEMO)


def test_a_real_validation_run_is_read_beside_a_tiny_models_localisation(tmp_path):
    """Through `run_validate` on a tiny model: the column reads that run's own numbers."""
    from tests.test_localise_freeform import BASE, echo_task

    from rnr_interp.analyses.validate import run_validate

    task = echo_task()
    summary = run_validate(BASE, task, tmp_path / VALIDATION_PART / "echo", profile="quick", progress=False)
    _repair_run(tmp_path / "4_localisation" / "echo" / "repair", BASE, task.describe())
    planted = localisation_findings(tmp_path / "4_localisation")[0].planted
    detection = RunDir(tmp_path / VALIDATION_PART / "echo").read_table("detection")
    row = detection[(detection["analysis"] == "repair:layer") & (detection["strength"] == 1.0)].iloc[0]
    null = summary.by_analysis["repair:layer"]
    # 3 seeds drawing 2 distinct layers of this model: 2 of 2 has a Wilson lower bound of 0.34,
    # so no strength counts as detected
    assert (row["n"], row["n_seeds"]) == (2, 3)
    assert planted == (f"validation echo (quick profile, golds base, {summary.n_questions} questions): repair:layer none "
                       f"of the strengths tried detected (largest 1x the default plant: recovered {row['rate']:.2f} "
                       f"[{row['lo']:.2f}, {row['hi']:.2f}] of 2 organisms); its nulls named the planted location "
                       f"{null['null_false_positive_rate']:.2f} [{null['null_ci'][0]:.2f}, {null['null_ci'][1]:.2f}] of 2 organisms")


def test_the_findings_page_and_index_show_the_planted_column(tmp_path):
    from rnr_interp.report.findings_page import findings_markdown
    from rnr_interp.report.reproduction import write_reproduction_report
    from rnr_interp.reproduce.findings import as_records

    _repair_run(tmp_path / "4_localisation" / "arc_easy" / "repair", "smollm2", ARC_EASY)
    rows = as_records(localisation_findings(tmp_path / "4_localisation"))
    assert rows[0]["planted"].startswith("no validation run for this model and task")
    page = findings_markdown(tmp_path, "demo", "smollm2", {}, rows)
    assert "| verdict | planted effect this n detects |" in page
    assert any(line.startswith(f"| {rows[0]['claim']} |") and line.endswith(f"| {rows[0]['planted']} |")
               for line in page.splitlines())
    index = write_reproduction_report(tmp_path, "demo", "smollm2", {}, {}, rows).read_text()
    assert "planted effect this n detects" in index and "no validation run for this model and task" in index
