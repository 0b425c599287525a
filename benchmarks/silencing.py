"""Analysis cost: a silencing sweep over every layer x {mlp, attn, layer} against one
unablated pass over the same questions, on the demo model.

The sweep is `repair.silencing_sweep` (30 x 3 = 90 ablation rows per question on
SmolLM2, one batch row each, greedy, the multiple-choice length); the unablated pass is
the same questions' deployed generation through the same code (`engine.rows.run_rows` with
no intervention). The sweep runs as `run_rows` does by default: on a CPU each row
replays the blocks before its silenced one from its question's unablated prefill, on a
GPU it does not (`generate.replay_pays`). It runs also with the other choice, to show
what the reuse buys there and that both give the same generations, and with one
question's whole sweep (90 rows) per batch: fewer decoding steps, each over more rows.
All four run interleaved, `--reps` times each; each ratio is the median of the
per-round ratios against the unablated pass, with min-max. The device is the
package's (`RNR_DEVICE`, default cpu).

Also printed: the ratio of token positions each side pushes through the model (prompt
plus generated tokens, summed over rows, every block counted). Where the machine is
compute-bound (a CPU), that ratio bounds the time ratio from below, less what the
replayed blocks save (about half of the prefill: row by row, the blocks before the
silenced one).

    python benchmarks/silencing.py [--questions 2] [--reps 3] [--batch-size 32]
    RNR_DEVICE=cuda python benchmarks/silencing.py --questions 8 --batch-size 720

Target: ratio <= 3.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rnr_interp.engine.generate import replay_pays
from rnr_interp.interventions import Ablate
from rnr_interp.metrics import DEPLOYED
from rnr_interp.models import load_model
from rnr_interp.engine.rows import run_rows
from rnr_interp.engine.rows import Row
from rnr_interp.analyses.localise.repair import COMPONENTS, ablation_probe, silencing_sweep
from rnr_interp.engine.sampling import deployed_decoding, prompt_ids
from rnr_interp.tasks import load_task


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32, help="rows per batched generation (the repair default)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (one: the machine is shared)")
    args = ap.parse_args()
    if args.reps < 3:
        ap.error("--reps must be at least 3: a median of paired rounds needs them")
    torch.set_num_threads(args.threads)
    lm = load_model("smollm2")
    task = load_task("arithmetic_mc", n=args.questions)
    decoding = deployed_decoding(task)
    questions = task.questions
    half = len(questions) // 2
    failure, panel = questions[:half], questions[half:]
    n_rows = lm.n_layers * len(COMPONENTS)
    replays = replay_pays(lm)  # what the sweep does by default on this device
    print(f"model=smollm2 task=arithmetic_mc questions={len(questions)} rows/question={n_rows} "
          f"max_new_tokens={decoding.max_new_tokens} batch_size={args.batch_size} reps={args.reps} torch_threads={torch.get_num_threads()} "
          f"device={lm.device} prefix_reuse={'on' if replays else 'off'}")

    base_rows = [Row(q, (), DEPLOYED) for q in questions]

    def unablated():
        return run_rows(lm, task, base_rows, decoding, batch_size=args.batch_size)

    def sweep():
        return silencing_sweep(lm, task, failure, panel, decoding=decoding, batch_size=args.batch_size)

    ablated = [Row(q, (Ablate(c, layer),), ablation_probe(c, layer)) for q in questions for layer in range(lm.n_layers) for c in COMPONENTS]

    other = f"sweep_{'without' if replays else 'with'}_reuse"

    def sweep_other_reuse():
        return run_rows(lm, task, ablated, decoding, batch_size=args.batch_size, reuse_prefix=not replays)

    def sweep_question_per_batch():
        return silencing_sweep(lm, task, failure, panel, decoding=decoding, batch_size=n_rows)

    prompt_len = {q.id: len(prompt_ids(lm, task, q)) for q in questions}
    base_records = unablated()  # also the warm-up
    key = ["question_id", "probe"]
    reused = run_rows(lm, task, ablated, decoding, batch_size=args.batch_size, reuse_prefix=True).sort_values(key).reset_index(drop=True)
    plain = run_rows(lm, task, ablated, decoding, batch_size=args.batch_size, reuse_prefix=False).sort_values(key).reset_index(drop=True)
    same = (reused["text"] == plain["text"]) & (reused["finish"] == plain["finish"])
    print(f"generations identical with and without prefix reuse: {int(same.sum())} of {len(same)} rows "
          f"(largest log-prob difference {float((reused['logprob'] - plain['logprob']).abs().max()):.1e})")
    positions = lambda recs: sum(prompt_len[q] + n for q, n in zip(recs["question_id"], recs["n_tokens"]))  # noqa: E731
    print(f"token positions forwarded: sweep / unablated = {positions(plain) / positions(base_records):.1f}")
    # Where one step costs the same for any number of rows (a GPU on a small model), time
    # follows the decoding steps: each batch steps until its longest row stops.
    n_tokens = {(q, p): n for recs in (plain, base_records) for q, p, n in zip(recs["question_id"], recs["probe"], recs["n_tokens"])}
    steps = lambda rows, size: sum(max(n_tokens[(r.question.id, r.probe)] for r in rows[i:i + size])  # noqa: E731
                                   for i in range(0, len(rows), size))
    print(f"decoding steps: unablated {steps(base_rows, args.batch_size)}, sweep {steps(ablated, args.batch_size)} "
          f"(batches of {args.batch_size}), {steps(ablated, n_rows)} (batches of {n_rows})")
    wide = f"sweep_batch_{n_rows}"
    runs = {"unablated": unablated, "sweep": sweep, other: sweep_other_reuse, wide: sweep_question_per_batch}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(args.reps):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
        print(f"round {rep + 1}: " + ", ".join(f"{name} {t[-1]:.2f} s" for name, t in times.items()))
    print(f"unablated_pass: {statistics.median(times['unablated']):.2f} s; silencing_sweep ({n_rows} rows/question): "
          f"{statistics.median(times['sweep']):.2f} s; {other.replace('_', ' ')} {statistics.median(times[other]):.2f} s; "
          f"{n_rows} rows per batch {statistics.median(times[wide]):.2f} s")
    for name in ("sweep", other, wide):
        ratios = [t / b for t, b in zip(times[name], times["unablated"])]
        print(f"{name}_vs_unablated: {statistics.median(ratios):.1f} [{min(ratios):.1f}-{max(ratios):.1f}]"
              + (" (target <= 3)" if name == "sweep" else ""))
    with_reuse, without = (times["sweep"], times[other]) if replays else (times[other], times["sweep"])
    gains = [u / t for t, u in zip(with_reuse, without)]
    print(f"prefix_reuse_speedup: {statistics.median(gains):.2f} [{min(gains):.2f}-{max(gains):.2f}]")


if __name__ == "__main__":
    main()
