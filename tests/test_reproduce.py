"""`rnr reproduce`: the smoke profile end to end on tiny models (every part's run folders,
resume, the findings table, the index page in headless Chromium), and the findings'
verdict rules on run folders built to make each verdict come out."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from rnr_interp.cli import app
from rnr_interp.records import RunDir, load_runs
from rnr_interp.reproduce.findings import (
    NOT_REPRODUCED, NOT_TESTABLE, REPORTED, REPRODUCED, at_least, at_most, checkpoint_findings, findings,
    localisation_findings, routing_findings,
)
from rnr_interp.reproduce.findings import REPAIR_CLAIM, ROUTING_CLAIM, SELECTOR_CLAIM, STEER_CLAIM, _steering_finding
from rnr_interp.analyses.routing.config import STRUCTURED, matched_control
from rnr_interp.reproduce.parts import PARTS
from rnr_interp.reproduce.profiles import SMOKE

#: part -> the kinds of finished run folders the smoke profile leaves there
EXPECTED_KINDS = {
    "1_audit": {"audit"}, "2_routing": {"route", "route_cells"}, "3_temperature": {"temperature_sweep"},
    "4_localisation": {"failures", "screen", "repair", "steer", "units"}, "5_checkpoints": {"audit", "compare"},
    "6_validation": {"validate"},
}
#: distinct claims of the findings table (the gap beyond chance, routing, selectors,
#: repair, steering, RLVR reachable, RLVR shrink, SFT widen, prompt format)
N_CLAIMS = 9


def _invoke(*args: str):
    return CliRunner().invoke(app, ["reproduce", *args])


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce") / "root"
    done = _invoke("--profile", "smoke", "--out", str(root), "--quiet")
    return root, done


def _kinds(folder: Path) -> set[str]:
    return {r.config["kind"] for r in load_runs(folder) if (r.path / "summary.json").is_file()}


def _record_parts(root: Path) -> int:
    return sum(len(RunDir(r.path).parts()) for r in load_runs(root))


def test_smoke_profile_runs_every_part_into_run_folders(smoke):
    root, done = smoke
    assert done.exit_code == 0, done.output
    state = json.loads((root / "reproduce.json").read_text())
    assert state["profile_name"] == "smoke"
    for part in PARTS:
        assert state["parts"][part.name]["status"] == "done", state["parts"][part.name]
        assert state["parts"][part.name]["seconds"] > 0
        assert _kinds(root / part.name) == EXPECTED_KINDS[part.name], part.name
    # the audit part: one run per task at the profile's K
    audits = {r.config["task"]["name"]: r for r in load_runs(root / "1_audit")}
    assert sorted(audits) == sorted(SMOKE.audit_tasks)
    assert all(r.config["probe"]["k"] == SMOKE.k for r in audits.values())
    # the routing part: one cell per task x space, each with every method, aggregated across cells
    runs = [r for r in load_runs(root / "2_routing") if r.config["kind"] == "route"]
    cells = pd.concat([r.read_table("route_cells") for r in runs])
    assert cells["cell"].nunique() == len(SMOKE.route_tasks) * len(SMOKE.spaces)
    # random_matched is one control per structured search
    assert set(cells["method"]) >= {m for m in SMOKE.methods if m != "random_matched"} | {
        matched_control(m) for m in STRUCTURED}
    assert RunDir(root / "2_routing" / "route_cells").read_summary().runs == [str(r.path) for r in runs]
    # the temperature part: one audit per temperature, and the sweep table over them
    sweep = RunDir(root / "3_temperature" / SMOKE.sweep_task).read_table("temperature_sweep")
    assert sorted(sweep["temperature"]) == sorted(SMOKE.temperatures)
    # the screen covers every MC cell, and exactly the cells it keeps are localised
    screen = RunDir(root / "4_localisation" / "screen").read_summary()
    folders = [Path(c["path"]).parent for c in screen.cells]
    assert [f.name for f in folders] == list(SMOKE.screen_tasks)
    assert screen.n_failure_cells >= 1, "the smoke screen must let a cell through, or localisation is not exercised"
    for folder, cell in zip(folders, screen.cells):
        assert (folder / "repair" / "summary.json").is_file() == cell["failure"]
        if cell["failure"]:  # the smoke's screened task is lettered: both runs carry the control
            assert "permutation_control" in RunDir(folder / "repair").config
            assert "permutation_control" in RunDir(folder / "steer").config
    # the checkpoint part: a checkpoint per recipe, trained, audited and compared with the budget control
    for recipe in SMOKE.recipes:
        assert (root / "5_checkpoints" / "checkpoints" / recipe / "finetune.json").is_file()
        compare = RunDir(root / "5_checkpoints" / f"compare_{recipe}").read_summary()
        assert compare.budget_control is not None
    # the validation part: one validation per localisation task at the screen's n
    for name in SMOKE.screen_tasks:
        validation = RunDir(root / "6_validation" / name)
        assert validation.config["task"]["n_questions"] == SMOKE.screen_n
        assert (validation.config["gold"], validation.read_summary().profile) == (SMOKE.validate_gold, SMOKE.validate_profile)


def test_cost_per_part_is_printed_and_recorded(smoke):
    root, done = smoke
    state = json.loads((root / "reproduce.json").read_text())
    for part in PARTS:
        line = re.search(rf"^\s+{part.name}\s+done\s+(\d+) s", done.output, flags=re.M)
        assert line, done.output
        assert int(line.group(1)) == round(state["parts"][part.name]["seconds"])
        # where the seconds were spent: all of them on this machine's CPU
        assert list(state["parts"][part.name]["seconds_by_device"]) == [f"cpu ({torch.get_num_threads()} threads)"]
        assert sum(state["parts"][part.name]["seconds_by_device"].values()) == pytest.approx(state["parts"][part.name]["seconds"], abs=0.2)


def test_a_part_resumed_on_another_device_names_both_shares():
    from rnr_interp.report.reproduction import where_spent

    assert where_spent({"seconds": 5, "seconds_by_device": {"cpu (2 threads)": 5}}) == ""
    both = {"seconds": 130, "seconds_by_device": {"cpu (2 threads)": 100, "cuda (NVIDIA H200)": 30}}
    assert where_spent(both) == "cpu (2 threads): 100 s; cuda (NVIDIA H200): 30 s"


def test_findings_are_read_from_the_run_folders(smoke):
    root, done = smoke
    rows = json.loads((root / "findings.json").read_text())
    assert rows == json.loads(json.dumps(_as_json(findings(root))))
    claims = {r["claim"] for r in rows}
    assert len(claims) == N_CLAIMS
    assert all(r["verdict"] in (REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE, REPORTED) and r["why"] for r in rows)
    # the routing row counts the clean cells of the routing part's aggregate
    routing = next(r for r in rows if r["claim"].startswith("random >= structured"))
    model_task = RunDir(root / "2_routing" / "route_cells").read_table("model_task")
    tested = int(model_task[(model_task.baseline == "random") & (model_task.scope == "clean")].tested.iloc[0])
    if tested:
        assert routing["scope"] == f"{tested} clean model-task cells" and routing["n"] == tested
    else:  # every oracle equals greedy in the smoke's cells: nothing to judge
        assert routing["verdict"] == NOT_TESTABLE and "untested" in routing["why"]
    for r in rows:
        assert f"[{r['verdict']}]" in done.output
    # beside each localisation or routing row that found nothing: the validation of its task,
    # or the command that makes it (the smoke validates its localisation task, not its routed one)
    for r in rows:
        found_nothing = r["verdict"] in (NOT_TESTABLE, NOT_REPRODUCED)
        if r["claim"] in (REPAIR_CLAIM, STEER_CLAIM) and found_nothing:
            assert r["planted"].startswith(f"validation {SMOKE.screen_tasks[0]} (quick profile, golds task, "), r["planted"]
        elif r["claim"] in (ROUTING_CLAIM, SELECTOR_CLAIM) and found_nothing:
            assert r["planted"].startswith("no validation run for this model and task: rnr validate --model tiny-llama "
                                           f"--task {SMOKE.route_tasks[0]}"), r["planted"]
        else:
            assert r["planted"] == ""


def test_findings_page_is_written_from_the_runs(smoke):
    """findings.md: a row per finding, the conditions of every run folder (device,
    threads, code commit from its manifest), and old values beside new after a rerun."""
    from rnr_interp.report.findings_page import findings_markdown

    root, _ = smoke
    rows = json.loads((root / "findings.json").read_text())
    page = (root / "findings.md").read_text()
    assert page.startswith("# Findings: the paper's claims on tiny-llama")
    assert f"rnr reproduce --profile smoke --out {root.as_posix()}" in page
    table = [line for line in page.splitlines() if line.startswith("| ") and line.endswith(" |")]
    assert sum(any(line.startswith(f"| {r['claim']} |") and f"| {r['verdict']} |" in line for line in table)
               for r in rows) == len(rows)
    runs = load_runs(root)
    conditions = page.split("## Conditions of each run")[1]
    for run in runs:
        assert f"| {run.path.relative_to(root).as_posix()} |" in conditions
        assert f"| {torch.get_num_threads()} |" in conditions and "| cpu |" in conditions
    assert "Changed since" not in page  # nothing before it in this folder
    state = json.loads((root / "reproduce.json").read_text())
    before = [dict(r) for r in rows]
    moved = next(r for r in before if r["value"] is not None)
    moved["value"], moved["verdict"] = moved["value"] + 0.5, "a verdict that differs"
    again = findings_markdown(root, "smoke", "tiny-llama", state["parts"], rows, previous=before)
    changed = again.split("## Changed since the previous findings in this folder")[1].split("## Cost")[0]
    assert f"| {moved['value']:.3f}" in changed and "| a verdict that differs |" in changed
    assert changed.count("\n| ") == 2  # the header and the one changed row (the rule starts "|-")


def _as_json(rows):
    from rnr_interp.reproduce.findings import as_records

    return as_records(rows)


def test_index_links_every_part_and_draws_the_paper_figures(smoke):
    root, _ = smoke
    page = (root / "index.html").read_text()
    for part in PARTS:
        assert f'href="{part.name}/index.html"' in page
        assert (root / part.name / "index.html").is_file()
    names = set(re.findall(r'<figure data-name="([^"]+)"', page))
    expected = {"task_curves", "route_curves", "route_cell_difference", "route_advantage", "temperature_sweep",
                "screen_scatter", "checkpoint_change", "checkpoint_propensity", "grpo_transitions", "sft_transitions"}
    comparisons = RunDir(root / "2_routing" / "route_cells").read_table("comparisons")
    if comparisons["excluded"].all():
        # the random-weight model's full path collapses under the strict format: every
        # cell is excluded, so there is no random − structured advantage to draw
        expected.discard("route_advantage")
    assert expected <= names, names
    # every passing cell's silencing sweep (steering and units need a non-empty healthy
    # panel, which the random-weight model does not have: those runs say they skipped)
    assert any(n.endswith("_repair_heatmap") for n in names)
    rows = json.loads((root / "findings.json").read_text())
    assert page.count('class="verdict"') == len(rows)


def test_rerun_resumes_without_redoing_anything(smoke):
    root, _ = smoke
    before = json.loads((root / "reproduce.json").read_text())
    n_parts = _record_parts(root)
    done = _invoke("--profile", "smoke", "--out", str(root), "--quiet")
    assert done.exit_code == 0, done.output
    assert done.output.count("done before") == len(PARTS)
    after = json.loads((root / "reproduce.json").read_text())
    assert [p["seconds"] for p in after["parts"].values()] == [p["seconds"] for p in before["parts"].values()]
    assert _record_parts(root) == n_parts


def test_terminated_run_records_the_interrupted_part_and_its_cost(tmp_path):
    """`kill` (SIGTERM) is how a background run is stopped: the running part is marked
    interrupted with the seconds it cost, and a rerun resumes it."""
    import os
    import signal
    import subprocess
    import sys

    root = tmp_path / "root"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "rnr_interp.cli", "reproduce", "--profile", "smoke", "--out", str(root),
                             "--parts", "2_routing", "--quiet"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        for line in proc.stdout:
            if line.startswith("2_routing:"):
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) != 0
    finally:
        proc.kill()
    entry = json.loads((root / "reproduce.json").read_text())["parts"]["2_routing"]
    assert entry["status"] == "failed" and entry["error"] == "interrupted" and entry["seconds"] >= 1.0
    # what was finished by then still reaches the findings and the index
    rows = {r["claim"]: r for r in json.loads((root / "findings.json").read_text())}
    assert rows["random >= structured search in every clean cell"]["verdict"] == NOT_TESTABLE
    assert "2_routing" in (root / "index.html").read_text()


def test_routing_part_stopped_in_a_later_task_keeps_the_table_of_the_finished_ones(tmp_path, monkeypatch):
    from dataclasses import replace

    from rnr_interp.reproduce.parts import Context, routing_part
    from rnr_interp.analyses.routing import run as audit

    real, calls = audit.run_route_audit, []

    def stop_at_second(lm, task, out, cfg, **kw):
        calls.append(out.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(lm, task, out, cfg, **kw)

    monkeypatch.setattr(audit, "run_route_audit", stop_at_second)
    profile = replace(SMOKE, route_tasks=(SMOKE.route_tasks[0], "arithmetic_mc"))
    folder = tmp_path / "2_routing"
    with pytest.raises(KeyboardInterrupt):
        routing_part(Context(profile, tmp_path), folder)
    assert calls == list(profile.route_tasks)
    summary = RunDir(folder / "route_cells").read_summary()
    assert summary.runs == [str(RunDir(folder / SMOKE.route_tasks[0]).path)]


def test_another_profile_on_the_same_root_is_refused(smoke):
    root, _ = smoke
    before = (root / "reproduce.json").read_text()
    done = _invoke("--profile", "demo", "--out", str(root), "--quiet")
    assert done.exit_code == 2
    assert "made with profile 'smoke'" in done.output and "audit_n" in done.output
    assert (root / "reproduce.json").read_text() == before


@pytest.mark.parametrize("args, message", [
    (("--profile", "huge"), "unknown profile 'huge'"),
    (("--profile", "smoke", "--parts", "9_magic"), "unknown part '9_magic'"),
    (("--profile", "smoke", "--checkpoint", "grpo"), "RECIPE=DIR"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, args, message):
    done = _invoke(*args, "--out", str(tmp_path / "r"))
    assert done.exit_code == 2 and message in done.output
    assert not (tmp_path / "r").exists()


def test_an_out_that_is_a_file_is_refused(tmp_path):
    a_file = tmp_path / "taken"
    a_file.write_text("not a folder")
    done = _invoke("--profile", "smoke", "--out", str(a_file))
    assert done.exit_code == 2 and str(a_file) in done.output
    assert a_file.read_text() == "not a folder"


# -- verdicts ----------------------------------------------------------------------------


def test_interval_verdicts():
    assert at_least(0.8, (0.6, 0.9), 0.5)[0] == REPRODUCED
    assert at_least(0.3, (0.1, 0.45), 0.5)[0] == NOT_REPRODUCED
    assert at_least(0.6, (0.3, 0.8), 0.5)[0] == NOT_TESTABLE
    assert at_most(-0.1, (-0.2, 0.0), 0.0)[0] == REPRODUCED
    assert at_most(0.2, (0.05, 0.3), 0.0)[0] == NOT_REPRODUCED


def _route_run(path: Path, oracle: dict[str, dict[str, float]], excluded=()) -> None:
    """A route run's tables as the routing analysis writes them (one cell per key)."""
    run = RunDir.create(path, {"kind": "route"})
    rows = []
    for cell, by in oracle.items():
        model, task, space = cell.split("/")
        for m, v in by.items():
            diff = by["random"] - v
            rows.append({"cell": cell, "model": model, "task": task, "space": space, "method": m, "oracle": v,
                         "random_minus": diff if m != "random" else 0.0, "random_minus_lo": diff - 0.1,
                         "random_minus_hi": diff + 0.1, "k": 32, "n_questions": 40, "deployed": 0.1, "excluded": cell in excluded,
                         "unparsed_rate": 0.9 if cell in excluded else 0.1, "matched_control": "",
                         **dict.fromkeys(("random_minus_two_way_lo", "random_minus_two_way_hi", "matched_minus", "matched_minus_lo",
                                          "matched_minus_hi", "matched_minus_two_way_lo", "matched_minus_two_way_hi"), float("nan"))})
    run.write_table("route_cells", pd.DataFrame(rows))
    run.write_table("selectors", pd.DataFrame(
        [{"cell": c, "selector": "majority", "source": "routes", "gap_recovery": 0.05} for c in oracle]))
    run.write_summary({"kind": "route", "model": "m", "task": "t", "k": 32, "budget": 32, "n_questions": 40, "deployed": 0.1,
                       "deployed_ci": [0.0, 0.2], "cells": {}, "temperature": {}, "excluded_cells": list(excluded),
                       "oracle_at_k": {}, "selectors": {}})


