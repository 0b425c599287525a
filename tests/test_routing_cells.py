"""Cross-cell aggregation of route runs into the paper's Experiment 1 table."""

import pandas as pd
import pytest

from rnr_interp.records import RunDir, RunFolderError
from rnr_interp.analyses.routing.cells import aggregate_route_cells, route_runs, write_route_cells


def fake_route_run(path, task, spaces: dict, collapsed=(), matched: dict | None = None, deployed=0.2):
    """A route run folder with route_cells/selectors tables: spaces maps a space to
    (random, mcts, hill_climb, genetic) oracle@K and a majority gap recovery; matched
    maps a space to random_matched's oracle@K (absent: a run without it)."""
    run = RunDir.create(path, {"kind": "route", "task": {"name": task}})
    cells, sel = [], []
    for space, (oracles, recovery) in spaces.items():
        cell = f"m/{task}/{space}"
        methods = ("random", "mcts", "hill_climb", "genetic")
        if matched and space in matched:
            oracles, methods = (*oracles, matched[space]), (*methods, "random_matched")
        for method, o in zip(methods, oracles):
            diff = oracles[0] - o
            structured = method not in ("random", "random_matched")
            m_diff = matched[space] - o if matched and space in matched and structured else float("nan")
            cells.append({"cell": cell, "model": "m", "task": task, "space": space, "method": method, "oracle": o,
                          "oracle_lo": o - 0.1, "oracle_hi": o + 0.1, "random_minus": diff if structured else float("nan"),
                          "random_minus_lo": diff - 0.05, "random_minus_hi": diff + 0.05,
                          "matched_minus": m_diff, "matched_minus_lo": m_diff - 0.05, "matched_minus_hi": m_diff + 0.05,
                          **dict.fromkeys(("random_minus_two_way_lo", "random_minus_two_way_hi", "matched_minus_two_way_lo",
                                           "matched_minus_two_way_hi"), float("nan")),
                          "matched_control": "",
                          "deployed": deployed,
                          "n_questions": 40, "k": 32, "excluded": space in collapsed, "unparsed_rate": 0.9 if space in collapsed else 0.1})
        for source in ("routes", "temperature"):
            sel.append({"cell": cell, "space": space, "selector": "majority", "source": source,
                        "accuracy": 0.3, "gap_recovery": recovery})
    run.write_table("route_cells", pd.DataFrame(cells))
    run.write_table("selectors", pd.DataFrame(sel))
    return run


def test_cross_cell_table_counts_medians_and_collapsed_cells(tmp_path):
    fake_route_run(tmp_path / "a", "gsm8k", {"skiponly": ((0.6, 0.5, 0.4, 0.6), 0.1),
                                              "native": ((0.9, 0.1, 0.1, 0.1), 0.5)}, collapsed=("native",))
    fake_route_run(tmp_path / "b", "arc", {"skiponly": ((0.5, 0.55, 0.3, 0.45), -0.2)})
    RunDir.create(tmp_path / "plain", {"kind": "audit"})  # not a route run: ignored
    runs = route_runs(tmp_path)
    assert len(runs) == 2
    t = aggregate_route_cells(runs)
    adv = t["advantage"]
    assert len(adv) == 6 and adv.advantage.is_monotonic_increasing  # 2 clean cells x 3 searches, sorted
    assert adv.advantage.tolist() == pytest.approx([-0.05, 0.0, 0.05, 0.1, 0.2, 0.2])
    assert "m/gsm8k/native" not in set(adv.cell)
    assert t["collapsed"].cell.tolist() == ["m/gsm8k/native"]
    counts = t["counts"].set_index(["baseline", "scope", "space", "search"]).sort_index()
    clean = counts.loc["random", "clean"]
    assert clean.loc[("all", "all"), "comparisons"] == 6  # the paper's unit: one search in one space of one cell
    assert clean.loc[("all", "all"), "baseline_ge_search"] == 5  # arc loses to mcts
    assert clean.loc[("all", "mcts"), "baseline_ge_search"] == 1
    assert clean.loc[("all", "hill_climb"), "median_diff"] == pytest.approx(0.2)
    assert clean.loc[("skiponly", "genetic"), "baseline_ge_search"] == 2
    kept = counts.loc["random", "all"]  # the collapsed native cell kept: 3 more comparisons, all won by random
    assert (kept.loc[("all", "all"), "comparisons"], kept.loc[("all", "all"), "baseline_ge_search"]) == (9, 8)
    assert kept.loc[("native", "all"), "comparisons"] == 3
    mt = t["model_task"].set_index(["baseline", "scope"])
    assert mt.loc[("random", "clean"), ["model_task_cells", "tested", "holding", "untested"]].tolist() == [2, 2, 1, 0]
    assert mt.loc[("random", "all"), ["tested", "holding"]].tolist() == [2, 1]
    assert set(t["comparisons"].baseline) == {"random"}  # these runs have no random_matched
    dist = t["selector_distribution"].set_index("selector")
    assert dist.loc["majority", "cells"] == 2  # route candidates only, collapsed cell left out
    assert dist.loc["majority", "median"] == pytest.approx(-0.05)


