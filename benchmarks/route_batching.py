"""The routing audit's searches, run the way the audit runs them against the way they
ran before: every search of a chunk of questions in one lockstep, against one lockstep
per search (a method in a space, one after another).

One lockstep per search fills a round with at most one or a few routes per question
(MCTS and hill climbing ask one route at a time), so batches hold as many rows as the
chunk has questions, and fewer as rows finish; on a CPU a batch of few rows spends most
of each decoding step reading weights. One lockstep for all searches gathers every
(search, question)'s waiting routes into each round, so batches can fill up to
`--rows`.

Lines (`--lines`, each `MODE:ROWS`, a fresh `RouteEvaluator` each, so no line reuses
another's generations): MODE `per-search` (one lockstep per search) or `joint` (one for
all), ROWS the most rows a batch holds. The default compares the audit before (one
lockstep per search, batches bounded by the chunk's 10 questions) with the lockstep
alone, and with the lockstep and the audit's rows per batch now (`ROUTE_ROWS`).
They run interleaved, `--reps` rounds, the order reversed every other round; printed
after each round, its seconds per line; at the end, median seconds per line, the batches
each took, the median of the per-round ratios against the first line with min-max, and
how many route generations differ from the first line's (rows batched differently may
differ in a near-tie of greedy decoding; expected 0 or close).

    python benchmarks/route_batching.py [--model smollm2] [--task arithmetic] [--n 10] [--k 8] [--space skiponly]
        [--lines per-search:10,joint:10,joint:32] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from rnr_interp.engine.decoding import Decoding
from rnr_interp.models import load_model
from rnr_interp.analyses.routing.config import ROUTE_ROWS, STRUCTURED
from rnr_interp.analyses.routing.evaluator import RouteEvaluator, run_searches
from rnr_interp.analyses.routing.run import audit_searches
from rnr_interp.analyses.routing.spaces import make_space
from rnr_interp.tasks import load_task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--data", default=None, help="data file of a file-backed task")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--space", action="append", help="route space (repeatable; default skiponly)")
    ap.add_argument("--min-len", type=int, default=27)
    ap.add_argument("--lines", default=f"per-search:10,joint:10,joint:{ROUTE_ROWS}")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    lm = load_model(args.model)
    task = load_task(args.task, args.data, n=args.n)
    decoding = Decoding(max_new_tokens=task.max_new_tokens)
    spaces = {name: make_space(name, lm.n_layers, min_len=min(args.min_len, lm.n_layers))
              for name in args.space or ["skiponly"]}
    searches = audit_searches(spaces, STRUCTURED)

    def run(joint: bool, rows: int) -> tuple[float, int, list[str]]:
        ev = RouteEvaluator(lm, task, decoding, rows)
        start = time.perf_counter()
        if joint:
            found = run_searches(ev, task.questions, searches, args.k, 0)
        else:
            found = {label: run_searches(ev, task.questions, {label: s}, args.k, 0)[label] for label, s in searches.items()}
        texts = [row["text"] for label in searches for pairs in found[label].values() for _, row in pairs]
        return time.perf_counter() - start, ev.n_batches, texts

    lines = {}
    for spec in args.lines.split(","):
        mode, rows = spec.split(":")
        if mode not in ("per-search", "joint"):
            raise SystemExit(f"line {spec!r}: the mode is per-search or joint")
        lines[spec] = (mode == "joint", int(rows))
    seconds: dict[str, list[float]] = {line: [] for line in lines}
    batches: dict[str, int] = {}
    texts: dict[str, list[str]] = {}
    for rep in range(args.reps):
        # Order alternates by round (A B, then B A): a line run first in every round
        # would carry the warm-up and the machine's drift alone.
        for line in (list(lines) if rep % 2 == 0 else list(lines)[::-1]):
            s, batches[line], texts[line] = run(*lines[line])
            seconds[line].append(s)
        # Printed as it goes: a long run stopped early still leaves its finished rounds.
        print(f"round {rep + 1}: " + ", ".join(f"{line} {seconds[line][-1]:.1f} s" for line in lines), flush=True)
    ref = next(iter(lines))
    print(f"{args.model}, {args.task} n={args.n}, {', '.join(args.space or ['skiponly'])}, {len(searches)} searches "
          f"at K={args.k}: {len(texts[ref])} route evaluations, {args.reps} interleaved rounds")
    for line in lines:
        ratios = [r / s for r, s in zip(seconds[ref], seconds[line])]
        differ = sum(a != b for a, b in zip(texts[ref], texts[line]))
        print(f"  {line:<15} median {statistics.median(seconds[line]):7.1f} s  ({batches[line]} batches)  "
              f"{ref}/this {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]  "
              f"{differ} generations differ from {ref}")


if __name__ == "__main__":
    main()