def _aggregate(folder: Path) -> None:
    from rnr_interp.analyses.routing.cells import write_route_cells

    write_route_cells(folder, folder / "route_cells")


def test_routing_verdict_follows_the_cells(tmp_path):
    good = {"a/x/native": {"random": 0.6, "mcts": 0.4, "hill_climb": 0.5, "genetic": 0.6}}
    _route_run(tmp_path / "ok" / "x", good)
    assert routing_findings(tmp_path / "ok")[0].verdict == NOT_TESTABLE  # not aggregated yet
    _aggregate(tmp_path / "ok")
    rows = routing_findings(tmp_path / "ok")
    assert rows[0].verdict == REPRODUCED and rows[1].verdict == REPRODUCED
    # one cell where hill climbing reaches more: not reproduced; a collapsed cell is left out
    bad = {**good, "a/y/native": {"random": 0.3, "mcts": 0.2, "hill_climb": 0.5, "genetic": 0.1},
           "b/z/polar": {"random": 0.0, "mcts": 0.9, "hill_climb": 0.9, "genetic": 0.9}}
    _route_run(tmp_path / "bad" / "x", bad, excluded=("b/z/polar",))
    _aggregate(tmp_path / "bad")
    row = routing_findings(tmp_path / "bad")[0]
    assert row.verdict == NOT_REPRODUCED and row.value == pytest.approx(-0.2) and "b/z/polar" in row.why
    assert row.ci == pytest.approx((-0.3, -0.1))
    assert "random >= every search in 1 of 2 clean model-task cells" in row.measured
    assert "native 5/6" in row.measured and "with format-collapse cells kept: 1 of 3" in row.measured
    # an exclusion that decides the verdict gives none
    flips = {**good, "b/z/polar": {"random": 0.0, "mcts": 0.9, "hill_climb": 0.9, "genetic": 0.9}}
    _route_run(tmp_path / "flips" / "x", flips, excluded=("b/z/polar",))
    _aggregate(tmp_path / "flips")
    row = routing_findings(tmp_path / "flips")[0]
    assert row.verdict == NOT_TESTABLE and "exclusion decides" in row.why
    # cells where every oracle equals greedy test nothing: no verdict from them
    flat = {"a/x/native": {"random": 0.1, "mcts": 0.1, "hill_climb": 0.1, "genetic": 0.1}}
    _route_run(tmp_path / "flat" / "x", flat)
    _aggregate(tmp_path / "flat")
    row = routing_findings(tmp_path / "flat")[0]
    assert row.verdict == NOT_TESTABLE and "1 untested" in row.why


