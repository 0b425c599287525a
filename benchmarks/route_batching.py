"""The routing audit's route evaluations: rows on different routes in one batch (a
shared schedule, `interventions.route_schedule`) against the batching it replaced.

- before: skip-only routes mixed per row by layer ablation (every row runs all L blocks,
  no prefill replay); any route with a repeat in a batch of its own (one question per
  batch when the searches ask one route per question, as MCTS does every round);
- now: `RouteEvaluator` as the audit runs it.

Both run the same searches (random, MCTS, hill climbing, genetic at budget K, gold
reward) over the same questions in one route space; their generations are checked to be
identical. The two run interleaved, before now before now ..., `--reps` times each.
Printed: median seconds of each, forwards (batches) each took, and the median of the
per-round ratios before/now with their min-max.

    python benchmarks/route_batching.py [--model smollm2] [--task arithmetic] [--n 8] [--k 8] [--space native] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from rnr_interp.generate import Decoding, generate
from rnr_interp.interventions import Ablate, Route, set_id
from rnr_interp.models import load_model
from rnr_interp.routing.audit import RouteEvaluator, run_searches
from rnr_interp.routing.spaces import make_space
from rnr_interp.sampling import candidate_row, prompt_ids
from rnr_interp.tasks import load_task


class Before(RouteEvaluator):
    """The evaluator's batching before rows on different routes shared a batch."""

    def __call__(self, requests):
        todo: dict[tuple[int, ...], list[str]] = {}
        for qid, route in requests:
            if (qid, route) not in self.cache and qid not in todo.setdefault(route, []):
                todo[route].append(qid)
        skips = [(q, r) for r, qs in todo.items() if all(a < b for a, b in zip(r, r[1:])) for q in qs]
        for start in range(0, len(skips), self.batch_size):
            part = skips[start:start + self.batch_size]
            rows = [[Ablate("layer", layer) for layer in range(self.lm.n_layers) if layer not in set(r)] for _, r in part]
            self._run([q for q, _ in part], [r for _, r in part], rows, reuse=False)
        for route, qids in todo.items():
            if any(a >= b for a, b in zip(route, route[1:])):
                for start in range(0, len(qids), self.batch_size):
                    chunk = qids[start:start + self.batch_size]
                    self._run(chunk, [route] * len(chunk), [Route(route)], reuse=True)
        return [self.cache[req] for req in requests]

    def _run(self, qids, routes, interventions, reuse):
        chunk = [self.by_id[q] for q in qids]
        gens = generate(self.lm, [prompt_ids(self.lm, self.task, q) for q in chunk], decoding=self.decoding,
                        interventions=interventions, stop_strings=self.task.stop_strings,
                        reuse=self._states(chunk) if reuse else None)
        self.n_batches += 1
        for q, route, [g] in zip(chunk, routes, gens):
            self.cache[(q.id, route)] = candidate_row(self.task, q, g, intervention=set_id([Route(route)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--space", default="native")
    ap.add_argument("--min-len", type=int, default=27)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    lm = load_model(args.model)
    task = load_task(args.task, n=args.n)
    space = make_space(args.space, lm.n_layers, min_len=min(args.min_len, lm.n_layers))
    decoding = Decoding(max_new_tokens=task.max_new_tokens)

    def run(kind: type[RouteEvaluator]) -> tuple[float, int, list[str]]:
        ev = kind(lm, task, decoding, args.batch_size)
        start = time.perf_counter()
        texts = []
        for method in ("random", "mcts", "hill_climb", "genetic"):
            found = run_searches(ev, task.questions, space, method, args.k, 0, lambda q, row: float(row["correct"]))
            texts += [row["text"] for pairs in found.values() for _, row in pairs]
        return time.perf_counter() - start, ev.n_batches, texts

    seconds: dict[str, list[float]] = {"before": [], "now": []}
    batches: dict[str, int] = {}
    for _ in range(args.reps):
        (b, batches["before"], before), (n, batches["now"], now) = run(Before), run(RouteEvaluator)
        if before != now:
            diff = sum(x != y for x, y in zip(before, now))
            raise SystemExit(f"the two batchings generated different text for {diff} of {len(now)} evaluations")
        seconds["before"].append(b)
        seconds["now"].append(n)
    ratios = [b / n for b, n in zip(seconds["before"], seconds["now"])]
    print(f"{args.model}, {args.task} n={args.n}, {args.space} K={args.k}: {len(now)} route evaluations, identical text")
    for kind in seconds:
        print(f"  {kind:<7} median {statistics.median(seconds[kind]):7.1f} s  ({batches[kind]} forwards)")
    print(f"  before/now: median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f}), {args.reps} interleaved rounds")


if __name__ == "__main__":
    main()
