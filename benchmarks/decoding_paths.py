"""The engine's two copy-avoiding paths against what they replace, on this engine:
tokens/s for K samples of one long prompt.

- old: the bridge's eager attention (`repeat_kv` copies the KV cache every step) and
  transformers' `DynamicLayer` cache (appends by `torch.cat`, another whole copy);
- fused: the fused SDPA attention (`rnr_interp.fast_attention`), `DynamicLayer` cache;
- new: fused attention and the engine's in-place cache layer (`generate.new_cache`).

The paths run interleaved, old fused new old fused new ..., `--reps` times each, with the
same prompt and seeds; the generations are checked to be identical, so every path counts
the same tokens. Printed: median tokens/s of each path, and the median of the per-round
ratios to the old path with their min-max.

    python benchmarks/decoding_paths.py [--model smollm2] [--k 32] [--prompt-tokens 100] [--new-tokens 32] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from rnr_interp import fast_attention
from rnr_interp import generate as engine
from rnr_interp.models import load_model

FILLER = "Count the apples: one, two, three, four, five, six, seven, eight, nine, ten. "
PATHS = ("old", "fused", "new")


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
    prompt = lm.encode(lm.render(FILLER * 20))[: args.prompt_tokens]
    seeds = [[1000 + j for j in range(args.k)]]
    decoding = engine.Decoding(temperature=1.0, max_new_tokens=args.new_tokens)
    engine_cache = engine.new_cache

    def run(path: str) -> tuple[float, list[list[int]]]:
        (fast_attention.uninstall if path == "old" else fast_attention.install)(lm.bridge)
        engine.new_cache = engine_cache if path == "new" else DynamicCache
        start = time.perf_counter()
        gens = engine.generate(lm, [prompt], n=args.k, decoding=decoding, seeds=seeds)[0]
        seconds = time.perf_counter() - start
        return sum(g.n_tokens for g in gens) / seconds, [g.tokens for g in gens]

    for path in PATHS:  # warm-up: first-call allocations on every path
        run(path)
    rates: dict[str, list[float]] = {path: [] for path in PATHS}
    outputs = set()
    for _ in range(args.reps):
        for path in PATHS:
            rate, tokens = run(path)
            rates[path].append(rate)
            outputs.add(repr(tokens))
    engine.new_cache = engine_cache
    print(f"{args.model}: K={args.k}, prompt {len(prompt)} tokens, {args.new_tokens} new tokens, T=1, "
          f"{args.reps} interleaved rounds, one torch thread")
    for path in PATHS:
        line = f"  {path:6s} {statistics.median(rates[path]):9.1f} tokens/s  (rounds: " + ", ".join(f"{r:.1f}" for r in rates[path]) + ")"
        if path != "old":
            ratios = [r / o for r, o in zip(rates[path], rates["old"])]
            line += f"  / old: median {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
        print(line)
    print(f"  generations identical on every path: {len(outputs) == 1}")


if __name__ == "__main__":
    main()
