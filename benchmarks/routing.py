"""Routing at the speed of sampling: a routing cell's route evaluations against plain
sampling of the same questions, in tokens per second, measured in one process.

A route line runs every search of the audit (random and the structured searches, gold-
and answer-blind-rewarded, in the `--space` route spaces) on `--n` questions of the demo
model's task with budget `--k`, in one lockstep as the audit does (`run_searches`, a
fresh `RouteEvaluator` each time, so no line reuses another's generations). The sampling
line draws, for the same questions, as many temperature samples per question as the
route line evaluated routes per question (`sampling.engine_runner`, at most `--rows`
rows per call, the route batches' bound), at the task's max new tokens: the same number
of candidates of the same kind, so both generate about the same number of tokens.
Tokens counted are the generated tokens before each candidate's stop, for both.

Lines: `sequential` (the searches as they are, one route per search and question per
round where they ask one at a time; sparse slots, the engine's default on a CPU: each
route position runs its block on the rows whose route runs it,
`engine.batch.Batch.run_slot`), `sequential-dense` (the same searches, every row
running the batch's whole union schedule and throwing away the results of the positions
its route skips: the engine before sparse slots), `sampling`, and `batched` (sparse
slots, each structured search proposing `--search-batch` routes per round,
`RouteConfig.proposals`). They run interleaved, the order reversed
every other round. Printed per route line:

    route_tokens_per_s_vs_sampling: X [lo-hi]   median over rounds of (route tokens/s) /
                                                (sampled tokens/s of the same round), min-max
    rounds_per_cell: N                          lockstep rounds the searches took
    rows_per_forward: M                         mean rows per decoding forward (one token each)
    block_tokens: B                             tokens (rows x positions) the blocks ran on,
                                                summed over block calls: the compute
    decode_tokens_per_s_vs_sampling: Y [lo-hi]  the same ratio over decoding seconds only
                                                (each line's prefill seconds left out)
    prefill_share: P [lo-hi]                    share of the line's seconds spent in prefills

Why both: sampling prefills a prompt once for its K samples, while every route needs its
own prefill from the block where it leaves the full path (`generate.PromptStates` replays
the blocks before it). With short answers (arithmetic: about 17 tokens against a
53-token prompt) that prefill is most of a route's cost, so X is bounded by
1 - prefill_share even where decoding runs at sampling's speed (Y near 1).

and `wasted_block_tokens: dense W -> sparse 0.00`, the share of the dense line's block
tokens that belonged to rows passing that position by (the sparse line runs exactly the
rows that run each position; both generate the same tokens, checked), and
`sparse_vs_dense_speed`, the dense line's seconds over the sparse line's, per round. Only ratios within one
run mean anything: never compare absolute times across runs.

    python benchmarks/routing.py [--quick] [--n 8] [--k 8] [--space skiponly] [--min-len 27] [--reps 3] [--search-batch 8]
                                 [--lines sequential,sequential-dense,batched] [--one-round] [--count-rounds]

`--one-round` replaces the search lines by one line, `one-round`: each question's K
distinct random routes handed to the evaluator in a single call, so every batch is as
wide as `--rows` allows, as in the wide rounds of a whole cell, whose searches a small
benchmark case cannot fill. It measures the engine apart from the searches' rounds.
`--count-rounds` loads no model: it counts the lockstep rounds one chunk of `--n`
questions takes through the audit's searches at `--k` (the demo model's 30 blocks, stub
answers), for sequential, default and `--search-batch` proposals.

Target on the 2-core CPU: route_tokens_per_s_vs_sampling >= 0.8.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from rnr_interp.engine.decoding import Decoding

from rnr_interp.engine import generate as engine
from rnr_interp.engine.generate import generate
from rnr_interp.interventions import site_hook
from rnr_interp.models import load_model
from rnr_interp.analyses.routing.config import ROUTE_ROWS, STRUCTURED, RouteConfig
from rnr_interp.analyses.routing.evaluator import RouteEvaluator, Search, run_searches
from rnr_interp.analyses.routing.run import audit_searches
from rnr_interp.analyses.routing.search import random_search
from rnr_interp.analyses.routing.spaces import make_space
from rnr_interp.engine.sampling import prompt_ids
from rnr_interp.reproduce.profiles import DEMO
from rnr_interp.tasks import load_task
from sampling import engine_runner, spread  # benchmarks/sampling.py, beside this script


@dataclass
class Work:
    """What the model did during one line's run."""

    seconds: float = 0.0
    tokens: int = 0  # generated tokens before each candidate's stop
    candidates: int = 0
    rounds: int = 0  # lockstep rounds (route lines)
    decode_forwards: int = 0
    decode_rows: int = 0
    block_tokens: int = 0
    prefill_seconds: float = 0.0  # in the prompts' prefills (`generate._prefill`), the rest decoding
    texts: tuple[str, ...] = ()

    def decode_rate(self) -> float:
        """Generated tokens per second of decoding (the prefills' seconds left out)."""
        return self.tokens / (self.seconds - self.prefill_seconds)


