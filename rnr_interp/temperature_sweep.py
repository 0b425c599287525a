"""The selection gap against sampling temperature (the paper's Figure 3b).

One plain audit per temperature (same model, task, questions, K and greedy deployed
decoding; each its own resumable run folder ``OUT/T=<t>``), then one row per
temperature: O_K - majority@K (the selection gap) and O_K - D (the oracle-deployment
gap), each with its paired Newcombe interval, plus the confidence-weighted vote's gap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from rnr_interp.audit import run_audit
from rnr_interp.records import RunDir
from rnr_interp.sampling import Probe
from rnr_interp.tasks.base import Task


def temperature_rows(summaries: dict[float, dict[str, Any]]) -> pd.DataFrame:
    """The sweep table from each temperature's audit summary."""
    rows = []
    for t, s in sorted(summaries.items()):
        row = {"temperature": t, "k": s["k"], "n_questions": s["n_questions"], "D": s["D"], "O_K": s["O_K"],
               "oracle_minus_greedy": s["gap"], "oracle_minus_greedy_lo": s["gap_ci"][0], "oracle_minus_greedy_hi": s["gap_ci"][1]}
        for vote in ("majority", "weighted_majority"):
            v = s[vote]
            row.update({vote: v["accuracy"], f"oracle_minus_{vote}": v["selection_gap"],
                        f"oracle_minus_{vote}_lo": v["selection_gap_ci"][0], f"oracle_minus_{vote}_hi": v["selection_gap_ci"][1]})
        rows.append(row)
    return pd.DataFrame(rows)


def run_temperature_sweep(lm, task: Task, out: str | Path, temperatures: Sequence[float], k: int = 32, seed: int = 0,
                          batch_size: int = 8, progress: bool = True) -> pd.DataFrame:
    """Audit at each temperature (resuming finished ones) and write the sweep table
    ``temperature_sweep`` into OUT."""
    if not temperatures or any(t <= 0 for t in temperatures):
        raise ValueError(f"temperatures must be a non-empty list of values > 0, got {list(temperatures)}")
    run = RunDir.create(out, {"kind": "temperature_sweep", "model": lm.spec, "task": task.describe(),
                              "question_ids_hash": task.ids_hash(), "k": k, "seed": seed,
                              "temperatures": sorted(float(t) for t in temperatures)})
    summaries = {float(t): run_audit(lm, task, Path(out) / f"T={float(t):g}", probe=Probe(k=k, temperature=float(t), seed=seed),
                                     batch_size=batch_size, progress=progress)
                 for t in sorted(temperatures)}
    table = temperature_rows(summaries)
    run.write_table("temperature_sweep", table)
    run.write_summary({"kind": "temperature_sweep", "model": lm.spec, "task": task.name, "k": k,
                       "rows": table.to_dict("records")})
    return table
