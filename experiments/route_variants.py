"""Do batched and sequential searches reach the same answers? Two route runs of the same
model, task and spaces, made with different `--proposals` (routes a structured search
proposes per round), compared per (space, method) on the questions both hold: the
oracle curve o_i(b) (some route among the first b a search evaluated for question i is
right, under the runs' grading) at each budget b, each run's O_b with its Wilson
interval, and the paired difference (second - first) with its Newcombe interval.

    python experiments/route_variants.py SEQUENTIAL_RUN BATCHED_RUN [--budgets 1,2,4,8,16,32]

The curves agree within intervals when every paired interval holds 0. Random search
proposes all its routes at once, so it is the same in both runs: a check on the pairing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from rnr_interp.grading import graded
from rnr_interp.metrics import paired_diff_ci, question_scores, wilson_interval
from rnr_interp.records import RunDir


def oracle_at(records: pd.DataFrame, probe: str, budgets: list[int]) -> pd.DataFrame:
    """Per question (rows) and budget (columns): some of the probe's first b candidates is
    right (`metrics.question_scores` at k = b)."""
    return pd.DataFrame({b: question_scores(records, probe, b)["o"] for b in budgets})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    ap.add_argument("--budgets", default="1,2,4,8,16,32")
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    runs = [RunDir(p) for p in (args.first, args.second)]
    gradings = {run.grading for run in runs}
    if len(gradings) != 1:
        raise SystemExit(f"the runs are graded differently ({', '.join(sorted(gradings))}): regrade one first")
    grading = gradings.pop()
    records = [graded(run.read_records(), grading) for run in runs]
    shared = sorted(set(records[0]["question_id"]) & set(records[1]["question_id"]))
    if not shared:
        raise SystemExit("the runs share no question")
    proposals = [run.read_summary().proposals for run in runs]
    print(f"{len(shared)} shared questions, grading {grading}; proposals: first {proposals[0]}, second {proposals[1]}")
    probes = [p for p in dict.fromkeys(records[0]["probe"]) if ":" in p and not p.startswith("verify:")
              and p in set(records[1]["probe"])]
    excluding = 0
    for probe in probes:
        a, b = (oracle_at(r[r["question_id"].isin(shared)], probe, budgets).loc[shared] for r in records)
        cells = []
        for k in budgets:
            x, y = a[k].to_numpy(float), b[k].to_numpy(float)
            lo, hi = paired_diff_ci(x, y)
            excluding += not lo <= 0 <= hi
            cells.append(f"b={k}: {x.mean():.3f} vs {y.mean():.3f}, diff {y.mean() - x.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]")
        at_k = [wilson_interval(int(v[budgets[-1]].sum()), len(shared)) for v in (a, b)]
        print(f"{probe:28s} O_{budgets[-1]} {a[budgets[-1]].mean():.3f} [{at_k[0][0]:.3f}, {at_k[0][1]:.3f}] vs "
              f"{b[budgets[-1]].mean():.3f} [{at_k[1][0]:.3f}, {at_k[1][1]:.3f}]; identical questions "
              f"{int((a[budgets[-1]] == b[budgets[-1]]).sum())}/{len(shared)}")
        print("    " + "; ".join(cells))
    print(f"paired intervals excluding 0: {excluding} of {len(probes) * len(budgets)}")


if __name__ == "__main__":
    main()