@contextlib.contextmanager
def counting(lm, work: Work) -> Iterator[None]:
    """Count, into `work`, the rows of every decoding forward (one new position), the
    tokens (rows x positions) every block call runs on (the bridge's hook_resid_pre of
    each block: a route position's block on its own rows with sparse slots, on every row
    without; replayed prefill blocks run nothing) and the seconds spent in prefills."""

    def embedded(module, args, out):
        if out.shape[1] == 1:
            work.decode_forwards += 1
            work.decode_rows += out.shape[0]

    def block_in(act, hook=None):
        work.block_tokens += act.shape[0] * act.shape[1]
        return act

    prefill = engine._prefill

    def timed_prefill(*args, **kwargs):
        start = time.perf_counter()
        try:
            return prefill(*args, **kwargs)
        finally:
            work.prefill_seconds += time.perf_counter() - start

    handle = lm.hf_model.get_input_embeddings().register_forward_hook(embedded)
    engine._prefill = timed_prefill
    try:
        with lm.bridge.hooks(fwd_hooks=[(site_hook(lm, "hook_resid_pre", layer), block_in) for layer in range(lm.n_layers)]):
            yield
    finally:
        engine._prefill = prefill
        handle.remove()


def route_runner(lm, task, searches: dict[str, Search], k: int, rows: int, sparse: bool) -> Callable[[], Work]:
    decoding = Decoding(max_new_tokens=task.max_new_tokens)

    def run() -> Work:
        work = Work()
        ev = RouteEvaluator(lm, task, decoding, rows, sparse_slots=sparse)
        with counting(lm, work):
            start = time.perf_counter()
            found = run_searches(ev, task.questions, searches, k, 0)
            work.seconds = time.perf_counter() - start
        work.rounds, work.candidates = ev.n_calls, ev.n_generated
        work.tokens = sum(row["n_tokens"] for row in ev.cache.values())
        work.texts = tuple(row["text"] for label in searches for pairs in found[label].values() for _, row in pairs)
        return work

    return run


def one_round_runner(lm, task, space, k: int, rows: int, seed: int = 0) -> Callable[[], Work]:
    """Every question's `k` distinct random routes of `space` (the random search's own
    draws after the full path, `search.random_search`) handed to the evaluator in one
    call: the engine at the width a cell's rounds reach, without the searches' rounds."""
    decoding = Decoding(max_new_tokens=task.max_new_tokens)
    drawn: list[tuple[int, ...]] = []
    random_search(space, lambda routes: drawn.extend(routes) or [0.0] * len(routes), k + 1, np.random.default_rng(seed))
    routes = drawn[1:]  # the full path comes first
    requests = [(q.id, route) for q in task.questions for route in routes]

    def run() -> Work:
        work = Work()
        ev = RouteEvaluator(lm, task, decoding, rows)
        with counting(lm, work):
            start = time.perf_counter()
            found = ev(requests)
            work.seconds = time.perf_counter() - start
        work.rounds, work.candidates = ev.n_calls, ev.n_generated
        work.tokens = sum(row["n_tokens"] for row in found)
        work.texts = tuple(row["text"] for row in found)
        return work

    return run