#: the fields every localisation summary has (`records.CohortSummary`), for hand-made runs
COHORT = {"model": "m", "task": "t", "n_questions": 40, "n_failure": 10, "n_panel": 10}


def _compare_run(path: Path, gained_reachable: int, gained_unreachable: int, o_change: float, ci,
                 shared_prompt: dict | None = None) -> None:
    run = RunDir.create(path, {"kind": "compare"})
    stats = {"D": {"base": 0.2, "trained": 0.5, "change": 0.3, "change_ci": [0.1, 0.5]},
             "O_K": {"base": 0.5, "trained": 0.5 + o_change, "change": o_change, "change_ci": list(ci)}}
    run.write_summary({"kind": "compare", "base_model": "m", "trained_model": "m2", "task": "t", "n_questions": 60, "k": 16,
                       "stats": stats,
                       "gained_from": {"base_reachable": gained_reachable, "base_unreachable": gained_unreachable},
                       **({"shared_prompt": shared_prompt} if shared_prompt else {})})


def test_source_of_gains_is_judged_at_the_controls_largest_budget_with_its_trend(tmp_path):
    _compare_run(tmp_path / "compare_grpo", 8, 23, -0.15, (-0.25, -0.05))
    run = RunDir(tmp_path / "compare_grpo")
    curve = [{"k": k, "base_reachable": hit, "n_gained": 31, "share": hit / 31, "ci": [hit / 31 - 0.1, min(hit / 31 + 0.1, 1.0)]}
             for k, hit in ((16, 9), (32, 14), (256, 29))]
    run.write_summary(run.read_summary().but(budget_control={"gained_source": {
        "n_gained": 31, "curve": curve, "trend": "rises from 0.29 at K=16 to 0.94 [0.84, 1.00] at K=256"}}))
    reach = checkpoint_findings(tmp_path)[0]
    assert reach.n == 31 and reach.value == pytest.approx(29 / 31) and "at K=256" in reach.measured
    assert "rises from 0.29" in reach.measured and "K=16 0.29, K=32 0.45, K=256 0.94" in reach.measured
    assert "the audit at K=16: 8 of 31" in reach.measured and reach.verdict == REPRODUCED


