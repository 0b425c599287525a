"""The parts of the reproduction. Each part is a set of ordinary run folders under
``ROOT/<part>/``, made by the analyses' own functions, so each resumes as any run
folder does (a killed part redoes no finished question, and no finished run).

1. ``1_audit``: the realization audit (`audit.run_audit`) per task at K;
2. ``2_routing``: one routing run per task (`routing.run_route_audit`) over the three
   spaces, so each run holds one cell per space, aggregated across cells into
   ``2_routing/route_cells`` (`routing.cells.write_route_cells`) each time a task finishes;
3. ``3_temperature``: the temperature sweep of the selection gap (`sweep.run_temperature_sweep`);
4. ``4_localisation``: the failures run of each multiple-choice cell (`repair.run_failures`)
   and the cell-level screen over them (``4_localisation/screen``, `repair.write_screen`),
   then, on every cell the screen keeps, repair (`run_repair`), reciprocal steering
   (`run_steer`, beside a random direction of the same length) and top-k units (`run_units`) on the repair run's cohort and block;
5. ``5_checkpoints``: GRPO and SFT checkpoints (trained by ``analyses.finetune``
   when absent), base and trained audits, `compare.compare_runs` with the budget control
   (both models at K and 2K) and, when the runs asked in different prompt formats, the
   prompt-format control (the trained model audited in the base format);
6. ``6_validation``: `validate.run_validate` (planted layers, found by repair and the
   route check) for the model and each localisation task at the screen's n, so each
   untestable or unreproduced localisation and routing finding reads beside the smallest
   planted effect this n detects (`findings.planted_effect`). Opt-in where the profile
   says so (`Profile.opt_in`); a validation run made apart with ``rnr validate --out
   ROOT/6_validation/TASK`` is read the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rnr_interp.models import LoadedModel
from rnr_interp.records import read_json_file
from rnr_interp.report.reproduction import ROUTE_CELLS, SCREEN
from rnr_interp.reproduce.findings import VALIDATION_PART
from rnr_interp.reproduce.profiles import Profile



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
    from rnr_interp.analyses.audit import run_audit
    from rnr_interp.engine.sampling import Probe

    p = ctx.profile
    lm = ctx.model(p.model)
    for name in p.audit_tasks:
        task = ctx.task(name, p.audit_n)
        # Multiple choice asked under every cyclic shift of its options (a run folder made
        # before circular evaluation keeps what it was run with, so it resumes).
        circular = task.answer_kind == "letter" and _stored_or(folder / name, "circular", True)
        ctx.log(f"  audit {name}: {p.audit_n} questions, K={p.k}{', circular' if circular else ''}")
        run_audit(lm, task, folder / name, probe=Probe(k=p.k), batch_size=p.batch_size,
                  progress=ctx.progress, circular=circular)


def _stored_or(folder: Path, key: str, default: Any) -> Any:
    """A run folder's recorded setting `key` (False when its config lacks it), or
    `default` for a folder not started yet."""
    manifest = folder / "manifest.json"
    return read_json_file(manifest)["config"].get(key, False) if manifest.is_file() else default


def routing_part(ctx: Context, folder: Path) -> None:
    from rnr_interp.analyses.routing.config import RouteConfig
    from rnr_interp.analyses.routing.run import run_route_audit
    from rnr_interp.analyses.routing.cells import write_route_cells

    p = ctx.profile
    lm = ctx.model(p.model)
    for name in p.route_tasks:
        ctx.log(f"  route {name}: {p.route_n} questions x {len(p.spaces)} spaces, K={p.route_k}")
        cfg = RouteConfig(samples=p.route_k, budget=p.route_k, spaces=p.spaces, methods=p.methods,
                          min_len=p.route_min_len, batch_size=p.route_batch_size)
        run_route_audit(lm, ctx.task(name, p.route_n), folder / name, cfg, progress=ctx.progress)
        # after each task, so a part stopped in a later task still has the table of the finished ones
        write_route_cells(folder, folder / ROUTE_CELLS)


def temperature_part(ctx: Context, folder: Path) -> None:
    from rnr_interp.analyses.sweep import run_temperature_sweep

    p = ctx.profile
    ctx.log(f"  temperatures {', '.join(f'{t:g}' for t in p.temperatures)}: {p.sweep_task}, {p.sweep_n} questions, K={p.sweep_k}")
    run_temperature_sweep(ctx.model(p.model), ctx.task(p.sweep_task, p.sweep_n), folder / p.sweep_task, p.temperatures,
                          k=p.sweep_k, batch_size=p.batch_size, progress=ctx.progress)


def localisation_part(ctx: Context, folder: Path) -> None:
    from rnr_interp.analyses.localise.circular import permutation_applies
    from rnr_interp.analyses.localise.recognition import FailureCriterion
    from rnr_interp.records import RunDir
    from rnr_interp.analyses.localise.repair import run_failures, run_repair, write_screen
    from rnr_interp.analyses.localise.steering import run_steer, run_units

    p = ctx.profile
    lm = ctx.model(p.model)
    criterion = FailureCriterion(margin=p.screen_margin, level=p.screen_level, above_chance=p.screen_above_chance)
    tasks = {name: ctx.task(name, p.screen_n) for name in p.screen_tasks}
    circular = {name: p.circular and permutation_applies(task) for name, task in tasks.items()}
    for name, task in tasks.items():
        s = run_failures(lm, task, folder / name / "failures", criterion=criterion, batch_size=p.rows_batch_size,
                         progress=ctx.progress, circular=circular[name])
        ctx.log(f"  screen {name}: recognition {s.screen['recognition_score']:.2f}, "
                f"generation {s.screen['generation_score']:.2f}")
    screen = write_screen(folder / SCREEN, [RunDir(folder / name / "failures") for name in tasks], criterion)
    ctx.log(f"  {screen.n_failure_cells} of {screen.n_cells} cells pass ({screen.criterion})")
    for cell in screen.cells:
        if not cell["failure"]:
            continue
        out = Path(cell["path"]).parent  # the cell's folder: its failures run sits in it
        task = tasks[out.name]
        permute = p.permutation_control and permutation_applies(task)
        common = dict(circular=circular[out.name], batch_size=p.rows_batch_size, progress=ctx.progress)
        run_repair(lm, task, out / "repair", permutation_control=permute, **common)
        run_steer(lm, task, out / "steer", repair_run=out / "repair", alphas=p.alphas, alpha_unit="rms",
                  permutation_control=permute, random_control=True, **common)
        run_units(lm, task, out / "units", repair_run=out / "repair", ks=p.unit_ks, permutation_control=permute, **common)


def train_checkpoint(ctx: Context, recipe: str, out: Path) -> Path:
    """The recipe's checkpoint: the user's, one already trained under `out`, or trained
    now by `analyses.finetune`."""
    if recipe in ctx.checkpoints:
        return ctx.checkpoints[recipe]
    if (out / "finetune.json").is_file():
        return out
    from rnr_interp.analyses import finetune

    p = ctx.profile
    ctx.log(f"  train {recipe}: {p.train_steps} steps on {p.model}")
    return finetune.train(finetune.Config(recipe=recipe, model=p.model, out=str(out), steps=p.train_steps,
                                          audit_n=p.ckpt_n), progress=False)


def checkpoint_part(ctx: Context, folder: Path) -> None:
    from rnr_interp.analyses.audit import run_audit
    from rnr_interp.analyses.checkpoints import compare_runs
    from rnr_interp.records import RunDir
    from rnr_interp.engine.sampling import Probe

    p = ctx.profile
    task = ctx.task(p.ckpt_task, p.ckpt_n)
    probe = Probe(k=p.ckpt_k, temperature=p.ckpt_temperature)
    base_lm = ctx.model(p.model)
    ctx.log(f"  audit base {p.model}: {p.ckpt_task}, {p.ckpt_n} questions, K={p.ckpt_k}")
    run_audit(base_lm, task, folder / "audit_base", probe=probe, batch_size=p.batch_size, progress=ctx.progress)
    base = RunDir(folder / "audit_base")
    for recipe in p.recipes:
        ckpt = train_checkpoint(ctx, recipe, folder / "checkpoints" / recipe)
        lm = ctx.model(str(ckpt))
        ctx.log(f"  audit {recipe} checkpoint")
        run_audit(lm, task, folder / f"audit_{recipe}", probe=probe, batch_size=p.batch_size, progress=ctx.progress)
        trained = RunDir(folder / f"audit_{recipe}")
        shared = shared_prompt_audit(ctx, lm, base, trained, folder / f"audit_{recipe}_base_prompt", task, probe)
        ctx.log(f"  compare {recipe} with the budget control (both models at K, 2K"
                + (f" and up to {p.ckpt_budget_k})" if p.ckpt_budget_k else ")"))
        compare_runs(base, trained, folder / f"compare_{recipe}", control_models={"base": base_lm, "trained": lm},
                     control_task=task, budget_k=p.ckpt_budget_k, shared_prompt=shared, batch_size=p.batch_size)


def shared_prompt_audit(ctx: Context, lm: LoadedModel, base, trained, out: Path, task, probe):
    """The prompt-format control: the trained model audited in the base run's prompt
    format, when the two runs asked differently (None when they asked alike: the
    control would repeat the trained audit; the comparison states the formats)."""
    from rnr_interp.analyses.audit import run_audit
    from rnr_interp.models import PromptFormat
    from rnr_interp.records import RunDir

    if base.config.get("prompt_format") == trained.config.get("prompt_format"):
        return None
    ctx.log("  audit the trained checkpoint in the base prompt format (prompt-format control)")
    lm.prompt_override = PromptFormat.from_description(base.config["prompt_format"])
    try:
        run_audit(lm, task, out, probe=probe, batch_size=ctx.profile.batch_size, progress=ctx.progress)
    finally:
        lm.prompt_override = None
    return RunDir(out)


def validation_part(ctx: Context, folder: Path) -> None:
    from rnr_interp.analyses.validate import run_validate

    p = ctx.profile
    for name in p.screen_tasks:
        if (folder / name / "summary.json").is_file():  # finished: skip re-anchoring (a model pass)
            continue
        ctx.log(f"  validate {name}: {p.screen_n} questions, validation profile {p.validate_profile}, "
                f"golds {p.validate_gold}")
        run_validate(p.model, ctx.task(name, p.screen_n), folder / name, profile=p.validate_profile,
                     gold=p.validate_gold, batch_size=p.rows_batch_size, progress=ctx.progress)


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
    Part(VALIDATION_PART, "Validation: planted layers, the smallest effect each task's n detects", validation_part),
)
