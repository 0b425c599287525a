"""The bridge's eager attention vs the fused SDPA path (`rnr_interp.fast_attention`),
measured on this engine: tokens/s for K samples of one long prompt.

The two paths run interleaved, eager fused eager fused ..., `--reps` times each, with the
same prompt and seeds (the generations are checked to be identical, so both count the
same tokens). Printed: median tokens/s of each path and the median of the per-round
ratios fused / eager, with their min-max.

    python benchmarks/attention.py [--model smollm2] [--k 32] [--prompt-tokens 100] [--new-tokens 32] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rnr_interp import fast_attention
from rnr_interp.generate import Decoding, generate
from rnr_interp.models import load_model

FILLER = "Count the apples: one, two, three, four, five, six, seven, eight, nine, ten. "


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)

    lm = load_model(args.model)
    ids = lm.encode(lm.render(FILLER * 20))
    prompt = ids[: args.prompt_tokens]
    seeds = [[1000 + j for j in range(args.k)]]
    decoding = Decoding(temperature=1.0, max_new_tokens=args.new_tokens)

    def run(fused: bool) -> tuple[float, list[list[int]]]:
        (fast_attention.install if fused else fast_attention.uninstall)(lm.bridge)
        start = time.perf_counter()
        gens = generate(lm, [prompt], n=args.k, decoding=decoding, seeds=seeds)[0]
        seconds = time.perf_counter() - start
        return sum(g.n_tokens for g in gens) / seconds, [g.tokens for g in gens]

    run(False), run(True)  # warm-up: first-call allocations on both paths
    rates: dict[bool, list[float]] = {False: [], True: []}
    outputs = set()
    for _ in range(args.reps):
        for fused in (False, True):
            rate, tokens = run(fused)
            rates[fused].append(rate)
            outputs.add(repr(tokens))
    ratios = [f / e for e, f in zip(rates[False], rates[True])]
    print(f"{args.model}: K={args.k}, prompt {len(prompt)} tokens, {args.new_tokens} new tokens, T=1, "
          f"{args.reps} interleaved rounds, one torch thread")
    print(f"  eager attention  {statistics.median(rates[False]):8.1f} tokens/s  (rounds: "
          + ", ".join(f"{r:.1f}" for r in rates[False]) + ")")
    print(f"  fused (SDPA)     {statistics.median(rates[True]):8.1f} tokens/s  (rounds: "
          + ", ".join(f"{r:.1f}" for r in rates[True]) + ")")
    print(f"  fused / eager: median {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")
    print(f"  generations identical on both paths: {len(outputs) == 1}")


if __name__ == "__main__":
    main()