def test_checkpoint_verdicts_follow_the_comparisons(tmp_path):
    _compare_run(tmp_path / "compare_grpo", 30, 0, -0.15, (-0.25, -0.05))
    _compare_run(tmp_path / "compare_sft", 5, 20, 0.2, (0.1, 0.3))
    reach, shrink, widen, *prompt = checkpoint_findings(tmp_path)
    assert (reach.verdict, shrink.verdict, widen.verdict) == (REPRODUCED, REPRODUCED, REPRODUCED)
    assert reach.n == 30 and reach.value == 1.0
    assert [p.verdict for p in prompt] == [NOT_TESTABLE, NOT_TESTABLE]
    _compare_run(tmp_path / "other" / "compare_grpo", 8, 23, 0.4, (0.24, 0.54))
    reach, shrink, widen, _ = checkpoint_findings(tmp_path / "other")
    assert (reach.verdict, shrink.verdict, widen.verdict) == (NOT_REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE)
    assert "no SFT comparison" in widen.why
    # the prompt-format control's share retained is shown, with its reason, and judged on nothing
    shared = {"D": {"shared_change": 0.1, "shared_change_ci": [0.0, 0.2], "native_change": 0.3, "share_retained": 1 / 3}}
    _compare_run(tmp_path / "format" / "compare_grpo", 30, 0, -0.15, (-0.25, -0.05), shared_prompt=shared)
    *_, prompt = checkpoint_findings(tmp_path / "format")
    assert prompt.verdict == REPORTED and prompt.value == pytest.approx(1 / 3) and "no interval of its own" in prompt.why


