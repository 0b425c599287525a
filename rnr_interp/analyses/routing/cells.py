"""Across routing cells: the paper's Experiment 1 table from a folder of route runs.

Units, as the paper's: a *model-task cell* is one model on one task (a run holds one,
with one route cell per space); a *comparison* is one baseline against one structured
search in one space of one model-task cell (the paper's per-space counts, "Native
46/46", count these). Every run already stores, per route cell, oracle@K per method
with baseline - search at the same K and its paired (Newcombe) interval
(`route_cells`), and each selector's gap recovery (`selectors`). This module gathers
them:

- `comparisons`: one row per comparison, for both baselines (`random`, the space's own
  sampler, and `random_matched`, random routes at the searches' distances where the
  run has it), with `informative` false where no method of the route cell beat greedy
  (every oracle equals greedy: the comparison could not have gone either way) or where
  `at_chance`: neither the baseline's oracle nor the search's is above its own chance
  null (the runs' `route_cells` nulls: the same candidates graded against another
  question's gold), so one lottery is set against another. An uninformative comparison
  is counted apart and never enters a count or a median;
- `advantage`: random - search per comparison of the clean cells, sorted, with its
  `informative` flag (the sorted-difference figure draws untested ones hollow);
- `counts`: per baseline, scope (`clean`: format-collapse cells left out; `all`: kept),
  space (and `all`) and search (and `all`): informative comparisons, those where the
  baseline >= the search, the untested ones, and the median baseline - search;
- `model_task`: per baseline and scope, model-task cells tested (one informative
  comparison or more), holding (baseline >= every search in every informative
  comparison) and untested;
- `selector_distribution`: per selector, the distribution of gap recovery over clean
  cells (median, quartiles, range, cells with no gap to recover);
- `selectors`: the per-cell rows behind that distribution (the report's box plot);
- `collapsed`: the format-collapse cells, listed apart.

Results are given with and without the collapsed cells, so an exclusion never decides
a verdict unseen.

Runs of one cell (model, task and space) that share questions count once: the largest
is kept (of equal size, the newest: a re-measurement supersedes the run it repeats) and
the others are listed in the `runs` table (one row per run and space; kept false, and
which run they overlap).
A comparison's interval is the two-way one (questions and the baseline's route draw,
`summary.two_way_ci`) where the run's table has it, else the question-only one
(`interval` says which); an oracle is above chance only when its oracle - null lower
bound exceeds 0 by more than rounding (`config.above_chance`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rnr_interp.records import ROUTE, ROUTE_CELLS, RunDir, RunFolderError, load_runs
from rnr_interp.analyses.routing.config import STRUCTURED, above_chance

#: baseline -> its columns in a run's route_cells table (baseline - search)
BASELINES = {"random": "random_minus", "random_matched": "matched_minus"}
SCOPES = ("clean", "all")


def route_runs(folder: str | Path) -> list[RunDir]:
    """The finished route runs under `folder` (those holding a `route_cells` table)."""
    return [r for r in load_runs(folder, ROUTE) if (r.artefacts_dir / "route_cells.parquet").is_file()]


def distinct_runs(runs: list[RunDir]) -> pd.DataFrame:
    """Which runs count, per route cell (model, task and route space): runs are taken
    largest first, then newest first (a re-measurement of the same questions supersedes
    the run it repeats), then by path, and a run's space that shares a question with the
    same space of one already taken is left out, so each cell's questions are counted
    once (a run of the first 10 questions of another is the same evidence again, not
    more), while a re-measurement of one space leaves the earlier run's other spaces
    counted. One row per run and space: run, model, task, space, n_questions, kept,
    overlaps (the kept run it shares questions with) and shared_questions."""
    # the spaces a run's table holds, which are the cells it would add
    facts = [(r, r.config.get("model"), (r.config.get("task") or {}).get("name"), set(r.done_question_ids()),
              list(dict.fromkeys(r.read_table("route_cells")["space"]))) for r in runs]
    # stable sorts, last key first: path, then newest first, then largest first
    facts.sort(key=lambda f: str(f[0].path))
    facts.sort(key=lambda f: str(f[0].manifest.get("created", "")), reverse=True)
    facts.sort(key=lambda f: len(f[3]), reverse=True)
    kept: list[tuple[RunDir, Any, Any, Any, set[str]]] = []
    rows = []
    for run, model, task, qids, spaces in facts:
        for space in spaces:
            clash = next((k for k in kept if k[1:4] == (model, task, space) and k[4] & qids), None)
            if clash is None:
                kept.append((run, model, task, space, qids))
            rows.append({"run": str(run.path), "model": model, "task": task, "space": space, "n_questions": len(qids),
                         "kept": clash is None, "overlaps": "" if clash is None else str(clash[0].path),
                         "shared_questions": 0 if clash is None else len(clash[4] & qids)})
    return pd.DataFrame(rows, columns=["run", "model", "task", "space", "n_questions", "kept", "overlaps", "shared_questions"])


def aggregate_route_cells(runs: list[RunDir]) -> dict[str, pd.DataFrame]:
    """The cross-cell tables (see module doc) from finished route runs, overlapping runs
    of one model and task counted once (`distinct_runs`, the `runs` table)."""
    if not runs:
        raise ValueError("no finished route runs (no route_cells table) to aggregate")
    taken = distinct_runs(runs)
    counted = set(zip(taken.loc[taken.kept, "run"], taken.loc[taken.kept, "space"]))
    runs = [r for r in runs if any(run == str(r.path) for run, _ in counted)]

    cells = pd.concat([_route_cells_table(r).assign(run=str(r.path)) for r in runs], ignore_index=True)
    cells = cells[[(run, space) in counted for run, space in zip(cells["run"], cells["space"])]]
    # a selectors row belongs to the cell (model x task x space) it names
    kept_cells = set(zip(cells["run"], cells["cell"]))
    selectors = pd.concat([r.read_table("selectors").assign(run=str(r.path)) for r in runs], ignore_index=True)
    selectors = selectors[[(run, cell) in kept_cells for run, cell in zip(selectors["run"], selectors["cell"])]]
    comparisons = _comparisons(cells)
    clean = cells[~cells.excluded.astype(bool)]
    advantage = comparisons[(comparisons.baseline == "random") & ~comparisons.excluded]
    advantage = advantage.rename(columns={"diff": "advantage"})
    advantage = advantage[["cell", "model", "task", "space", "search", "k", "n_questions", "advantage", "lo", "hi",
                           "interval", "at_chance", "informative", "run"]]
    advantage = advantage.sort_values("advantage", kind="stable").reset_index(drop=True)
    collapsed = (cells[cells.excluded.astype(bool)].drop_duplicates("cell")
                 [["cell", "model", "task", "space", "unparsed_rate", "run"]].reset_index(drop=True))
    kept = selectors[(selectors.source == "routes") & selectors.cell.isin(set(clean.cell))]
    return {
        "comparisons": comparisons,
        "advantage": advantage,
        "counts": _counts(comparisons),
        "model_task": _model_task(comparisons),
        "selector_distribution": _distribution(kept),
        "selectors": kept.reset_index(drop=True),  # per clean cell: the distribution figure's points
        "collapsed": collapsed,
        "runs": taken,
    }


#: route_cells columns every table this version writes holds (the null's only where the task reloaded)
_CELL_COLUMNS = ("matched_control", *(f"{c}{end}" for c in BASELINES.values()
                                      for end in ("", "_lo", "_hi", "_two_way_lo", "_two_way_hi")))


def _route_cells_table(run: RunDir) -> pd.DataFrame:
    """A run's route_cells table; one from before the two-way intervals and each search's
    own matched control were written is refused (`rnr regrade` writes it again)."""
    table = run.read_table("route_cells")
    if missing := [c for c in _CELL_COLUMNS if c not in table]:
        raise RunFolderError(f"{run.path}: its route_cells table has no {missing[0]!r} (written by an earlier rnr_interp "
                             f"0.1); `rnr regrade {run.path}` writes it again")
    return table


def _comparisons(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per (route cell, baseline, structured search) the runs measured.
    `at_chance`: neither oracle of the comparison is above its own chance null (each
    one's oracle - null interval holds 0; False where the run's table has no nulls),
    so the comparison sets one lottery against another; `informative` is false for
    those and where no method of the cell beat greedy."""
    # Whether any method beat greedy, from the oracles themselves.
    beat_greedy = cells.groupby("cell").apply(lambda g: bool((g.oracle > g.deployed + 1e-12).any()), include_groups=False)
    above_null = {(r.cell, r.method): above_chance(r.oracle_minus_null_lo) for r in cells.itertuples()
                  if not pd.isna(getattr(r, "oracle_minus_null_lo", np.nan))}
    rows: list[dict[str, Any]] = []
    for r in cells[cells.method.isin(STRUCTURED)].itertuples():
        for baseline, column in BASELINES.items():
            diff = getattr(r, column)
            if diff is None or pd.isna(diff):
                continue  # a run without this baseline
            # the search's own matched control (the pooled one in runs made before each had its own)
            against = baseline
            if baseline == "random_matched" and isinstance(r.matched_control, str) and r.matched_control:
                against = r.matched_control
            both = [above_null.get((r.cell, m)) for m in (against, r.method)]
            at_chance = None not in both and not any(both)
            two_way = not pd.isna(getattr(r, f"{column}_two_way_lo"))
            lo, hi = (getattr(r, f"{column}_two_way_lo"), getattr(r, f"{column}_two_way_hi")) if two_way else \
                (getattr(r, f"{column}_lo"), getattr(r, f"{column}_hi"))
            rows.append({"cell": r.cell, "model": r.model, "task": r.task, "space": r.space, "baseline": baseline,
                         "against": against, "search": r.method, "diff": float(diff), "lo": float(lo), "hi": float(hi),
                         "interval": "two-way" if two_way else "questions",
                         "lo_questions": float(getattr(r, f"{column}_lo")), "hi_questions": float(getattr(r, f"{column}_hi")),
                         "k": r.k, "n_questions": r.n_questions, "excluded": bool(r.excluded), "at_chance": at_chance,
                         "informative": bool(beat_greedy[r.cell]) and not at_chance, "run": r.run})
    columns = ["cell", "model", "task", "space", "baseline", "against", "search", "diff", "lo", "hi", "interval",
               "lo_questions", "hi_questions", "k", "n_questions", "excluded", "at_chance", "informative", "run"]
    return pd.DataFrame(rows, columns=columns)