def test_write_route_cells_refreshes_and_refuses_an_empty_folder(tmp_path):
    with pytest.raises(ValueError, match="no finished route runs"):
        write_route_cells(tmp_path)
    fake_route_run(tmp_path / "a", "gsm8k", {"skiponly": ((0.6, 0.5, 0.4, 0.6), 0.1)})
    run, _ = write_route_cells(tmp_path)
    first = run.read_summary().clean_cells
    fake_route_run(tmp_path / "b", "arc", {"skiponly": ((0.5, 0.55, 0.3, 0.45), -0.2)})
    run, _ = write_route_cells(tmp_path)  # the aggregate folder itself is not a route run
    assert (first, run.read_summary().clean_cells) == (1, 2)


def test_the_report_draws_the_cross_cell_figures(tmp_path):
    from rnr_interp.report.registry import write_run_figures

    fake_route_run(tmp_path / "a", "gsm8k", {"skiponly": ((0.6, 0.5, 0.4, 0.6), 0.1)})
    fake_route_run(tmp_path / "b", "arc", {"skiponly": ((0.5, 0.55, 0.3, 0.45), -0.2)})
    run, _ = write_route_cells(tmp_path)
    names = {p.stem for p in write_run_figures(run)}
    assert {"route_advantage", "selector_recovery"} <= names


def test_cells_where_no_method_beats_greedy_are_counted_apart(tmp_path):
    """A route cell whose every oracle equals greedy cannot show random losing: its
    comparisons are untested, never counted for random, and a model-task cell made of
    such cells is untested too. random_matched is counted beside random."""
    fake_route_run(tmp_path / "a", "gsm8k", {"native": ((0.2, 0.2, 0.2, 0.2), 0.0)}, matched={"native": 0.2})
    fake_route_run(tmp_path / "b", "arc", {"native": ((0.5, 0.3, 0.6, 0.4), 0.1)}, matched={"native": 0.7})
    t = aggregate_route_cells(route_runs(tmp_path))
    counts = t["counts"].set_index(["baseline", "scope", "space", "search"]).sort_index()
    assert counts.loc[("random", "clean", "all", "all"), ["comparisons", "baseline_ge_search", "untested"]].tolist() == [3, 2, 3]
    assert counts.loc[("random_matched", "clean", "all", "all"), ["comparisons", "baseline_ge_search"]].tolist() == [3, 3]
    mt = t["model_task"].set_index(["baseline", "scope"])
    assert mt.loc[("random", "clean"), ["model_task_cells", "tested", "holding", "untested"]].tolist() == [2, 1, 0, 1]
    assert mt.loc[("random_matched", "clean"), ["tested", "holding"]].tolist() == [1, 1]
    adv = t["advantage"].set_index("cell")
    assert not adv.loc["m/gsm8k/native", "informative"].any() and adv.loc["m/arc/native", "informative"].all()


def test_comparisons_of_two_oracles_at_chance_are_counted_apart(tmp_path):
    """Where a run carries each method's chance null, a comparison whose baseline and
    search oracles are both indistinguishable from their nulls (a lottery against a
    lottery) is untested, like a cell where nothing beat greedy; one side above chance
    keeps the comparison."""
    run = fake_route_run(tmp_path / "a", "gsm8k", {"native": ((0.5, 0.3, 0.6, 0.4), 0.1)})
    cells = run.read_table("route_cells")
    # random and mcts at chance; hill climbing above it; genetic at chance
    lo = {"random": -0.05, "mcts": -0.10, "hill_climb": 0.20, "genetic": -0.01}
    cells["oracle_minus_null_lo"] = cells["method"].map(lo)
    run.write_table("route_cells", cells)
    t = aggregate_route_cells(route_runs(tmp_path))
    comp = t["comparisons"].set_index("search")
    assert comp["at_chance"].to_dict() == {"mcts": True, "hill_climb": False, "genetic": True}
    assert comp["informative"].to_dict() == {"mcts": False, "hill_climb": True, "genetic": False}
    counts = t["counts"].set_index(["baseline", "scope", "space", "search"]).sort_index()
    assert counts.loc[("random", "clean", "all", "all"), ["comparisons", "baseline_ge_search", "untested"]].tolist() == [1, 0, 2]
    # without nulls in the table (a run whose task did not reload) nothing is set apart
    cells.drop(columns="oracle_minus_null_lo").pipe(lambda c: run.write_table("route_cells", c))
    t = aggregate_route_cells(route_runs(tmp_path))
    assert not t["comparisons"]["at_chance"].any() and t["comparisons"]["informative"].all()
    # a table from before the two-way intervals is refused, naming the remedy
    cells.drop(columns="matched_minus_two_way_lo").pipe(lambda c: run.write_table("route_cells", c))
    with pytest.raises(RunFolderError, match="'matched_minus_two_way_lo'.*rnr regrade"):
        aggregate_route_cells(route_runs(tmp_path))


