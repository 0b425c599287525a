"""Does the tie rule name the planted block? Three sets of SmolLM2 units organisms, each
planted by the code that first made it, then swept by this checkout's `run_repair` as
`rnr validate` sweeps them (mean ablation, `--sweep mlp`, 24 copy questions anchored to
the base): over the blocks that tied and the planted one where those are known, else over
every block; each summary's tie record is printed (rule, block named and by which
reading, shares, direct effects).

- ``held-out`` (docs/findings.md, "The units organism shut where recognition reads"):
  seeds 10, 1, 7 at blocks 18, 14, 21, flexible grading, whole-block silencing; the rule
  was chosen without them.
- ``named-before`` (docs/findings.md, "Ties told apart by what acts through what"):
  seeds 4, 21, 38 at blocks 17, 11, 10, strict grading, `--units 3`; the tie rule before
  the direct effect named the planted block in all three.
- ``unseen``: the same code and settings as ``named-before`` at the eight other seeds that
  draw a middle layer (`seeds_drawing_each_layer`), never swept before; every MLP block is
  swept, as `rnr validate` sweeps, since which blocks tie is not known in advance.

    git worktree add ../rnr-902362a 902362a     # held-out
    git worktree add ../rnr-dbf176b dbf176b     # named-before
    PYTHONPATH=../rnr-902362a python experiments/held_out_ties.py plant OUT --set held-out
    python experiments/held_out_ties.py sweep OUT --set held-out

`plant` builds each organism into OUT with the set's commit (about 10 minutes each on 2
CPU threads at 902362a, half a minute at dbf176b), under the torch threads it was first
planted under (the fits' sums depend on them); `sweep` needs the checkout the rule is to
be measured on (a sweep of every block: about 5 minutes an organism on one thread).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Ties:
    commit: str  #: the code that planted these organisms
    grading: str
    units: int | None  #: `--units K` of the sweep (None: whole blocks)
    threads: int | None  #: torch threads they were planted under (None: not recorded)
    tied: dict[int, list[int] | None]  #: seed -> the MLP blocks that tied, the planted one last (None: sweep every block)


SETS = {
    "held-out": Ties("902362a", "flexible", None, None, {10: [1, 7, 9, 10, 18], 1: [4, 14], 7: [9, 14, 19, 21]}),
    "named-before": Ties("dbf176b", "strict", 3, 1, {4: [1, 12, 13, 16, 17], 21: [1, 11], 38: [5, 10]}),
    "unseen": Ties("dbf176b", "strict", 3, 1, dict.fromkeys([30, 24, 6, 16, 12, 0, 13, 7])),
}


def anchored(ties: Ties):
    from rnr_interp.analyses.anchor import anchor_task
    from rnr_interp.models import load_model
    from rnr_interp.tasks import load_task

    return anchor_task(load_model("smollm2"), load_task("copy", n=24), 32, ties.grading)


def plant(out: Path, ties: Ties) -> None:
    import torch

    from rnr_interp.analyses.validate import organism

    if ties.threads is not None:
        torch.set_num_threads(ties.threads)
    task = anchored(ties)
    for seed, blocks in ties.tied.items():
        _, planted = organism("smollm2", "units", 1.0, seed, out / f"units-s1-seed{seed}", task)
        expected = "" if blocks is None else f" (expected {blocks[-1]})"
        print(f"seed {seed}: planted at block {planted.location['layer']}{expected}", flush=True)


def sweep(out: Path, ties: Ties) -> None:
    from rnr_interp.analyses.localise.recognition import default_readout
    from rnr_interp.analyses.localise.repair import run_repair
    from rnr_interp.analyses.organisms import read_planted
    from rnr_interp.engine.sampling import deployed_decoding
    from rnr_interp.models import load_model

    task = anchored(ties)
    for seed, blocks in ties.tied.items():
        organism = out / f"units-s1-seed{seed}"
        summary = run_repair(load_model(str(organism)), task, out / f"repair-seed{seed}",
                             readout=default_readout(task), sweep="mlp", layers=blocks, decoding=deployed_decoding(task),
                             batch_size=32, ablation="mean", grading=ties.grading, units=ties.units, progress=False)
        chosen = summary.chosen or {}
        tie = chosen.get("selection", {}).get("tie_break", {})
        print(json.dumps({"seed": seed, "planted": read_planted(organism).location["layer"], "chosen": chosen.get("layer"),
                          **{k: tie.get(k) for k in ("tied", "named", "named_by", "moved", "direct")}}, indent=1), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["plant", "sweep"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--set", dest="ties", choices=list(SETS), default="held-out")
    args = parser.parse_args()
    (plant if args.step == "plant" else sweep)(args.out, SETS[args.ties])


if __name__ == "__main__":
    main()