def _scoped(comparisons: pd.DataFrame, scope: str) -> pd.DataFrame:
    return comparisons if scope == "all" else comparisons[~comparisons.excluded]


def _counts(comparisons: pd.DataFrame) -> pd.DataFrame:
    """Per baseline, scope, space and search ('all' pooling spaces or searches):
    informative comparisons, those with baseline >= search, untested ones, and the
    median baseline - search over the informative ones."""
    rows: list[dict[str, Any]] = []
    for baseline in comparisons.baseline.unique():
        for scope in SCOPES:
            within = _scoped(comparisons[comparisons.baseline == baseline], scope)
            for space in ["all", *sorted(within.space.unique())]:
                in_space = within if space == "all" else within[within.space == space]
                for search in ["all", *STRUCTURED]:
                    sub = in_space if search == "all" else in_space[in_space.search == search]
                    tested = sub[sub.informative]
                    rows.append({"baseline": baseline, "scope": scope, "space": space, "search": search,
                                 "comparisons": len(tested), "baseline_ge_search": int((tested["diff"] >= 0).sum()),
                                 "untested": int((~sub.informative).sum()),
                                 "median_diff": float(tested["diff"].median()) if len(tested) else np.nan})
    return pd.DataFrame(rows, columns=["baseline", "scope", "space", "search", "comparisons", "baseline_ge_search",
                                       "untested", "median_diff"])