def test_overlapping_runs_of_one_cell_count_once():
    """The committed arith10_seq and arith10_mcts8 are the first 10 questions of arith40,
    and arith40_skiponly, arith40_native, arith40_polar run its spaces again under the
    new draws: route-cells counts each (model, task, space) cell once, from the newest
    40-question run of it, and says which run each left-out space overlaps."""
    import json
    from pathlib import Path

    from rnr_interp.analyses.routing.cells import distinct_runs

    folder = Path(__file__).resolve().parents[1] / "experiments" / "runs"
    runs = route_runs(folder)
    taken = distinct_runs(runs)
    taken["name"] = taken["run"].map(lambda r: Path(r).name)
    created = {r.path.name: json.loads((r.path / "manifest.json").read_text())["created"] for r in runs}
    for _, cell in taken.groupby(["task", "space"]):
        assert cell.kept.sum() == 1
        full = cell[cell.n_questions == 40]
        assert cell.loc[cell.kept, "name"].item() == max(full.name, key=created.get)
        left = cell[~cell.kept]
        assert (left.overlaps.map(lambda r: Path(r).name) == cell.loc[cell.kept, "name"].item()).all()
    assert not taken[taken.name.str.startswith("arith10")].kept.any()
    assert set(taken.loc[taken.name == "arith10_seq", "shared_questions"]) == {10}
    t = aggregate_route_cells(runs)
    assert t["model_task"].model_task_cells.max() == 2
    assert len(t["comparisons"].drop_duplicates(["task", "space"])) == 6  # 2 tasks x 3 spaces, each once


@pytest.mark.parametrize("newer", ["a_first", "b_second"])
def test_a_re_measurement_of_the_same_questions_supersedes_the_older_run(tmp_path, newer):
    """Two runs of the same 40 questions: the newer is kept whichever sorts first by path."""
    import json
    import shutil
    from pathlib import Path

    from rnr_interp.analyses.routing.cells import distinct_runs

    committed = Path(__file__).resolve().parents[1] / "experiments" / "runs" / "arith40"
    for name in ("a_first", "b_second"):
        shutil.copytree(committed, tmp_path / name)
    for name in ("a_first", "b_second"):
        manifest = tmp_path / name / "manifest.json"
        m = json.loads(manifest.read_text())
        m["created"] = "2026-06-01T00:00:00+00:00" if name == newer else "2026-01-01T00:00:00+00:00"
        manifest.write_text(json.dumps(m))
    taken = distinct_runs(route_runs(tmp_path))
    assert {Path(r).name for r in taken.loc[taken.kept, "run"]} == {newer}
    older = taken[taken.run == str(tmp_path / ({"a_first", "b_second"} - {newer}).pop())]
    assert len(older) == 3 and (older.overlaps.map(lambda r: Path(r).name) == newer).all()


def test_a_re_measurement_of_one_space_supersedes_that_space_only(tmp_path):
    """A newer run of the same questions in the skip-only space alone: the older run's
    skip-only cell is left out, its native and polar cells still count."""
    import json
    import shutil
    from pathlib import Path

    committed = Path(__file__).resolve().parents[1] / "experiments" / "runs" / "arith40"
    shutil.copytree(committed, tmp_path / "old")
    shutil.copytree(committed, tmp_path / "new")
    manifest = tmp_path / "new" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["created"] = "2099-01-01T00:00:00+00:00"
    manifest.write_text(json.dumps(m))
    new = RunDir(tmp_path / "new")
    new.write_table("route_cells", new.read_table("route_cells").query("space == 'skiponly'"))
    new.write_table("selectors", new.read_table("selectors").query("space == 'skiponly'"))
    t = aggregate_route_cells(route_runs(tmp_path))
    counted = set(zip(t["comparisons"].space, t["comparisons"].run.map(lambda r: Path(r).name)))
    assert counted == {("native", "old"), ("polar", "old"), ("skiponly", "new")}
    assert set(zip(t["selectors"].space, t["selectors"].run.map(lambda r: Path(r).name))) == counted
    left = t["runs"][~t["runs"].kept]
    assert left[["space", "overlaps"]].assign(overlaps=left.overlaps.map(lambda r: Path(r).name)).values.tolist() == [
        ["skiponly", "new"]]