def _steer_run(path: Path, rates: dict[tuple[str, float], float], n: int = 10, unit: str = "raw",
               random: dict[tuple[str, float], float] | None = None) -> None:
    run = RunDir.create(path, {"kind": "steer", "alpha_unit": unit})

    def table(rates):
        return pd.DataFrame([{"alpha": a, "direction": d, "rate": r, "lo": max(r - 0.3, 0.0), "hi": min(r + 0.3, 1.0),
                              "k": round(r * n), "n": n} for (d, a), r in rates.items()])

    run.write_table("steering", table(rates))
    control = {}
    if random is not None:
        run.write_table("steering_random", table(random))
        control = {"random_control": {"seed": 0, "norm": 1.0, "cosine_with_v": 0.0, "table": table(random).to_dict("records")}}
    run.write_summary({"kind": "steer", **COHORT, "layer": 3, "v_norm": 2.5, "residual_rms": 10.0, **control})


def test_steering_flips_that_a_random_direction_of_the_same_length_gives_too_are_not_v_s(tmp_path):
    rates = {("rescue", 1.0): 0.95, ("induction", 0.5): 0.95}
    _steer_run(tmp_path / "alone", rates, n=40, unit="rms")
    alone = _steering_finding(tmp_path / "alone", "m / t")
    assert alone.verdict == REPRODUCED and "no random-direction control" in alone.measured
    _steer_run(tmp_path / "quiet", rates, n=40, unit="rms", random={("rescue", 1.0): 0.0, ("induction", 0.5): 0.1})
    quiet = _steering_finding(tmp_path / "quiet", "m / t")
    assert quiet.verdict == REPRODUCED and "(a random direction of the same length: 0.10)" in quiet.measured
    # the induction a random push gives as well is not v's: no verdict for it, and so none for the claim
    _steer_run(tmp_path / "any", rates, n=40, unit="rms", random={("rescue", 1.0): 0.0, ("induction", 0.5): 0.9})
    any_push = _steering_finding(tmp_path / "any", "m / t")
    assert any_push.verdict == NOT_TESTABLE and "a random direction of the same length flips 0.90 at +0.5 RMS" in any_push.why
    assert "rescue: the whole interval is at or above" in any_push.why  # the rescue stands on its own