def _model_task(comparisons: pd.DataFrame) -> pd.DataFrame:
    """Per baseline and scope: model-task cells with an informative comparison (tested),
    those where the baseline >= every search in every informative comparison (holding),
    and those with none (untested)."""
    rows: list[dict[str, Any]] = []
    for baseline in comparisons.baseline.unique():
        for scope in SCOPES:
            within = _scoped(comparisons[comparisons.baseline == baseline], scope)
            per_cell = [(g.informative.any(), bool((g[g.informative]["diff"] >= 0).all()))
                        for _, g in within.groupby(["model", "task"])]
            tested = [holds for any_informative, holds in per_cell if any_informative]
            rows.append({"baseline": baseline, "scope": scope, "model_task_cells": len(per_cell), "tested": len(tested),
                         "holding": int(sum(tested)), "untested": len(per_cell) - len(tested)})
    return pd.DataFrame(rows, columns=["baseline", "scope", "model_task_cells", "tested", "holding", "untested"])


def _distribution(selectors: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for name, g in selectors.groupby("selector", sort=False):
        rec = g.gap_recovery.dropna()
        q = rec.quantile([0.25, 0.5, 0.75]) if len(rec) else pd.Series([np.nan] * 3, index=[0.25, 0.5, 0.75])
        rows.append({"selector": name, "cells": len(g), "cells_without_gap": int(g.gap_recovery.isna().sum()),
                     "median": q[0.5], "q25": q[0.25], "q75": q[0.75],
                     "min": rec.min() if len(rec) else np.nan, "max": rec.max() if len(rec) else np.nan})
    # the columns even when no cell is kept: readers select by them
    return pd.DataFrame(rows, columns=["selector", "cells", "cells_without_gap", "median", "q25", "q75", "min", "max"])


def write_route_cells(folder: str | Path, out: str | Path | None = None) -> tuple[RunDir, dict[str, pd.DataFrame]]:
    """Aggregate the route runs under `folder` into a run folder (default
    FOLDER/route_cells) holding the four tables; rerunning refreshes them."""
    runs = route_runs(folder)
    tables = aggregate_route_cells(runs)
    run = RunDir.create(Path(out) if out is not None else Path(folder) / "route_cells",
                        {"kind": ROUTE_CELLS, "source": str(Path(folder).resolve())})
    for name, df in tables.items():
        run.write_table(name, df)
    taken = tables["runs"]
    run.write_summary({"kind": ROUTE_CELLS, "runs": list(dict.fromkeys(taken.loc[taken.kept, "run"])),
                       "left_out": taken.loc[~taken.kept, ["run", "space", "overlaps", "shared_questions"]].to_dict("records"),
                       "clean_cells": int(tables["comparisons"].loc[~tables["comparisons"].excluded, "cell"].nunique()),
                       "collapsed_cells": tables["collapsed"].cell.tolist(),
                       "model_task": tables["model_task"].to_dict("records"),
                       "counts": tables["counts"].to_dict("records"),
                       "selectors": tables["selector_distribution"].to_dict("records")})
    return run, tables
