"""Base vs fine-tuned checkpoints, question by question (see experiments/README.md).

    python experiments/checkpoint_audit.py --out runs/ckpt_audit

For each recipe in experiments/finetune.py (grpo, sft): train a checkpoint (skipped when
OUT/RECIPE already holds one), audit the base model and the checkpoint on the same
held-out arithmetic questions with the same probe (`run_audit`; an existing run folder
is resumed), then compare them (`compare_runs`, with the budget control: both models
re-probed at K and 2K with fresh seeds). Writes
OUT/compare_RECIPE folders, OUT/figures/*.html and OUT/results.json (one row per recipe).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rnr_interp.analyses.audit import run_audit
from rnr_interp.analyses.checkpoints import compare_runs
from rnr_interp.models import load_model
from rnr_interp.records import RunDir
from rnr_interp.report.compare_figures import change_figure, gained_lost_figure, propensity_figure
from rnr_interp.engine.sampling import Probe, deployed_decoding
from rnr_interp.tasks import load_task

from rnr_interp.analyses import finetune


def audit(spec: str, task, out: Path, probe: Probe) -> RunDir:
    t0 = time.time()
    lm = load_model(spec)
    run_audit(lm, task, out, probe=probe, deployed=deployed_decoding(task), progress=False)
    print(f"audit {spec}: {time.time() - t0:.0f} s", flush=True)
    return RunDir(out)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/ckpt_audit"))
    parser.add_argument("--recipes", nargs="+", default=["grpo", "sft"])
    parser.add_argument("--n", type=int, default=64, help="audit questions (held out from training)")
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--steps", type=int, default=finetune.Config.steps)
    args = parser.parse_args(argv)

    task = load_task("arithmetic", n=args.n)
    probe = Probe(k=args.k, temperature=args.temperature)
    base = audit(args.model, task, args.out / "audit_base", probe)
    results, pairs, props = [], [], []
    for recipe in args.recipes:
        ckpt = args.out / recipe
        if not (ckpt / "finetune.json").is_file():
            finetune.train(finetune.Config(recipe=recipe, model=args.model, out=str(ckpt), steps=args.steps, audit_n=args.n))
        trained = audit(str(ckpt), task, args.out / f"audit_{recipe}", probe)
        t0 = time.time()
        models = {"base": load_model(args.model), "trained": load_model(str(ckpt))}
        s = compare_runs(base, trained, args.out / f"compare_{recipe}", control_models=models, control_task=task)
        print(f"compare {recipe} (with budget control): {time.time() - t0:.0f} s", flush=True)
        cmp = RunDir(args.out / f"compare_{recipe}")
        pairs.append((recipe, s))
        props.append((recipe, cmp.read_table("propensity")))
        gained_lost_figure(cmp.read_table("transitions")).write_html(_figure_path(args.out, f"gained_lost_{recipe}"))
        train_seconds = json.loads((ckpt / "finetune.json").read_text())["seconds"]
        results.append({"recipe": recipe, "train_seconds": train_seconds, "n_questions": s.n_questions, "k": s.k,
                        "realized": s.realized, "reachable": s.reachable, "gained_from": s.gained_from, "stats": s.stats,
                        "propensity": s.propensity, "budget_control": s.budget_control})
    change_figure(pairs).write_html(_figure_path(args.out, "change"))
    propensity_figure(props).write_html(_figure_path(args.out, "propensity"))
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    for r in results:
        st = r["stats"]
        print(f"{r['recipe']}: D {st['D']['base']:.3f} -> {st['D']['trained']:.3f} {st['D']['change_ci']}, "
              f"O_K {st['O_K']['base']:.3f} -> {st['O_K']['trained']:.3f} {st['O_K']['change_ci']}; "
              f"realized {r['realized']}; reachable {r['reachable']}; gained from {r['gained_from']}; "
              f"budget control {r['budget_control']}")
    return results


def _figure_path(out: Path, name: str) -> Path:
    (out / "figures").mkdir(parents=True, exist_ok=True)
    return out / "figures" / f"{name}.html"


if __name__ == "__main__":
    main()
