"""The five parts of the reproduction. Each part is a set of ordinary run folders under
``ROOT/<part>/``, made by the analyses' own functions, so each resumes as any run
folder does (a killed part redoes no finished question, and no finished run).

1. ``1_audit``: the realization audit (`audit.run_audit`) per task at K;
2. ``2_routing``: one routing run per task (`routing.run_route_audit`) over the three
   spaces, so each run holds one cell per space; the part's report aggregates the cells;
3. ``3_temperature``: the audit at each temperature (the selection gap vs T);
4. ``4_localisation``: the failure screen per multiple-choice cell (`repair.run_failures`),
   then, on every cell that passes, repair (`run_repair`), reciprocal steering
   (`run_steer`) and top-k units (`run_units`) on the repair run's cohort and block;
5. ``5_checkpoints``: GRPO and SFT checkpoints (trained by ``experiments/finetune.py``
   when absent), base and trained audits, `compare.compare_runs` with the budget control.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rnr_interp.models import LoadedModel
from rnr_interp.records import write_json_atomic
from rnr_interp.report.reproduction import SCREEN_JSON
from rnr_interp.reproduce.profiles import Profile

#: experiments/finetune.py of this checkout (absent in an installed package)
FINETUNE = Path(__file__).resolve().parents[2] / "experiments" / "finetune.py"


@dataclass
class Context:
    """What every part gets: the profile, the root, loaded models (loaded once)."""

    profile: Profile
    root: Path
    progress: bool = False
    #: recipe -> checkpoint folder given by the user (else trained under 5_checkpoints)
    checkpoints: dict[str, Path] = field(default_factory=dict)
    log: Callable[[str], None] = print
    _models: dict[str, LoadedModel] = field(default_factory=dict)

    def model(self, spec: str) -> LoadedModel:
        if spec not in self._models:
            from rnr_interp.models import load_model

            self._models[spec] = load_model(spec)
        return self._models[spec]

    def task(self, name: str, n: int):
        from rnr_interp.tasks import load_task

        return load_task(name, n=n)


def audit_part(ctx: Context, folder: Path) -> None:
    from rnr_interp.audit import run_audit
    from rnr_interp.sampling import Probe

    p = ctx.profile
    lm = ctx.model(p.model)
    for name in p.audit_tasks:
        ctx.log(f"  audit {name}: {p.audit_n} questions, K={p.k}")
        run_audit(lm, ctx.task(name, p.audit_n), folder / name, probe=Probe(k=p.k), batch_size=p.batch_size,
                  progress=ctx.progress)


def routing_part(ctx: Context, folder: Path) -> None:
    from rnr_interp.routing.audit import RouteConfig, run_route_audit

    p = ctx.profile
    lm = ctx.model(p.model)
    for name in p.route_tasks:
        ctx.log(f"  route {name}: {p.route_n} questions x {len(p.spaces)} spaces, K={p.route_k}")
        cfg = RouteConfig(samples=p.route_k, budget=p.route_k, spaces=p.spaces, methods=p.methods,
                          min_len=p.route_min_len, batch_size=max(p.batch_size, 8))
        run_route_audit(lm, ctx.task(name, p.route_n), folder / name, cfg, progress=ctx.progress)


def temperature_part(ctx: Context, folder: Path) -> None:
    from rnr_interp.audit import run_audit
    from rnr_interp.sampling import Probe

    p = ctx.profile
    lm, task = ctx.model(p.model), ctx.task(p.sweep_task, p.sweep_n)
    for t in p.temperatures:
        ctx.log(f"  temperature {t:g}: {p.sweep_task}, {p.sweep_n} questions, K={p.sweep_k}")
        run_audit(lm, task, folder / f"T{t:g}", probe=Probe(k=p.sweep_k, temperature=t), batch_size=p.batch_size,
                  progress=ctx.progress)


def screen_row(cell: str, s: dict[str, Any]) -> dict[str, Any]:
    """A failures summary's line of the cell-level screen: its recognition and
    generation scores and whether the cell goes on to localisation, with the criterion.
    The failure analysis's own screen decides when its summary has one; otherwise at
    least two recognised-but-missed questions (one to choose the block, one to score it)."""
    screen = s.get("screen")
    if isinstance(screen, dict) and "failure" in screen:
        return {"cell": cell, "recognition": screen["recognition_score"], "generation": screen["generation_score"],
                "n_failure": s["n_failure"], "passes": bool(screen["failure"]), "criterion": screen["criterion"]}
    return {"cell": cell, "recognition": (s.get("recognition_accuracy") or {}).get(s.get("readout")),
            "generation": s["deployed_accuracy"], "n_failure": s["n_failure"], "passes": s["n_failure"] >= 2,
            "criterion": "at least 2 recognised-but-not-generated questions"}


def localisation_part(ctx: Context, folder: Path) -> None:
    from rnr_interp.repair import run_failures, run_repair
    from rnr_interp.steering import run_steer, run_units

    p = ctx.profile
    lm = ctx.model(p.model)
    screened = []
    for name in p.screen_tasks:
        task, cell = ctx.task(name, p.screen_n), folder / name
        s = run_failures(lm, task, cell / "failures", batch_size=p.batch_size, progress=ctx.progress)
        screened.append(row := screen_row(f"{lm.spec} / {name}", s))
        write_json_atomic(folder / SCREEN_JSON, screened)
        ctx.log(f"  screen {name}: {s['n_failure']} recognised-but-missed of {s['n_questions']}: "
                f"{'passes' if row['passes'] else 'does not pass'} ({row['criterion']})")
        if not row["passes"]:
            continue
        run_repair(lm, task, cell / "repair", batch_size=p.batch_size, progress=ctx.progress)
        run_steer(lm, task, cell / "steer", repair_run=cell / "repair", alphas=p.alphas, batch_size=p.batch_size,
                  progress=ctx.progress)
        run_units(lm, task, cell / "units", repair_run=cell / "repair", ks=p.unit_ks, batch_size=p.batch_size,
                  progress=ctx.progress)


def train_checkpoint(ctx: Context, recipe: str, out: Path) -> Path:
    """The recipe's checkpoint: the user's, one already trained under `out`, or trained
    now by experiments/finetune.py (loaded from this checkout: experiments/ is not part
    of the package)."""
    if recipe in ctx.checkpoints:
        return ctx.checkpoints[recipe]
    if (out / "finetune.json").is_file():
        return out
    if not FINETUNE.is_file():
        raise FileNotFoundError(f"no {recipe} checkpoint: pass --checkpoint {recipe}=DIR "
                                f"(experiments/finetune.py is only in a source checkout)")
    p = ctx.profile
    ctx.log(f"  train {recipe}: {p.train_steps} steps on {p.model}")
    finetune = _experiment_module("finetune", FINETUNE)
    return finetune.train(finetune.Config(recipe=recipe, model=p.model, out=str(out), steps=p.train_steps,
                                          audit_n=p.ckpt_n), progress=False)


def _experiment_module(name: str, path: Path):
    """A script of experiments/ as a module (registered under its name, as its
    dataclasses need, and as experiments/checkpoint_audit.py imports it)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def checkpoint_part(ctx: Context, folder: Path) -> None:
    from rnr_interp.audit import run_audit
    from rnr_interp.compare import compare_runs
    from rnr_interp.records import RunDir
    from rnr_interp.sampling import Probe

    p = ctx.profile
    task = ctx.task(p.ckpt_task, p.ckpt_n)
    probe = Probe(k=p.ckpt_k, temperature=p.ckpt_temperature)
    ctx.log(f"  audit base {p.model}: {p.ckpt_task}, {p.ckpt_n} questions, K={p.ckpt_k}")
    run_audit(ctx.model(p.model), task, folder / "audit_base", probe=probe, batch_size=p.batch_size, progress=ctx.progress)
    for recipe in p.recipes:
        ckpt = train_checkpoint(ctx, recipe, folder / "checkpoints" / recipe)
        lm = ctx.model(str(ckpt))
        ctx.log(f"  audit {recipe} checkpoint, compare with the 2K budget control")
        run_audit(lm, task, folder / f"audit_{recipe}", probe=probe, batch_size=p.batch_size, progress=ctx.progress)
        compare_runs(RunDir(folder / "audit_base"), RunDir(folder / f"audit_{recipe}"), folder / f"compare_{recipe}",
                     control_lm=lm, control_task=task, batch_size=p.batch_size)


@dataclass(frozen=True)
class Part:
    name: str  # the folder under the root
    title: str
    run: Callable[[Context, Path], None]


PARTS: tuple[Part, ...] = (
    Part("1_audit", "Realization audit per task", audit_part),
    Part("2_routing", "Routing cells: random vs structured search, answer-blind selectors", routing_part),
    Part("3_temperature", "Selection gap vs temperature", temperature_part),
    Part("4_localisation", "Failure screen; repair, steering and units on cells that pass", localisation_part),
    Part("5_checkpoints", "Checkpoint audit: base vs GRPO and SFT", checkpoint_part),
)


def part_names() -> list[str]:
    return [p.name for p in PARTS]


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}
