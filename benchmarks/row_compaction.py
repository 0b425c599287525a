"""Finished rows leaving the batch one by one against in groups (`generate.COMPACT_SHARE`),
on K long samples of real questions, where rows finish at many different steps.

Removing a finished row copies every row's KV cache; K samples of 256-token GSM8K
answers finish one by one, so the one-by-one engine paid for a copy of the whole cache
nearly every step. The two lines run interleaved (A B, B A, ...), `--reps` rounds, same
prompts and seeds; the generations are checked to be identical. Printed: median tokens/s of each
line and the median of the per-round ratios with their min-max.

    python benchmarks/row_compaction.py [--model smollm2] [--task gsm8k] [--data FILE] [--n 1] [--k 32] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rnr_interp.engine import generate as engine
from rnr_interp.engine.decoding import Decoding
from rnr_interp.models import load_model
from rnr_interp.engine.sampling import prompt_ids
from rnr_interp.tasks import load_task

LINES = {"one by one": 0.0, "in groups": engine.COMPACT_SHARE}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--data", default=None, help="data file of a file-backed task")
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    lm = load_model(args.model)
    task = load_task(args.task, args.data, n=args.n)
    prompts = [prompt_ids(lm, task, q) for q in task.questions]
    seeds = [[1000 * b + j for j in range(args.k)] for b in range(len(prompts))]
    decoding = Decoding(temperature=1.0, max_new_tokens=task.max_new_tokens)

    def run(share: float) -> tuple[float, list[list[int]]]:
        engine.COMPACT_SHARE = share
        start = time.perf_counter()
        gens = [g for row in engine.generate(lm, prompts, n=args.k, decoding=decoding, seeds=seeds,
                                             stop_strings=task.stop_strings) for g in row]
        seconds = time.perf_counter() - start
        return sum(g.n_tokens for g in gens) / seconds, [g.tokens for g in gens]

    rates: dict[str, list[float]] = {line: [] for line in LINES}
    outputs: dict[str, list[list[int]]] = {}
    for rep in range(args.reps):
        # A B, B A, ...: a machine that drifts within a round does not favour one line
        for line, share in (list(LINES.items()) if rep % 2 == 0 else reversed(LINES.items())):
            rate, outputs[line] = run(share)
            rates[line].append(rate)
    engine.COMPACT_SHARE = LINES["in groups"]
    lengths = [len(t) for t in outputs["in groups"]]
    print(f"{args.model}, {args.task}: {len(prompts)} questions x K={args.k}, up to {task.max_new_tokens} new tokens "
          f"(rows ended after {min(lengths)}-{max(lengths)}), T=1, {torch.get_num_threads()} torch threads, "
          f"{args.reps} interleaved rounds")
    ref = next(iter(LINES))
    for line in LINES:
        ratios = [r / o for r, o in zip(rates[line], rates[ref])]
        print(f"  {line:<11} {statistics.median(rates[line]):8.1f} tokens/s (rounds: "
              + ", ".join(f"{r:.1f}" for r in rates[line]) + f")  / {ref}: median {statistics.median(ratios):.2f} "
              f"[{min(ratios):.2f}-{max(ratios):.2f}]")
    print(f"  generations identical: {outputs['one by one'] == outputs['in groups']}")


if __name__ == "__main__":
    main()