def test_steering_is_judged_at_the_papers_alphas_not_the_best_of_the_grid(tmp_path):
    """The rates exist on the held-out questions only: the best alpha over the grid,
    picked on them, would flatter the verdict. -8v and +4v are judged; the best is shown."""
    lucky = {("rescue", 2.0): 0.9, ("rescue", 8.0): 0.1, ("induction", 4.0): 0.9, ("induction", 8.0): 0.2}
    _steer_run(tmp_path / "lucky", lucky)
    row = _steering_finding(tmp_path / "lucky", "m / t")
    assert row.verdict == NOT_REPRODUCED and row.value == pytest.approx(0.1)
    assert "rescue 0.10" in row.measured and "at -8v" in row.measured and "rescue 0.90 at -2v" in row.measured
    # a grid without 8: its largest alpha is judged
    _steer_run(tmp_path / "small", {("rescue", 1.0): 0.0, ("rescue", 2.0): 0.95, ("induction", 2.0): 0.95})
    row = _steering_finding(tmp_path / "small", "m / t")
    assert "rescue 0.95 [0.65, 1.00] of 10 at -2v" in row.measured and row.verdict != NOT_REPRODUCED
    assert "judged at -2v and +2v" in row.why


def test_steering_on_the_rms_scale_is_judged_at_alphas_fixed_in_advance_with_power(tmp_path):
    rates = {("rescue", 0.5): 0.9, ("rescue", 1.0): 0.2, ("induction", 0.5): 0.1, ("induction", 2.0): 0.9}
    _steer_run(tmp_path / "rms", rates, n=20, unit="rms")
    row = _steering_finding(tmp_path / "rms", "m / t")
    assert "rescue 0.20" in row.measured and "at -1 RMS" in row.measured and "induction 0.10" in row.measured
    assert "at +0.5 RMS" in row.measured and "does not give the scale of v" in row.why and "power" in row.why
    assert row.verdict == NOT_REPRODUCED
    # 3 held-out questions: the paper's 97.5% rescue is detected with probability < 0.8, so a miss is no verdict
    _steer_run(tmp_path / "few", rates, n=3, unit="rms")
    row = _steering_finding(tmp_path / "few", "m / t")
    assert row.verdict == NOT_TESTABLE and "not testable at this n" in row.why


