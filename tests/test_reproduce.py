"""`rnr reproduce`: the smoke profile end to end on tiny models (every part's run folders,
resume, the findings table, the index page in headless Chromium), and the findings'
verdict rules on run folders built to make each verdict come out."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from rnr_interp.cli import app
from rnr_interp.records import RunDir, load_runs
from rnr_interp.reproduce.findings import (
    NOT_REPRODUCED, NOT_TESTABLE, REPRODUCED, at_least, at_most, checkpoint_findings, findings, routing_findings,
)
from rnr_interp.reproduce.parts import PARTS
from rnr_interp.reproduce.profiles import SMOKE

#: part -> the kinds of finished run folders the smoke profile leaves there
EXPECTED_KINDS = {
    "1_audit": {"audit"}, "2_routing": {"route"}, "3_temperature": {"audit"},
    "4_localisation": {"failures", "repair", "steer", "units"}, "5_checkpoints": {"audit", "compare"},
}


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
    # the routing part: one cell per task x space, each with every method
    cells = pd.concat([r.read_table("route_cells") for r in load_runs(root / "2_routing")])
    assert cells["cell"].nunique() == len(SMOKE.route_tasks) * len(SMOKE.spaces)
    assert set(cells["method"]) >= set(SMOKE.methods)
    # the temperature part: one audit per temperature
    temps = sorted(r.config["probe"]["temperature"] for r in load_runs(root / "3_temperature"))
    assert temps == sorted(SMOKE.temperatures)
    # the screen is written, and the cells that pass it are localised
    screen = json.loads((root / "4_localisation" / "screen.json").read_text())
    assert [row["cell"].split(" / ")[1] for row in screen] == list(SMOKE.screen_tasks)
    for row in screen:
        cell = root / "4_localisation" / row["cell"].split(" / ")[1]
        assert (cell / "repair" / "summary.json").is_file() == row["passes"]
    # the checkpoint part: a checkpoint per recipe, trained, audited and compared with the budget control
    for recipe in SMOKE.recipes:
        assert (root / "5_checkpoints" / "checkpoints" / recipe / "finetune.json").is_file()
        compare = RunDir(root / "5_checkpoints" / f"compare_{recipe}").read_summary()
        assert compare["budget_control"] is not None


def test_cost_per_part_is_printed_and_recorded(smoke):
    root, done = smoke
    state = json.loads((root / "reproduce.json").read_text())
    for part in PARTS:
        line = re.search(rf"^\s+{part.name}\s+done\s+(\d+) s", done.output, flags=re.M)
        assert line, done.output
        assert int(line.group(1)) == round(state["parts"][part.name]["seconds"])


def test_findings_are_read_from_the_run_folders(smoke):
    root, done = smoke
    rows = json.loads((root / "findings.json").read_text())
    assert rows == json.loads(json.dumps(_as_json(findings(root))))
    claims = {r["claim"] for r in rows}
    assert len(claims) == 7  # routing, selectors, repair, steering, RLVR reachable, RLVR shrink, SFT widen
    assert all(r["verdict"] in (REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE) and r["why"] for r in rows)
    # the routing row counts the cells the routing part wrote
    routing = next(r for r in rows if r["claim"].startswith("random >= structured"))
    assert routing["scope"] == f"{len(SMOKE.route_tasks) * len(SMOKE.spaces)} clean cells" or routing["verdict"] == NOT_TESTABLE
    for r in rows:
        assert f"[{r['verdict']}]" in done.output


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
    assert {"task_curves", "route_curves", "route_cell_difference", "temperature_gap", "failure_screen",
            "checkpoint_change", "checkpoint_propensity", "grpo_transitions", "sft_transitions"} <= names, names
    assert page.count('class="verdict"') == 7


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
    run = RunDir.create(path, {"kind": "route"})
    run.write_table("route_cells", pd.DataFrame(
        [{"cell": c, "method": m, "oracle": v, "excluded": c in excluded} for c, by in oracle.items() for m, v in by.items()]))
    run.write_table("selectors", pd.DataFrame(
        [{"cell": c, "selector": "majority", "source": "routes", "gap_recovery": 0.05} for c in oracle]))
    run.write_summary({"kind": "route"})


def test_routing_verdict_follows_the_cells(tmp_path):
    good = {"a/x/native": {"random": 0.6, "mcts": 0.4, "hill_climb": 0.5, "genetic": 0.6}}
    _route_run(tmp_path / "ok" / "x", good)
    rows = routing_findings(tmp_path / "ok")
    assert rows[0].verdict == REPRODUCED and rows[1].verdict == REPRODUCED
    # one cell where hill climbing reaches more: not reproduced; a collapsed cell is left out
    bad = {**good, "a/y/native": {"random": 0.3, "mcts": 0.2, "hill_climb": 0.5, "genetic": 0.1},
           "a/z/polar": {"random": 0.0, "mcts": 0.9, "hill_climb": 0.9, "genetic": 0.9}}
    _route_run(tmp_path / "bad" / "x", bad, excluded=("a/z/polar",))
    row = routing_findings(tmp_path / "bad")[0]
    assert row.verdict == NOT_REPRODUCED and row.value == pytest.approx(-0.2) and "a/z/polar" in row.why
    assert "5 of 6" in row.measured


def _compare_run(path: Path, gained_reachable: int, gained_unreachable: int, o_change: float, ci) -> None:
    run = RunDir.create(path, {"kind": "compare"})
    stats = {"D": {"base": 0.2, "trained": 0.5, "change": 0.3, "change_ci": [0.1, 0.5]},
             "O_K": {"base": 0.5, "trained": 0.5 + o_change, "change": o_change, "change_ci": list(ci)}}
    run.write_summary({"kind": "compare", "base_model": "m", "task": "t", "n_questions": 60, "k": 16, "stats": stats,
                       "gained_from": {"base_reachable": gained_reachable, "base_unreachable": gained_unreachable}})


def test_checkpoint_verdicts_follow_the_comparisons(tmp_path):
    _compare_run(tmp_path / "compare_grpo", 30, 0, -0.15, (-0.25, -0.05))
    _compare_run(tmp_path / "compare_sft", 5, 20, 0.2, (0.1, 0.3))
    reach, shrink, widen = checkpoint_findings(tmp_path)
    assert (reach.verdict, shrink.verdict, widen.verdict) == (REPRODUCED, REPRODUCED, REPRODUCED)
    assert reach.n == 30 and reach.value == 1.0
    _compare_run(tmp_path / "other" / "compare_grpo", 8, 23, 0.4, (0.24, 0.54))
    reach, shrink, widen = checkpoint_findings(tmp_path / "other")
    assert (reach.verdict, shrink.verdict, widen.verdict) == (NOT_REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE)
    assert "no SFT comparison" in widen.why


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
    assert "Findings: the paper" in dom and dom.count('class="verdict"') == 7
    log = json.loads((tmp_path / "net.json").read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    fetched = [e["params"]["url"] for e in log["events"] if e["type"] == start and "url" in e.get("params", {})
               and e["params"].get("initiator") != "not an origin"]
    assert fetched == []
