"""The engine's decoding paths against what each replaced, on this engine: tokens/s for
K samples of one long prompt. Each path adds one step to the one before it:

- old: the bridge's eager attention (`repeat_kv` copies the KV cache every step) and
  transformers' `DynamicLayer` cache (appends by `torch.cat`, another whole copy);
- fused: the fused SDPA attention (`rnr_interp.models.fast_attention`), `DynamicLayer` cache;
- new: fused attention and the engine's in-place cache layer (`generate.new_cache`);
- one-query: and a CPU decoding step's attention as grouped matmuls
  (`fast_attention._attend_one_query`; SDPA for every step on the paths before);
- sliced: and the sampler's vocabulary-wide passes in `generate.SAMPLER_ROWS`-row
  slices (one pass over the whole batch on the paths before): the engine as it is.

The paths run interleaved, old fused new ... old fused new ..., `--reps` times each, with
the same prompt and seeds. Printed: median tokens/s of each path, the median of the
per-round ratios to the old path and to the path before, with their min-max, and whether
the generations are identical on every path (the one-query attention rounds differently,
so a sampled token at a near tie may differ; the tokens/s count each path's own tokens).

    python benchmarks/decoding_paths.py [--model smollm2] [--k 32] [--prompt-tokens 100] [--new-tokens 32] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from rnr_interp.models import fast_attention
from rnr_interp.engine import generate as engine
from rnr_interp.engine.decoding import Decoding
from rnr_interp.models import load_model

FILLER = "Count the apples: one, two, three, four, five, six, seven, eight, nine, ten. "
PATHS = ("old", "fused", "new", "one-query", "sliced")


def sdpa_one_query(query, key, value, additive, scale):
    """The fused path's decoding step as it was before `_attend_one_query`."""
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=additive, scale=scale,
                                                            enable_gqa=key.shape[1] != query.shape[1])


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
    decoding = Decoding(temperature=1.0, max_new_tokens=args.new_tokens)
    engine_cache, one_query, sampler_rows = engine.new_cache, fast_attention._attend_one_query, engine.SAMPLER_ROWS

    def run(path: str) -> tuple[float, list[list[int]]]:
        step = PATHS.index(path)
        (fast_attention.uninstall if path == "old" else fast_attention.install)(lm.bridge)
        engine.new_cache = engine_cache if step >= PATHS.index("new") else DynamicCache
        fast_attention._attend_one_query = one_query if step >= PATHS.index("one-query") else sdpa_one_query
        engine.SAMPLER_ROWS = sampler_rows if path == "sliced" else 1 << 30
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
    engine.new_cache, fast_attention._attend_one_query, engine.SAMPLER_ROWS = engine_cache, one_query, sampler_rows
    print(f"{args.model}: K={args.k}, prompt {len(prompt)} tokens, {args.new_tokens} new tokens, T=1, "
          f"{args.reps} interleaved rounds, one torch thread")
    for path in PATHS:
        line = f"  {path:9s} {statistics.median(rates[path]):9.1f} tokens/s  (rounds: " + ", ".join(f"{r:.1f}" for r in rates[path]) + ")"
        if path != "old":
            before = PATHS[PATHS.index(path) - 1]
            for ref in dict.fromkeys(("old", before)):
                ratios = [r / o for r, o in zip(rates[path], rates[ref])]
                line += f"  / {ref}: median {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
        print(line)
    print(f"  generations identical on every path: {len(outputs) == 1}")


if __name__ == "__main__":
    main()
