"""The HTML report: what each kind of run folder shows, the sweep index, static images,
and the page as headless Chromium renders it (figures drawn, nothing fetched)."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rnr_interp.records import RunDir
from rnr_interp.report.export import export_figures, find_chromium, headless
from rnr_interp.report.figures import cell_difference, run_label
from rnr_interp.commands.report import report as report_command
from rnr_interp.report.html import build_index, build_page, write_report

ROUTE_METHODS = ("random", "mcts", "hill_climb", "genetic")


@pytest.fixture(scope="module")
def audit_run(tmp_path_factory) -> Path:
    from rnr_interp.analyses.audit import run_audit
    from rnr_interp.models import load_model
    from rnr_interp.engine.sampling import Probe
    from rnr_interp.tasks import load_task

    out = tmp_path_factory.mktemp("audit") / "run"
    run_audit(load_model("tiny-llama"), load_task("arithmetic", n=6), out, probe=Probe(k=4), progress=False)
    return out


def _copy(run: Path, dest: Path) -> RunDir:
    shutil.copytree(run, dest)
    return RunDir(dest)


def _route_tables(run: RunDir, prefix: str = "") -> None:
    """Route-run artefacts as the routing analysis writes them (artefact contract)."""
    rng = np.random.default_rng(0)
    budgets = [1, 4, 16, 64]
    run.write_table("route_curves", pd.DataFrame(
        [(m, b, min(1.0, 0.2 + 0.1 * i + 0.1 * np.log2(b))) for i, m in enumerate(ROUTE_METHODS) for b in budgets],
        columns=["method", "budget", "oracle"]))
    cells = [f"{prefix}cell{c}" for c in range(5)]
    run.write_table("route_cells", pd.DataFrame(
        [(c, m, float(rng.uniform()), c.endswith("cell4"), 0.1) for c in cells for m in ROUTE_METHODS],
        columns=["cell", "method", "oracle", "excluded", "unparsed_rate"]))
    run.write_table("selectors", pd.DataFrame(
        [(c, s, float(rng.uniform()), float(rng.uniform(-0.2, 1.0))) for c in cells for s in ("majority_vote", "confidence")],
        columns=["cell", "selector", "accuracy", "gap_recovery"]))


def _other_tables(run: RunDir) -> None:
    """Repair, steering, units and comparison artefacts, per the artefact contract."""
    run.write_table("repair", pd.DataFrame(
        [(l, comp, 0.1 * l, 0.05 * l, 10, 20) for l in range(3) for comp in ("mlp", "attn", "layer")],
        columns=["layer", "component", "repair_rate", "damage_rate", "n_failure", "n_panel"]))
    run.write_json("failure_set", {"question_ids": ["arith-0"], "criterion": "deployed wrong, reachable"})
    run.write_table("steering", pd.DataFrame(
        [(a, d, 0.1 * a, 6) for a in (0.0, 1.0, 2.0) for d in ("rescue", "induction")], columns=["alpha", "direction", "rate", "n"]))
    run.write_table("units", pd.DataFrame(
        [(k, sel, k / 8) for k in (1, 2, 4, 8) for sel in ("top", "random")], columns=["k", "selection", "recovered_fraction"]))


@pytest.fixture(scope="module")
def full_run(audit_run, tmp_path_factory) -> Path:
    run = _copy(audit_run, tmp_path_factory.mktemp("full") / "run")
    _route_tables(run)
    _other_tables(run)
    return run.path


def _without_scripts(page: str) -> str:
    return re.sub(r"<script\b.*?</script>", "", page, flags=re.S)


def _figure_names(page: str) -> list[str]:
    return re.findall(r'<figure data-name="([^"]+)"', page)


# -- content -------------------------------------------------------------------------


def test_audit_only_report_shows_only_what_exists(audit_run, tmp_path):
    page = write_report(audit_run, tmp_path).read_text()
    summary = RunDir(audit_run).read_summary()
    assert _figure_names(page) == ["pass_at_k", "hit_counts"]
    visible = _without_scripts(page)
    for absent in ("Routing", "Repair", "Checkpoint comparison", "Other artefacts", "Static images", "failed"):
        assert absent not in visible
    # the audit table, with the summary's numbers
    assert f"{summary.D:.3f} [{summary.D_ci[0]:.3f}, {summary.D_ci[1]:.3f}]" in page
    assert f"{summary.gap:.3f} [{summary.gap_ci[0]:.3f}, {summary.gap_ci[1]:.3f}]" in page
    # one drill-down row per question, with the question text reloaded from the manifest's task
    from rnr_interp.tasks import load_task

    for q in load_task("arithmetic", n=6).questions:
        assert f"<b>{q.id}</b><br>{q.text}" in page
    assert page.count("/ 4</td>") == 6
    # plotly.js inline exactly once, and no tag outside scripts pointing off the machine
    assert page.count("* plotly.js v") == 1
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", _without_scripts(page))


def test_every_section_the_run_holds_is_shown(full_run, tmp_path):
    page = write_report(full_run, tmp_path).read_text()
    names = _figure_names(page)
    assert names[:2] == ["pass_at_k", "hit_counts"]
    assert {"route_curves", "route_cell_difference", "selector_recovery"} <= set(names)
    # model, task and budget in every title
    run = RunDir(full_run)
    label = run_label(run.config, run.read_summary())
    assert label == "tiny-llama · arithmetic (6 q) · K=4, T=1"  # the probes' one default temperature
    ours = {"pass_at_k", "hit_counts", "route_curves", "route_cell_difference", "selector_recovery"}
    for name, fig in build_page(run)[1]:
        if name in ours:
            assert fig.layout.title.text.endswith(f"<sup>{label}</sup>"), name
    # repair, steering and units: drawn through the report's registry
    assert {"selectivity_heatmap", "steering_curves", "units_curve"} <= set(names)
    assert "failure_set.json" in _without_scripts(page)


def test_the_steering_figure_draws_the_random_direction_dashed_beside_v():
    from rnr_interp.report.repair_figures import steering_curves

    rows = [{"alpha": a, "direction": d, "rate": r, "lo": max(r - 0.2, 0), "hi": min(r + 0.2, 1), "n": 6}
            for a, r in ((0.0, 0.0), (1.0, 0.8)) for d in ("rescue", "induction")]
    table = pd.DataFrame(rows)
    random = table.assign(rate=[0.0, 0.0, 0.0, 1.0])
    alone, beside = steering_curves(table, "t", "rms"), steering_curves(table, "t", "rms", random)
    assert len(alone.data) == 2 and len(beside.data) == 4
    dashed = [t for t in beside.data if t.line.dash == "dash"]
    assert [t.name for t in dashed] == ["rescue along a random direction, n=6", "induction along a random direction, n=6"]
    assert list(dashed[1].y) == [0.0, 1.0] and all(t.error_y.array is None for t in dashed)


def test_cell_difference_is_random_minus_each_structured_method_over_kept_cells():
    cells = pd.DataFrame({
        "cell": ["a", "a", "a", "b", "b", "b", "c", "c"],
        "method": ["random", "mcts", "genetic"] * 2 + ["random", "mcts"],
        "oracle": [0.5, 0.7, 0.4, 0.9, 0.6, 0.9, 0.2, 0.8],
        "excluded": [False] * 6 + [True, True],
    })
    diff = cell_difference(cells).set_index(["method", "cell"])["diff"]
    assert diff.to_dict() == pytest.approx({("mcts", "a"): -0.2, ("genetic", "a"): 0.1,
                                            ("mcts", "b"): 0.3, ("genetic", "b"): 0.0})
    assert cell_difference(cells[cells["method"] != "random"]).empty


def test_question_text_degrades_when_the_task_cannot_be_reloaded(audit_run, tmp_path):
    run = _copy(audit_run, tmp_path / "run")
    manifest = json.loads((run.path / "manifest.json").read_text())
    manifest["config"]["task"]["source"] = "hf:some/dataset@test"
    (run.path / "manifest.json").write_text(json.dumps(manifest))
    page, _ = build_page(RunDir(run.path))
    assert "question text unavailable (task source hf:some/dataset@test is not a file here)" in page
    assert "<b>arith-0</b>" in page and "What is" not in page


def test_unfinished_run_without_records_gives_a_plain_page(tmp_path):
    run = RunDir.create(tmp_path / "run", {"kind": "audit", "model": "tiny-llama", "task": {"name": "arithmetic"}})
    page, figures = build_page(run)
    assert figures == [] and "<figure" not in page
    assert "the run has not finished" in page


def test_sweep_gets_an_index_linking_each_run(audit_run, tmp_path):
    for name in ("a", "b/c"):
        _route_tables(_copy(audit_run, tmp_path / "sweep" / name), prefix=f"{name}/")
    index = write_report(tmp_path / "sweep", tmp_path / "out")
    assert index == tmp_path / "out" / "index.html"
    text = index.read_text()
    links = re.findall(r'<a href="([^"]+)">', text)
    assert links == ["a/report.html", "b/c/report.html"]
    for link in links:
        page = (index.parent / link).read_text()
        back = re.search(r'<a href="([^"]+)">← all runs', page).group(1)
        assert (index.parent / link).parent.joinpath(back).resolve() == index.resolve()
    # the routing figures over the cells of both runs (4 kept each), on the index
    assert _figure_names(text) == ["route_curves", "route_cell_difference", "selector_recovery"]
    _, figures = build_index([(RunDir(tmp_path / "sweep" / n), "") for n in ("a", "b/c")], tmp_path / "sweep")
    differences = dict(figures)["route_cell_difference"].data
    assert [len(bars.x) for bars in differences] == [8, 8, 8]  # mcts, hill_climb, genetic


def test_report_command(audit_run, tmp_path):
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command("report")(report_command)
    app.command("other")(lambda: None)  # two commands, so typer keeps the subcommand name
    ok = CliRunner().invoke(app, ["report", str(audit_run), "--out", str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "report.html").is_file() and str(tmp_path / "report.html") in ok.output
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2 and "is not a folder" in bad.output


# -- in a real browser ------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("Chromium absent (/usr/bin/chromium): install it with apt-get install -y chromium")
    return path


def _page_requests(net_log: Path) -> list[str]:
    """URLs the page itself requested, from a Chromium net log. Chromium's own
    background requests have no initiator ("not an origin"); the page's have its origin."""
    log = json.loads(net_log.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [e["params"]["url"] for e in log["events"]
            if e["type"] == start and "url" in e.get("params", {}) and e["params"].get("initiator") != "not an origin"]


def _open(chromium: str, page: Path, tmp: Path, *flags: str):
    return headless(page.as_uri(), "--virtual-time-budget=10000", "--window-size=1280,4000", *flags,
                    f"--log-net-log={tmp / 'net.json'}", user_data_dir=tmp / "profile", chromium=chromium)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_report_renders_in_chromium_without_network(full_run, chromium, tmp_path):
    page = write_report(full_run, tmp_path / "out")
    n_figures = len(_figure_names(page.read_text()))
    done = _open(chromium, page, tmp_path, "--dump-dom")
    dom = done.stdout
    # plotly drew every figure: one main-svg pair per plot, traces of each kind with data
    assert dom.count('class="main-svg"') >= n_figures, done.stderr[-2000:]
    assert len(re.findall(r'class="trace scatter', dom)) >= 2
    assert len(re.findall(r'class="trace bars', dom)) >= 2
    assert 'class="trace boxes' in dom
    assert re.search(r'class="js-line"[^>]*d="M[\d.]+,[\d.]+L', dom), "scatter lines have no path data"
    assert re.search(r'<g class="point"><path d="M[\d.]+,[\d.]+V', dom), "bars have no path data"
    assert _page_requests(tmp_path / "net.json") == []

    shot = tmp_path / "report.png"
    done = _open(chromium, page, tmp_path, f"--screenshot={shot}")
    assert shot.is_file(), done.stderr[-2000:]
    assert _png_size(shot) == (1280, 4000)
    # A blank page of that size compresses to a few kB; the drawn report is far larger.
    assert shot.stat().st_size > 100_000


def test_net_log_check_catches_a_page_that_fetches(chromium, tmp_path):
    page = tmp_path / "fetching.html"
    page.write_text('<img src="https://cdn.example.org/x.png"><script>fetch("http://example.net/y")</script>')
    _open(chromium, page, tmp_path, "--dump-dom")
    assert sorted(_page_requests(tmp_path / "net.json")) == ["http://example.net/y", "https://cdn.example.org/x.png"]


def test_images_are_exported_offline(full_run, chromium, tmp_path):
    page = write_report(full_run, tmp_path / "out", images=True)
    names = _figure_names(page.read_text())
    folder = page.parent / "figures"
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{n}.{ext}" for n in names for ext in ("svg", "png"))
    svg = (folder / "route_curves.svg").read_text()
    assert svg.startswith("<svg") and 'class="main-svg"' in svg and "Route-search oracle and deployable vote vs budget" in svg
    assert _png_size(folder / "pass_at_k.png") == (2 * 820, 2 * 460)
    assert 'href="figures/pass_at_k.svg"' in page.read_text()


def test_export_of_nothing_writes_nothing(tmp_path):
    assert export_figures([], tmp_path / "figs") == []
    assert not (tmp_path / "figs").exists()


def test_a_figure_module_that_fails_costs_only_its_figures(tmp_path):
    run = RunDir.create(tmp_path / "run", {"kind": "compare", "model": "tiny-llama", "task": {"name": "arithmetic"}})
    run.write_table("transitions", pd.DataFrame({"question_id": ["q0"], "realized": ["gained"]}))  # no base_reachable
    run.write_summary({"kind": "compare", "base_model": "m", "trained_model": "m2", "task": "arithmetic", "k": 4,
                       "n_questions": 1, "gained_from": {}, "stats": {}})  # no stats
    with pytest.warns(UserWarning, match="Checkpoint comparison figures failed"):
        page, figures = build_page(run)
    assert figures == []
    assert "Drawing these figures failed (KeyError(" in page
    assert "<h3>transitions</h3>" in page.split("<h2>Other artefacts</h2>")[1]


def test_all_cells_collapsed_are_shown_flagged_not_as_empty_panels():
    from rnr_interp.report.figures import routing_figures_of

    curves = pd.DataFrame({"cell": ["a"] * 4 + ["b"] * 4, "method": ["random", "random", "mcts", "mcts"] * 2,
                           "budget": [1, 2] * 4, "oracle": [0.2, 0.3, 0.2, 0.5] * 2})
    cells = pd.DataFrame({"cell": ["a", "a", "b", "b"], "method": ["random", "mcts"] * 2,
                          "oracle": [0.3, 0.5, 0.3, 0.5], "excluded": [True] * 4, "unparsed_rate": [0.9] * 4})
    figs = dict(routing_figures_of(curves, cells, None, 0.2, "m · t"))
    assert all(len(trace.y) for trace in figs["route_curves"].data)
    assert "FLAGGED" in figs["route_curves"].layout.title.text
    assert "route_cell_difference" in figs
    # With one cell kept, the collapsed one stays out of the comparison.
    cells.loc[cells.cell == "b", "excluded"] = False
    figs = dict(routing_figures_of(curves, cells, None, 0.2, "m · t"))
    assert "FLAGGED" not in figs["route_curves"].layout.title.text


def test_the_steering_figure_draws_the_induced_failure_dotted_where_the_run_read_it():
    from rnr_interp.report.repair_figures import steering_curves

    nan = float("nan")
    table = pd.DataFrame([{"alpha": a, "direction": d, "rate": r, "lo": 0.0, "hi": 1.0, "n": 4,
                           "as_failure_rate": f if d == "induction" else nan}
                          for a, r, f in ((0.0, 0.0, 0.0), (1.0, 1.0, 0.25)) for d in ("rescue", "induction")])
    random = table.assign(as_failure_rate=[nan, 0.0, nan, 0.0])
    fig = steering_curves(table, "t", "raw", random)
    dotted = {t.line.dash: t for t in fig.data if t.line.dash in ("dot", "dashdot")}
    assert set(dotted) == {"dot", "dashdot"} and list(dotted["dot"].y) == [0.0, 0.25]
    assert dotted["dot"].name == "induction (panel, +alpha v): to an answer the failure set gave, n=4"
    assert len(steering_curves(table.drop(columns="as_failure_rate"), "t", "raw").data) == 2  # a run from before: none


def test_the_steering_figure_draws_the_clamp_control_as_levels_without_an_alpha():
    from rnr_interp.report.repair_figures import steering_curves

    table = pd.DataFrame([{"alpha": a, "direction": d, "rate": a / 2, "lo": 0.0, "hi": 1.0, "n": 4}
                          for a in (0.0, 1.0) for d in ("rescue", "induction")])
    clamp = pd.DataFrame([{"clamped": c, "rank": k, "way": w, "rate": r, "n": n}
                          for c, k, w, r, n in (("v", 1, "rescue", 0.0, 4), ("span", 3, "rescue", 0.75, 4),
                                                ("span", 3, "damage", 0.5, 2), ("random", 3, "damage", 1 / 3, 3))])
    fig = steering_curves(table, "t", "rms", clamp=clamp)
    levels = sorted((shape.y0, shape.line.dash) for shape in fig.layout.shapes)
    assert levels == [(0.0, "dashdot"), (1 / 3, "dot"), (0.5, "longdash"), (0.75, "longdash")]
    notes = {a.text for a in fig.layout.annotations}
    assert "write clamped within the failures' span (rank 3): rescue 0.75 (n=4)" in notes
    assert "write clamped along v (rank 1): rescue 0.00 (n=4)" in notes
    assert "write clamped within a random span (rank 3): damage 0.33 (n=3)" in notes
    assert len(fig.data) == 2 and not steering_curves(table, "t", "rms").layout.shapes  # no clamp control: no levels