class StubEvaluator:
    """Stands for `RouteEvaluator` where only the rounds are counted: each (question,
    route) gets a seeded random answer, right one time in five, so the searches move as
    they would on rewards of that kind; no model runs."""

    def __init__(self):
        self.n_calls = 0
        self.cache: dict[tuple[str, tuple[int, ...]], dict] = {}

    def __call__(self, requests: list[tuple[str, tuple[int, ...]]]) -> list[dict]:
        self.n_calls += 1
        for qid, route in requests:
            rng = np.random.default_rng(zlib.crc32(repr((qid, route)).encode()))
            answer = int(rng.integers(5))
            self.cache[(qid, route)] = {"correct": answer == 0, "extracted": str(answer),
                                        "logprob": float(-rng.exponential(5.0)), "n_tokens": 10}
        return [self.cache[req] for req in requests]


def count_rounds(spaces: dict, questions, k: int, methods: tuple[str, ...], batch: int) -> dict[str, int]:
    """Lockstep rounds of one chunk of `questions` through every search of the audit at
    budget `k`, per proposals setting (1: all sequential; None: the audit's default;
    `batch`: all batched), with rewards from `StubEvaluator`; `random_matched`'s own
    lockstep adds one round where it runs."""
    out = {}
    for name, proposals in (("sequential (--proposals 1)", 1), ("default", None), (f"batched (--proposals {batch})", batch)):
        ev = StubEvaluator()
        run_searches(ev, questions, audit_searches(spaces, methods, proposals=proposals), k, 0)
        out[name] = ev.n_calls + ("random_matched" in methods)
    return out