def _repair_run(path: Path, repair: tuple[int, int], damage: tuple[int, int]) -> None:
    from rnr_interp.metrics import wilson_interval

    run = RunDir.create(path, {"kind": "repair"})
    entry = {"layer": 4, "component": "mlp"}
    for what, (k, n) in (("repair", repair), ("damage", damage)):
        entry[what] = {"rate": k / n, "ci": list(wilson_interval(k, n)), "k": k, "n": n,
                       "selection": {"rate": 1.0, "n": n}, "all": {"rate": 0.5, "n": 2 * n}}
    run.write_summary({"kind": "repair", **COHORT, "at_chosen_layer": {"mlp": entry}})


def test_repair_verdicts_carry_power_and_the_selection_and_all_question_rates(tmp_path):
    _repair_run(tmp_path / "few" / "cell" / "repair", (0, 6), (0, 6))
    row = localisation_findings(tmp_path / "few")[0]
    assert row.verdict == NOT_TESTABLE and "not testable at this n" in row.why
    assert "selection part (chose the block): repair 1.00 of 6" in row.measured and "all questions: repair 0.50 of 12" in row.measured
    _repair_run(tmp_path / "many" / "cell" / "repair", (10, 100), (1, 2000))
    row = localisation_findings(tmp_path / "many")[0]
    assert row.verdict == NOT_REPRODUCED and "power 0.96" in row.why


