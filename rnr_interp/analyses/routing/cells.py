"""Across routing cells: the paper's Experiment 1 table from a folder of route runs.

A *cell* is model x task x route space (one `rnr route` run holds one cell per space).
Every run already stores, per cell, oracle@K per method with random - structured at the
same K and its paired (Newcombe) interval (`route_cells`), and each selector's gap
recovery with a paired bootstrap interval (`selectors`). This module gathers them:

- `advantage`: one row per clean cell and structured search: random - structured at
  matched K with its paired interval, sorted (the sorted-difference figure);
- `counts`: per search and per space, in how many clean cells random >= structured
  (and, per space, random >= every search), and the median advantage;
- `selector_distribution`: per selector, the distribution of gap recovery over clean
  cells (median, quartiles, range, cells with no gap to recover);
- `selectors`: the per-cell rows behind that distribution (the report's box plot);
- `collapsed`: the format-collapse cells, listed apart and left out of all the above.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rnr_interp.records import RunDir, load_runs

STRUCTURED = ("mcts", "hill_climb", "genetic")


def route_runs(folder: str | Path) -> list[RunDir]:
    """The finished route runs under `folder` (those holding a `route_cells` table)."""
    runs = [r for r in load_runs(folder) if r.config.get("kind") == "route"]
    return [r for r in runs if (r.artefacts_dir / "route_cells.parquet").is_file()]


def aggregate_route_cells(runs: list[RunDir]) -> dict[str, pd.DataFrame]:
    """The cross-cell tables (see module doc) from finished route runs."""
    if not runs:
        raise ValueError("no finished route runs (no route_cells table) to aggregate")
    cells = pd.concat([r.read_table("route_cells").assign(run=str(r.path)) for r in runs], ignore_index=True)
    selectors = pd.concat([r.read_table("selectors").assign(run=str(r.path)) for r in runs], ignore_index=True)
    clean = cells[~cells.excluded.astype(bool)]
    advantage = clean[clean.method.isin(STRUCTURED)].rename(
        columns={"method": "search", "random_minus": "advantage", "random_minus_lo": "lo", "random_minus_hi": "hi"})
    advantage = advantage[["cell", "model", "task", "space", "search", "k", "n_questions", "advantage", "lo", "hi", "run"]]
    advantage = advantage.sort_values("advantage", kind="stable").reset_index(drop=True)
    collapsed = (cells[cells.excluded.astype(bool)].drop_duplicates("cell")
                 [["cell", "model", "task", "space", "unparsed_rate", "run"]].reset_index(drop=True))
    kept = selectors[(selectors.source == "routes") & selectors.cell.isin(set(clean.cell))]
    return {
        "advantage": advantage,
        "counts": _counts(advantage),
        "selector_distribution": _distribution(kept),
        "selectors": kept.reset_index(drop=True),  # per clean cell: the distribution figure's points
        "collapsed": collapsed,
    }


def _counts(advantage: pd.DataFrame) -> pd.DataFrame:
    """Per (space, search), 'all' pooling spaces or searches: clean cells, cells with
    random >= structured, median advantage."""
    rows: list[dict[str, Any]] = []
    for space in ["all", *sorted(advantage.space.unique())]:
        in_space = advantage if space == "all" else advantage[advantage.space == space]
        for search in ["all", *STRUCTURED]:
            if search == "all":
                # random >= every search in the cell (the paper's per-space count)
                per_cell = in_space.groupby("cell").advantage.min()
                rows.append({"space": space, "search": "all", "cells": len(per_cell),
                             "random_ge_structured": int((per_cell >= 0).sum()),
                             "median_advantage": float(in_space.advantage.median()) if len(in_space) else np.nan})
                continue
            sub = in_space[in_space.search == search]
            rows.append({"space": space, "search": search, "cells": len(sub),
                         "random_ge_structured": int((sub.advantage >= 0).sum()),
                         "median_advantage": float(sub.advantage.median()) if len(sub) else np.nan})
    return pd.DataFrame(rows)


def _distribution(selectors: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for name, g in selectors.groupby("selector", sort=False):
        rec = g.gap_recovery.dropna()
        q = rec.quantile([0.25, 0.5, 0.75]) if len(rec) else pd.Series([np.nan] * 3, index=[0.25, 0.5, 0.75])
        rows.append({"selector": name, "cells": len(g), "cells_without_gap": int(g.gap_recovery.isna().sum()),
                     "median": q[0.5], "q25": q[0.25], "q75": q[0.75],
                     "min": rec.min() if len(rec) else np.nan, "max": rec.max() if len(rec) else np.nan})
    return pd.DataFrame(rows)


def write_route_cells(folder: str | Path, out: str | Path | None = None) -> tuple[RunDir, dict[str, pd.DataFrame]]:
    """Aggregate the route runs under `folder` into a run folder (default
    FOLDER/route_cells) holding the four tables; rerunning refreshes them."""
    runs = route_runs(folder)
    tables = aggregate_route_cells(runs)
    run = RunDir.create(Path(out) if out is not None else Path(folder) / "route_cells",
                        {"kind": "route_cells", "source": str(Path(folder).resolve())})
    for name, df in tables.items():
        run.write_table(name, df)
    counts = tables["counts"]
    run.write_summary({"kind": "route_cells", "runs": [str(r.path) for r in runs],
                       "clean_cells": int(tables["advantage"].cell.nunique()),
                       "collapsed_cells": tables["collapsed"].cell.tolist(),
                       "counts": counts.to_dict("records"),
                       "selectors": tables["selector_distribution"].to_dict("records")})
    return run, tables