def sampling_runner(lm, task, per_question: int, rows: int) -> Callable[[], Work]:
    prompts = [prompt_ids(lm, task, q) for q in task.questions]
    # As many prompts per call as keep a call within the route batches' rows.
    tokens_of = engine_runner(generate, lm, prompts, per_question, 1.0, task.max_new_tokens, max(1, rows // per_question))

    def run() -> Work:
        work = Work(candidates=per_question * len(prompts))
        with counting(lm, work):
            start = time.perf_counter()
            work.tokens = tokens_of()
            work.seconds = time.perf_counter() - start
        return work

    return run


#: the demo model's blocks (SmolLM2-135M), for counting rounds without loading it
DEMO_LAYERS = 30
#: the route methods a cell runs (`RouteConfig.methods`)
ROUTE_METHODS = RouteConfig().methods
#: the route lines, in their running order
ROUTE_LINES = ("sequential", "sequential-dense", "batched")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 questions, K=4, skiponly (about three minutes on 2 cores)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--n", type=int, default=8, help="questions")
    ap.add_argument("--k", type=int, default=8, help="route evaluations per search and question (the budget K)")
    ap.add_argument("--space", action="append", help="route space (repeatable; default skiponly)")
    ap.add_argument("--min-len", type=int, default=DEMO.route_min_len,
                    help="shortest route, in blocks (default: the demo profile's routing cells')")
    ap.add_argument("--rows", type=int, default=ROUTE_ROWS, help="most rows per batched generation (every line)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds (>= 3)")
    ap.add_argument("--search-batch", type=int, default=8,
                    help="routes each structured search proposes per round on the batched line (RouteConfig.proposals)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--one-round", action="store_true",
                    help="instead of the searches: each question's K random routes of the one --space in one call "
                         "(the engine at full width, as in a cell's wide rounds)")
    ap.add_argument("--count-rounds", action="store_true",
                    help="no model: count the lockstep rounds of one chunk of --n questions through the audit's "
                         "searches at --k on the demo model's 30 blocks, sequential, default and batched "
                         "(a cell at K=32: --n 10 --k 32 "
                         "--space native --space polar --space skiponly)")
    ap.add_argument("--lines", default=",".join(ROUTE_LINES),
                    help=f"route lines to run beside sampling, comma-separated (default: all of {', '.join(ROUTE_LINES)})")
    args = ap.parse_args()
    if args.reps < 3:
        ap.error("--reps must be at least 3: a median of paired rounds needs them")
    if args.quick:
        args.n, args.k, args.space = 4, 4, ["skiponly"]
    chosen = [line.strip() for line in args.lines.split(",") if line.strip()]
    if not chosen or set(chosen) - set(ROUTE_LINES):
        ap.error(f"--lines takes some of {', '.join(ROUTE_LINES)}, got {args.lines!r}")
    if args.one_round and len(args.space or ["skiponly"]) != 1:
        ap.error("--one-round takes one --space")
    torch.set_num_threads(args.threads)
    if args.count_rounds:
        spaces = {name: make_space(name, DEMO_LAYERS, min_len=args.min_len) for name in args.space or ["skiponly"]}
        questions = load_task(args.task, n=args.n).questions
        rounds = count_rounds(spaces, questions, args.k, ROUTE_METHODS, args.search_batch)
        print(f"{args.task} n={args.n}, {', '.join(spaces)}, K={args.k}, the audit's searches "
              f"({', '.join(ROUTE_METHODS)} and the blind ones), stub rewards:")
        for name, n in rounds.items():
            print(f"[{name}] rounds_per_cell: {n}")
        return
    lm = load_model(args.model)
    task = load_task(args.task, n=args.n)
    spaces = {name: make_space(name, lm.n_layers, min_len=args.min_len) for name in args.space or ["skiponly"]}
    searches = audit_searches(spaces, STRUCTURED, proposals=1)
    batched = audit_searches(spaces, STRUCTURED, proposals=args.search_batch)
    runners = {"sequential": lambda: route_runner(lm, task, searches, args.k, args.rows, sparse=True),
               "sequential-dense": lambda: route_runner(lm, task, searches, args.k, args.rows, sparse=False),
               "batched": lambda: route_runner(lm, task, batched, args.k, args.rows, sparse=True)}
    if args.one_round:
        (space,) = spaces.values()
        routes = {"one-round": one_round_runner(lm, task, space, args.k, args.rows)}
    else:
        routes = {line: runners[line]() for line in ROUTE_LINES if line in chosen}
    # Warm-up, not timed; it also says how many candidates the sampling line draws.
    warm = next(iter(routes.values()))()
    per_question = max(1, math.ceil(warm.candidates / len(task.questions)))
    lines = {**routes, "sampling": sampling_runner(lm, task, per_question, args.rows)}
    works: dict[str, list[Work]] = {line: [] for line in lines}
    for rep in range(args.reps):
        for line in (list(lines) if rep % 2 == 0 else list(lines)[::-1]):
            works[line].append(lines[line]())
        print(f"round {rep + 1}: " + ", ".join(f"{line} {w[-1].tokens / w[-1].seconds:.0f} tokens/s" for line, w in works.items()),
              flush=True)
    work = (f"one round of K={args.k} random routes per question" if args.one_round
            else f"{len(searches)} searches at K={args.k}")
    print(f"{args.model}, {args.task} n={args.n}, {', '.join(spaces)} (routes >= {args.min_len} blocks), {work}: "
          f"{warm.candidates} route evaluations; sampling {per_question} samples per question; {args.reps} interleaved rounds; "
          f"torch_threads={torch.get_num_threads()}")
    sampled = works["sampling"]
    for line, runs in works.items():
        last = runs[-1]
        print(f"[{line}] tokens {last.tokens} in {last.candidates} candidates")
        if line != "sampling":
            ratios = [(w.tokens / w.seconds) / (s.tokens / s.seconds) for w, s in zip(runs, sampled)]
            print(f"[{line}] route_tokens_per_s_vs_sampling: {spread(ratios)}")
            print(f"[{line}] rounds_per_cell: {last.rounds}")
            decode = [w.decode_rate() / s.decode_rate() for w, s in zip(runs, sampled)]
            print(f"[{line}] decode_tokens_per_s_vs_sampling: {spread(decode)}")
        print(f"[{line}] prefill_share: {spread([w.prefill_seconds / w.seconds for w in runs])}")
        print(f"[{line}] rows_per_forward: {last.decode_rows / max(last.decode_forwards, 1):.1f}")
        print(f"[{line}] block_tokens: {last.block_tokens}")
    if not {"sequential", "sequential-dense"} <= set(works):
        return
    dense, sparse = works["sequential-dense"][-1], works["sequential"][-1]
    print(f"wasted_block_tokens: dense {1 - sparse.block_tokens / dense.block_tokens:.2f} -> sparse 0.00")
    print(f"sparse_vs_dense_speed: {spread([d.seconds / s.seconds for d, s in zip(works['sequential-dense'], works['sequential'])])}")
    differ = sum(a != b for a, b in zip(dense.texts, sparse.texts))
    print(f"generations differing between dense and sparse: {differ} of {len(sparse.texts)}")


if __name__ == "__main__":
    main()