def test_a_repair_with_no_healthy_panel_says_damage_is_unmeasured(tmp_path):
    # the demo model under the circular protocol: a few letter-robust failures, no question right under every shift
    run = RunDir.create(tmp_path / "cell" / "repair", {"kind": "repair"})
    run.write_summary({"kind": "repair", **COHORT, "at_chosen_layer": {"mlp": None}, "n_failure": 5, "n_panel": 0,
                       "split": {"n_failure_selection": 3, "n_failure_heldout": 2},
                       "circular": {"on": True, "n_letter_locked": 21}})
    row = localisation_findings(tmp_path)[0]
    assert row.verdict == NOT_TESTABLE and "(circular)" in row.scope
    assert row.why.startswith("5 failures (3 choose, 2 held out) after 21 letter-locked recognised questions left out, "
                              "no healthy question (no deployed answer right under every shift of the options)")


# -- in a real browser ------------------------------------------------------------------


def test_index_renders_in_chromium_without_network(smoke, tmp_path):
    from rnr_interp.report.export import find_chromium, headless

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("Chromium absent (/usr/bin/chromium): install it with apt-get install -y chromium")
    root, _ = smoke
    page = root / "index.html"
    n_figures = len(re.findall(r'<figure data-name="', page.read_text()))
    done = headless(page.as_uri(), "--virtual-time-budget=10000", "--window-size=1280,4000", "--dump-dom",
                    f"--log-net-log={tmp_path / 'net.json'}", user_data_dir=tmp_path / "profile", chromium=chromium)
    dom = done.stdout
    assert n_figures >= 9 and dom.count('class="main-svg"') >= n_figures, done.stderr[-2000:]
    assert re.search(r'class="js-line"[^>]*d="M[\d.]+,[\d.]+L', dom), "lines have no path data"
    assert "Findings: the paper" in dom and dom.count('class="verdict"') == len(json.loads((root / "findings.json").read_text()))
    log = json.loads((tmp_path / "net.json").read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    fetched = [e["params"]["url"] for e in log["events"] if e["type"] == start and "url" in e.get("params", {})
               and e["params"].get("initiator") != "not an origin"]
    assert fetched == []


def test_index_is_written_when_a_part_failed_before_its_aggregate(tmp_path):
    """A part that failed early leaves its folder without the cross-cell aggregate or the
    screen; the index still writes (it once died on the missing folder, losing the page)."""
    from rnr_interp.report.reproduction import write_reproduction_report

    for part in PARTS:
        (tmp_path / part.name).mkdir()
    parts = {p.name: {"title": p.title, "status": "failed" if p.name == "2_routing" else "not run", "seconds": 1.0}
             for p in PARTS}
    page = write_reproduction_report(tmp_path, "smoke", "tiny-llama", {}, parts, [])
    assert page.is_file() and "2_routing" in page.read_text()
