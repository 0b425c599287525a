"""Model organisms: `plant` writes one (a known effect planted in a model, an ordinary
checkpoint folder with its ground truth in ``planted.json``); `validate` plants many and
scores what the analyses find in them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from rnr_interp.engine.decoding import SAMPLING_TEMPERATURE
from rnr_interp.commands.common import (
    AblationOpt, AlphasOpt, AlphaUnitOpt, BatchOpt, GradingOpt, DataOpt, ModelOpt, OutOpt, QuietOpt, ReadAtOpt,
    SteerAtOpt, TaskOpt, TaskSeedOpt, UnitsSilencedOpt, at_least, check_alpha_unit, check_out, check_read_at, check_steer_at, execute, fail, numbers,
    one_of, out_folder, seeded,
)


def plant(
    kind: Annotated[str, typer.Argument(help="layer (an extra decoder layer at --layer) | null (layer at strength 0, "
                                        "at a layer drawn from --seed) | gap (a bias toward one answer token at the "
                                        "--task's answer position) | sharpen, new (a checkpoint pair: base/ biased so "
                                        "that sampling still reaches the gold, or never does; trained/ the model unchanged) "
                                        "| units (k units in the MLP of --layer that turn each answer starting with one of the "
                                        "--task's k most common first tokens to start with a rarer first token none of them is)")],
    model: ModelOpt = "smollm2",
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_folder, help="new checkpoint folder (load it with --model)")] = Path("runs/organism"),
    layer: Annotated[Optional[int], typer.Option("--layer", help="where to plant (default: drawn from --seed, middle half; "
                                                                  "units: then the next block the base can lose)")] = None,
    strength: Annotated[Optional[float], typer.Option("--strength", help="effect size (layer: scale of the copy's "
                                                      "writes, 1 = an exact duplicate; gap, sharpen: nats the biased token "
                                                      "leads the gold by where each affected answer starts, by default "
                                                      "2 x --temperature; new: the golds' fall in nats there, 30 by default; "
                                                      "units: nats by which the partner token leads every other where "
                                                      "the answer starts, read through the model, 1 by default, behind a "
                                                      "norm after the MLP too; 0 = no effect)")] = None,
    units: Annotated[Optional[int], typer.Option("--units", help="units: how many units to plant, one per answer-opening "
                                                 "token (default 3)")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="gap, sharpen: the temperature of the "
                                                         "probe that audits the organism, which sizes its default "
                                                         "strength (default: rnr audit's, 1)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed of every draw (same seed: same weights bit for bit)")] = 0,
    task: Annotated[Optional[str], typer.Option("--task", "-t", help="the task the organism is made for (recorded)")] = None,
    n: Annotated[Optional[int], typer.Option("--n", help="the first N questions of --task (the answer-bias kinds are "
                                             "fitted on them; default: all)")] = None,
    task_seed: TaskSeedOpt = None,
    quiet: QuietOpt = False,
):
    """Plant a known effect in MODEL and write it as a checkpoint folder every command
    loads with --model OUT; planted.json holds what was planted and what each analysis
    should find."""
    from rnr_interp.analyses.organisms import plant as plant_organism
    from rnr_interp.tasks import load_task

    at_least("--n", n)
    if n is not None and task is None:
        fail("--n takes the first N questions of --task: give --task")
    if task_seed is not None and task is None:
        fail("--task-seed draws the questions of --task: give --task")

    def body():
        named_alone = task is None or (n is None and task_seed is None)  # the organism loads a named task whole
        questions = task if named_alone else load_task(task, n=n, **seeded(task_seed))
        return plant_organism(kind, model, out, layer=layer, strength=strength, seed=seed, task=questions, units=units,
                              temperature=temperature)

    planted = execute(body)
    typer.echo(f"planted {planted.kind} in {planted.base} at {json.dumps(planted.location)}, strength {planted.strength:g}, "
               f"seed {planted.seed}: {planted.n_layers_base} -> {planted.n_layers} layers")
    if (drew := planted.drawn.get("drawn_layer")) is not None and drew != (at := planted.location["layer"]):
        shares = planted.drawn["base_answers_changed_by_silencing"]
        typer.echo(f"  the seed drew block {drew}, whose silencing changes {shares[str(drew)]:.0%} of the base model's "
                   f"answers; planted in block {at}, whose silencing changes {shares[str(at)]:.0%}")
    typer.echo(f"  expected: {json.dumps(planted.expected)}")
    if "trained_weights_sha256" in planted.detail:
        typer.echo(f"checkpoint pair: {out / 'base'} (planted, weights sha256 {planted.weights_sha256[:16]}...) and "
                   f"{out / 'trained'} (the model unchanged)")
    else:
        typer.echo(f"checkpoint: {out} (weights sha256 {planted.weights_sha256[:16]}...)")


def validate(
    model: ModelOpt = "smollm2", task: TaskOpt = "arithmetic", data: DataOpt = None,
    n: Annotated[Optional[int], typer.Option("--n", help="questions per organism (default: the profile's)")] = None,
    task_seed: TaskSeedOpt = None,
    out: OutOpt = Path("runs/validate"),
    profile: Annotated[str, typer.Option("--profile", help="quick: the default strength and its null at 3 seeds | "
                                         "full: 5 strengths x 10 seeds (the detection curve)")] = "quick",
    kinds: Annotated[str, typer.Option("--kinds", help="comma-separated organism kinds to plant: layer, gap, sharpen, "
                                       "new, units")] = "layer",
    gold: Annotated[str, typer.Option("--gold", help="base: the base model's own deployed answers are the golds, so "
                                      "every failure is the plant's | task: the task's golds")] = "base",
    temperature: Annotated[float, typer.Option("--temperature", help="probe sampling temperature of the audits; the gap "
                                               "and sharpen organisms are planted for it")] = SAMPLING_TEMPERATURE,
    ablation: AblationOpt = "zero", grading: GradingOpt = None,
    steer_at: SteerAtOpt = "every", units: UnitsSilencedOpt = None,
    seeds: Annotated[Optional[str], typer.Option("--seeds", help="comma-separated seeds replacing the profile's, or "
                                                 "'layers': one seed per layer the layer kinds can draw (seeds 0-9 "
                                                 "repeat layers; a repeat is one organism)")] = None,
    strengths: Annotated[Optional[str], typer.Option("--strengths", help="comma-separated strengths replacing the "
                                                     "profile's: multiples of each kind's default, 0 the null")] = None,
    layer: Annotated[Optional[int], typer.Option("--layer", help="plant the layer and units kinds at this block instead "
                                                 "of the block each seed draws (rnr plant --layer); at one block a "
                                                 "kind's seeds plant one organism")] = None,
    plant_units: Annotated[Optional[int], typer.Option("--plant-units", help="how many units the units kind plants "
                                                       "(rnr plant units --units; default 3)")] = None,
    read_at: ReadAtOpt = "prompt", alphas: AlphasOpt = None, alpha_unit: AlphaUnitOpt = "rms",
    clamp_control: Annotated[bool, typer.Option("--clamp-control", help="the steer runs also clamp the block's write "
                                                "within the span of the failures' writes (rnr steer --clamp-control), "
                                                "scored as steer:clamp against a random span of that rank")] = False,
    keep_organisms: Annotated[bool, typer.Option("--keep-organisms", help="keep every organism's checkpoint in OUT/organisms "
                                                 "(by default each is dropped once its analyses are done and rebuilt "
                                                 "from its seed if needed again)")] = False,
    batch_size: BatchOpt = 32, quiet: QuietOpt = False,
):
    """Plant known effects in MODEL at several strengths and seeds, run the analyses on
    each organism as a user would, and score what they found against what was planted:
    recovery per kind, the detection curve, false positives on the nulls."""
    from rnr_interp.analyses.validate import ANALYSES, GOLDS, PROFILES
    from rnr_interp.interventions import ABLATION_MODES
    from rnr_interp.records import VALIDATE
    from rnr_interp.report.kinds import analysis_of
    from rnr_interp.tasks import load_task

    at_least("--n", n)
    at_least("--batch-size", batch_size)
    at_least("--units", units)
    at_least("--plant-units", plant_units)
    at_least("--layer", layer, 0)
    check_read_at(read_at)
    check_alpha_unit(alpha_unit)
    alpha_grid = None if alphas is None else tuple(numbers("--alphas", alphas))
    one_of("--profile", profile, PROFILES)
    chosen = [k.strip() for k in kinds.split(",") if k.strip()]
    if not chosen or any(k not in ANALYSES for k in chosen):
        fail(f"--kinds must be a comma-separated list of {', '.join(ANALYSES)}, got {kinds!r}")
    one_of("--gold", gold, GOLDS)
    one_of("--ablation", ablation, ABLATION_MODES)
    check_steer_at(steer_at)
    if plant_units is not None and "units" not in chosen:
        fail("--plant-units is how many units the units kind plants: add units to --kinds")
    seed_list = _seeds(seeds)
    strength_list = _strengths(strengths)
    check_out(out)

    def body():
        t = load_task(task, data=data, n=n or PROFILES[profile].n, **seeded(task_seed))
        return analysis_of(VALIDATE).run(model, t, out, profile=profile, kinds=chosen, gold=gold, batch_size=batch_size,
                                         temperature=temperature, ablation=ablation, grading=grading, steer_at=steer_at, units=units, seeds=seed_list,
                                         strengths=strength_list, layer=layer, plant_units=plant_units, read_at=read_at,
                                         alphas=alpha_grid, alpha_unit=alpha_unit, clamp_control=clamp_control,
                                         keep_organisms=keep_organisms,
                                         progress=not quiet)

    summary = execute(body)
    _figures(out)
    golds = "the base model's own answers" if summary.gold == "base" else "the task's"
    typer.echo(f"{summary.model} on {summary.task} ({summary.n_questions} questions, golds: {golds}), profile {summary.profile}:")
    for kind, r in summary.recovery.items():
        typer.echo(f"  {kind}: recovered by every analysis {_share(r['rate'], r['ci'], r['n'], r.get('n_seeds'))}; nulls "
                   f"with a false positive in any {_share(r['null_false_positive_rate'], r['null_ci'], r['n_null'], r.get('n_null_seeds'))}")
        for cell in r.get("not_planted", []):
            typer.echo(f"    not planted (strength {cell['strength']:g}, seed {cell['seed']}): {cell['why']}")
        if r.get("n_without_failure"):
            typer.echo(f"    {r['n_without_failure']} of the {r['n']} planted organisms left no failure to localise "
                       "(their repair run's failure set is empty): nothing there to find, a miss of the plant, not of "
                       "the analyses")
    if len(summary.by_analysis) > 1:  # each analysis on its own beside the end-to-end rate
        for analysis, r in summary.by_analysis.items():
            typer.echo(f"    {analysis}: recovered {_share(r['rate'], r['ci'], r['n'], r.get('n_seeds'))}")
    typer.echo(f"run folder: {out}")


def _seeds(text: str | None) -> tuple[int, ...] | str | None:
    from rnr_interp.analyses.validate import EVERY_LAYER

    if text is None or text.strip() == EVERY_LAYER:
        return None if text is None else EVERY_LAYER
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        fail(f"--seeds must be comma-separated non-negative integers or {EVERY_LAYER!r}, got {text!r}")
    return tuple(int(p) for p in parts)


def _strengths(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        parts = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        parts = ()
    if not parts or not all(math.isfinite(p) and p >= 0 for p in parts):
        fail(f"--strengths must be comma-separated finite non-negative numbers (multiples of each kind's default), got {text!r}")
    return parts


def _share(rate: float, ci, n: int, seeds: int | None = None) -> str:
    """A rate over distinct organisms, with the seeds behind them when some drew the same one."""
    if n == 0:
        return "n/a (no cells)"
    behind = f" (from {seeds} seeds)" if seeds is not None and seeds != n else ""
    return f"{rate:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] of {n} organisms{behind}"


def _figures(out: Path) -> None:
    from rnr_interp.records import RunDir
    from rnr_interp.report.registry import write_run_figures

    write_run_figures(RunDir(out))
