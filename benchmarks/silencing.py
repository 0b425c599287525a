"""Analysis cost: a silencing sweep over every layer x {mlp, attn, layer} against one
unablated pass over the same questions, on the demo model.

The sweep is `repair.silencing_sweep` (30 x 3 = 90 ablation rows per question on
SmolLM2, one batch row each, greedy, the multiple-choice length); the unablated pass is
the same questions' deployed generation through the same code (`cohort.run_rows` with
no intervention). Both run interleaved, `--reps` times each; the ratio is the median of
the per-round ratios sweep / unablated, with min-max.

Also printed: the ratio of token positions each side pushes through the model (prompt
plus generated tokens, summed over rows). Where the machine is compute-bound (a CPU),
that ratio is roughly the floor of the time ratio: every ablation row is a forward pass
of its own, and only the blocks before the silenced one could be shared.

    python benchmarks/silencing.py [--questions 2] [--reps 3] [--batch-size 32]

Target: ratio <= 3.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rnr_interp.interventions import Ablate
from rnr_interp.metrics import DEPLOYED
from rnr_interp.models import load_model
from rnr_interp.cohort import Row, run_rows
from rnr_interp.repair import COMPONENTS, ablation_probe, silencing_sweep
from rnr_interp.sampling import deployed_decoding, prompt_ids
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
    print(f"model=smollm2 task=arithmetic_mc questions={len(questions)} rows/question={n_rows} "
          f"max_new_tokens={decoding.max_new_tokens} batch_size={args.batch_size} reps={args.reps} torch_threads={torch.get_num_threads()}")

    def unablated():
        return run_rows(lm, task, [Row(q, (), DEPLOYED) for q in questions], decoding, batch_size=args.batch_size)

    def sweep():
        return silencing_sweep(lm, task, failure, panel, decoding=decoding, batch_size=args.batch_size)

    prompt_len = {q.id: len(prompt_ids(lm, task, q)) for q in questions}
    base_records = unablated()  # also the warm-up
    ablated = [Row(q, (Ablate(c, layer),), ablation_probe(c, layer)) for q in questions for layer in range(lm.n_layers) for c in COMPONENTS]
    sweep_records = run_rows(lm, task, ablated, decoding, batch_size=args.batch_size)
    positions = lambda recs: sum(prompt_len[q] + n for q, n in zip(recs["question_id"], recs["n_tokens"]))  # noqa: E731
    print(f"token positions forwarded: sweep / unablated = {positions(sweep_records) / positions(base_records):.1f}")
    base_s, sweep_s = [], []
    for rep in range(args.reps):
        for times, run in ((base_s, unablated), (sweep_s, sweep)):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        print(f"round {rep + 1}: unablated {base_s[-1]:.2f} s, sweep {sweep_s[-1]:.2f} s, ratio {sweep_s[-1] / base_s[-1]:.1f}")
    ratios = [s / b for s, b in zip(sweep_s, base_s)]
    print(f"unablated_pass: {statistics.median(base_s):.2f} s; silencing_sweep ({n_rows} rows/question): {statistics.median(sweep_s):.2f} s")
    print(f"sweep_vs_unablated: {statistics.median(ratios):.1f} [{min(ratios):.1f}-{max(ratios):.1f}] (target <= 3)")


if __name__ == "__main__":
    main()
