"""Does the tie rule name the planted block on organisms it was not found on? The three
SmolLM2 units organisms whose planted block tied with earlier MLP blocks (docs/findings.md,
"The units organism shut where recognition reads": seeds 10, 1, 7 at blocks 18, 14, 21)
are planted by the code of that section, then swept by this checkout's `run_repair` as
`rnr validate` sweeps (mean ablation, flexible grading, `--sweep mlp`, 24 copy questions
anchored to the base) over the blocks that tied and the planted one; the summary's tie
record is printed (rule, block named and by which reading, shares, direct effects).

    git worktree add ../rnr-902362a 902362a
    PYTHONPATH=../rnr-902362a python experiments/held_out_ties.py plant OUT
    python experiments/held_out_ties.py sweep OUT

`plant` builds each organism (about 10 minutes each on 2 CPU threads) into OUT with that
commit's validate; `sweep` needs the checkout the rule is to be measured on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

#: seed -> the MLP blocks that tied with the planted one at 902362a, the planted one last
TIED = {10: [1, 7, 9, 10, 18], 1: [4, 14], 7: [9, 14, 19, 21]}


def anchored():
    from rnr_interp.analyses.anchor import anchor_task
    from rnr_interp.models import load_model
    from rnr_interp.tasks import load_task

    return anchor_task(load_model("smollm2"), load_task("copy", n=24), 32, "flexible")


def plant(out: Path) -> None:
    from rnr_interp.analyses.validate import organism

    task = anchored()
    for seed, blocks in TIED.items():
        _, planted = organism("smollm2", "units", 1.0, seed, out / f"units-s1-seed{seed}", task)
        print(f"seed {seed}: planted at block {planted.location['layer']} (expected {blocks[-1]})", flush=True)


def sweep(out: Path) -> None:
    from rnr_interp.analyses.localise.recognition import default_readout
    from rnr_interp.analyses.localise.repair import run_repair
    from rnr_interp.engine.sampling import deployed_decoding
    from rnr_interp.models import load_model

    task = anchored()
    for seed, blocks in TIED.items():
        summary = run_repair(load_model(str(out / f"units-s1-seed{seed}")), task, out / f"repair-seed{seed}",
                             readout=default_readout(task), sweep="mlp", layers=blocks, decoding=deployed_decoding(task),
                             batch_size=32, ablation="mean", grading="flexible", progress=False)
        chosen = summary.chosen or {}
        tie = chosen.get("selection", {}).get("tie_break", {})
        print(json.dumps({"seed": seed, "planted": blocks[-1], "chosen": chosen.get("layer"),
                          **{k: tie.get(k) for k in ("tied", "named", "named_by", "moved", "direct")}}, indent=1), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["plant", "sweep"])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    (plant if args.step == "plant" else sweep)(args.out)


if __name__ == "__main__":
    main()
