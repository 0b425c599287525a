"""Cross-cell aggregation of route runs into the paper's Experiment 1 table."""

import pandas as pd
import pytest

from rnr_interp.records import RunDir
from rnr_interp.analyses.routing.cells import aggregate_route_cells, route_runs, write_route_cells


def fake_route_run(path, task, spaces: dict, collapsed=()):
    """A route run folder with route_cells/selectors tables: spaces maps a space to
    (random, mcts, hill_climb, genetic) oracle@K and a majority gap recovery."""
    run = RunDir.create(path, {"kind": "route", "task": {"name": task}})
    cells, sel = [], []
    for space, (oracles, recovery) in spaces.items():
        cell = f"m/{task}/{space}"
        for method, o in zip(("random", "mcts", "hill_climb", "genetic"), oracles):
            diff = oracles[0] - o
            cells.append({"cell": cell, "model": "m", "task": task, "space": space, "method": method, "oracle": o,
                          "oracle_lo": o - 0.1, "oracle_hi": o + 0.1, "random_minus": diff if method != "random" else 0.0,
                          "random_minus_lo": diff - 0.05, "random_minus_hi": diff + 0.05, "deployed": 0.2,
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
    counts = t["counts"].set_index(["space", "search"])
    assert counts.loc[("all", "all"), "random_ge_structured"] == 1  # arc loses to mcts
    assert counts.loc[("all", "all"), "cells"] == 2
    assert counts.loc[("all", "mcts"), "random_ge_structured"] == 1
    assert counts.loc[("all", "hill_climb"), "median_advantage"] == pytest.approx(0.2)
    assert counts.loc[("skiponly", "genetic"), "random_ge_structured"] == 2
    dist = t["selector_distribution"].set_index("selector")
    assert dist.loc["majority", "cells"] == 2  # route candidates only, collapsed cell left out
    assert dist.loc["majority", "median"] == pytest.approx(-0.05)


def test_write_route_cells_refreshes_and_refuses_an_empty_folder(tmp_path):
    with pytest.raises(ValueError, match="no finished route runs"):
        write_route_cells(tmp_path)
    fake_route_run(tmp_path / "a", "gsm8k", {"skiponly": ((0.6, 0.5, 0.4, 0.6), 0.1)})
    run, _ = write_route_cells(tmp_path)
    first = run.read_summary()["clean_cells"]
    fake_route_run(tmp_path / "b", "arc", {"skiponly": ((0.5, 0.55, 0.3, 0.45), -0.2)})
    run, _ = write_route_cells(tmp_path)  # the aggregate folder itself is not a route run
    assert (first, run.read_summary()["clean_cells"]) == (1, 2)


def test_the_report_draws_the_cross_cell_figures(tmp_path):
    from rnr_interp.report.registry import write_run_figures

    fake_route_run(tmp_path / "a", "gsm8k", {"skiponly": ((0.6, 0.5, 0.4, 0.6), 0.1)})
    fake_route_run(tmp_path / "b", "arc", {"skiponly": ((0.5, 0.55, 0.3, 0.45), -0.2)})
    run, _ = write_route_cells(tmp_path)
    names = {p.stem for p in write_run_figures(run)}
    assert {"route_advantage", "selector_recovery"} <= names
