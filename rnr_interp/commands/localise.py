"""Commands of the localisation analyses: failures, repair, steer, units. Each writes
its run folder through the analysis, then the report's figures into ``figures/``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from rnr_interp.commands.common import (
    AblationOpt, BatchOpt, GradingOpt, DataOpt, LogToOpt, MaxTokOpt, ModelOpt, NOpt, OnInvalidOpt, OutOpt, QuietOpt, SeedOpt, TaskConfigOpt, TaskOpt,
    TaskSeedOpt, SteerAtOpt, UnitsSilencedOpt, ReadAtOpt, AlphasOpt, AlphaUnitOpt, NumFewshotOpt, FewshotSplitOpt, FewshotSeedOpt, ChatTemplateOpt,
    lm_eval_options,
    at_least, check_alpha_unit, check_log_to, check_out, check_read_at, check_steer_at, numbers, one_of, execute, fail, load_inputs,
    log_finished, print_multiple_choice, run_folder, say_skipped, seeded,
)
from rnr_interp.analyses.localise.defaults import DEFAULT_DRAWS, DEFAULT_KS, PANEL_CAP

if TYPE_CHECKING:
    from rnr_interp.records import CohortSummary, SteerSummary, UnitsSummary

ReadoutOpt = Annotated[Optional[str], typer.Option("--readout", help="recognition readout for the failure set: option:mean (the "
                      "default for multiple choice) | option:sum | letter | lm-eval:acc | lm-eval:acc_norm (lm-eval tasks) | "
                      "answer (the default for free-form tasks: the gold's answer statement against its distractors')")]
PanelOpt = Annotated[Optional[int], typer.Option("--panel", help="healthy panel cap: every deployed-right question up to the first N in task order")]
SplitSeedOpt = Annotated[int, typer.Option("--split-seed", help="seed of the selection / held-out split of failure set and panel")]
LayersOpt = Annotated[Optional[str], typer.Option("--layers", help="layers to sweep, e.g. '0-5,9' (default: all)")]
LayerOpt = Annotated[Optional[int], typer.Option("--layer", help="block layer (default: chosen by --repair-run, else by a sweep; on the selection part)")]
PermuteOpt = Annotated[bool, typer.Option(
    "--permute-control", help="letter-permutation control: re-score on the held-out failures with each question's "
    "options rotated by one (off by default: it adds that part's rows again)")]
CircularOpt = Annotated[bool, typer.Option(
    "--circular", help="letter-robust failure sets: generation is right only when right under every cyclic shift of "
    "the options (recognition stays the option-likelihood readout); every row is asked under every shift, so the "
    "run costs as many times more as the options")]
RepairRunOpt = Annotated[Optional[Path], typer.Option("--repair-run", help="repair run folder: its failure set, panel, split and "
                                                     "chosen block (same decoding required)")]

_KS = ",".join(map(str, DEFAULT_KS))


def parse_layers(spec: Optional[str], n_layers: int) -> list[int]:
    if not spec:
        return list(range(n_layers))
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or not (hi.isdigit() or hi == ""):
            raise ValueError(f"--layers takes layers and ranges such as '0-5,9', got {spec!r}")
        out.extend(range(int(lo), int(hi or lo) + 1))
    bad = [i for i in out if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"--layers names layer {bad[0]}, but the model has layers 0..{n_layers - 1}")
    return list(dict.fromkeys(out))


def _figures(out: Path) -> None:
    from rnr_interp.records import RunDir
    from rnr_interp.report.registry import write_run_figures

    write_run_figures(RunDir(out))


def _localise(kind: str, model: str, task: str, data, n, out: Path, max_new_tokens, batch_size: int, quiet: bool,
              per_model=lambda lm: {}, task_config: Optional[Path] = None, on_invalid: str = "refuse",
              lm_eval: Optional[dict] = None, task_seed: Optional[int] = None, **options) -> "CohortSummary":
    """The localisation commands' body: load, run the registered analysis of `kind`
    (`report.kinds`) with the task's deployed decoding (`sampling.deployed_decoding`, as
    every command), figures into the run folder; `per_model(lm)` gives the options that
    depend on the loaded model; `lm_eval` an lm-eval task's options (`common.load_inputs`)."""
    from rnr_interp.engine.sampling import deployed_decoding
    from rnr_interp.report.kinds import analysis_of

    at_least("--batch-size", batch_size)
    at_least("--panel", options.get("panel"))

    def body():
        from rnr_interp.analyses.localise.recognition import default_readout

        lm, t = load_inputs(model, task, data, n, out=out, max_new_tokens=max_new_tokens, task_config=task_config,
                            on_invalid=on_invalid, lm_eval=lm_eval, task_seed=task_seed)
        if "readout" in options:
            options["readout"] = options["readout"] or default_readout(t)
        return analysis_of(kind).run(lm, t, out, decoding=deployed_decoding(t, max_new_tokens), batch_size=batch_size,
                                     progress=not quiet, **per_model(lm), **options)

    summary = execute(body)
    _figures(out)
    return summary


def _print_curve(s: SteerSummary | UnitsSummary, what: str, headline: str, header: str, group: tuple[str, str] | None,
                 row, rows: str = "table") -> None:
    """A steer/units summary: why it was skipped, or one line per x: the summary's
    `rows` records grouped by `group` = (x, kind) into {kind: record}, or as they are."""
    import pandas as pd

    if s.skipped is not None:
        typer.echo(f"no {what}: {s.skipped}")
        return
    typer.echo(f"{s.model} on {s.task}: {headline}")
    typer.echo(header)
    frame = pd.DataFrame(getattr(s, rows))
    if group is None:
        for r in frame.to_dict("records"):
            typer.echo(row(r[next(iter(r))], r))
        return
    x, kind = group
    for value, sub in frame.groupby(x):
        typer.echo(row(value, {str(k): r for k, r in zip(sub[kind], sub.to_dict("records"))}))


def _print_cohort_warnings(s: CohortSummary) -> None:
    """The letter-bias warning (with its rule) and the share of lucky recognitions."""
    bias = s.letter_bias or {}
    if bias.get("message"):
        typer.echo(f"  WARNING: {bias['message']} (rule: {bias['rule']})")
    sc = getattr(s, "screen", None) or {}  # failures and repair summaries carry their cell's screen line
    lucky = sc.get("lucky_share_of_recognised")
    if lucky is not None and lucky == lucky and lucky > 0.2:
        typer.echo(f"  note: under a guessing mixture about {lucky:.0%} of the recognised questions are lucky guesses "
                   f"(recognition {sc['recognition_score']:.3f} against chance {sc['recognition_chance']:.3f})")


def _power(r: dict) -> str:
    """A held-out rate's power, flagged when a verdict is not testable at this n."""
    p = r.get("power")
    if p is None:
        return ""
    flag = "" if p == p and p >= 0.8 else ", not testable at this n"
    return f" (power {_num(p)}{flag})"


def _num(x) -> str:
    return "  n/a" if x is None or x != x else f"{x:.3f}"


def _rate(r: dict) -> str:
    return f"{_num(r['rate'])} [{_num(r['lo'])}, {_num(r['hi'])}] of {r['n']}{_power(r)}"


def failures(
    model: Annotated[list[str], typer.Option("--model", "-m", help="model spec (repeatable: one cell per model x task)")] = ["smollm2"],
    task: Annotated[list[str], typer.Option("--task", "-t", help="task (repeatable): multiple choice, or free-form with "
                                            "distractors (arithmetic: near misses)")] = ["arc_easy"],
    data: DataOpt = None, n: NOpt = 24, task_seed: TaskSeedOpt = None,
    out: OutOpt = Path("runs/failures"), readout: ReadoutOpt = None, panel: PanelOpt = PANEL_CAP,
    margin: Annotated[float, typer.Option("--margin", help="screen: least recognition - generation of a failure cell")] = 0.10,
    circular: CircularOpt = False, grading: GradingOpt = None, max_new_tokens: MaxTokOpt = None, batch_size: BatchOpt = 32,
    on_invalid: OnInvalidOpt = "refuse", quiet: QuietOpt = False,
):
    """Failure set (recognised but answered wrong) and healthy panel of a task; over
    several models/tasks, one run per cell under OUT/cells and the cell-level screen
    (recognition vs generation score, the criterion applied) in OUT."""
    from rnr_interp.analyses.localise.recognition import FailureCriterion, default_readout
    from rnr_interp.records import FAILURES, SCREEN, RunDir
    from rnr_interp.report.kinds import analysis_of
    from rnr_interp.engine.sampling import check_prompts_fit, deployed_decoding

    if data is not None and len(task) > 1:
        fail("--data names one task's file; pass it with a single --task")
    cells = [(m, t) for m in model for t in task]
    folders = {cell: out if len(cells) == 1 else out / "cells" / f"{cell[0].replace('/', '_').replace(':', '_')}__{cell[1]}"
               for cell in cells}

    def body():
        from rnr_interp.models import load_model
        from rnr_interp.tasks import load_task

        # The checks load_inputs makes for one cell, made here for every cell before any runs.
        at_least("--n", n)
        at_least("--max-new-tokens", max_new_tokens)
        check_out(out)
        criterion = FailureCriterion(margin=margin)
        tasks = {t: load_task(t, data=data, n=n, on_invalid=on_invalid, **seeded(task_seed)) for t in task}
        for t in tasks.values():
            say_skipped(t)
        summaries = []
        for m in model:
            lm = load_model(m)
            for t in task:
                check_prompts_fit(lm, tasks[t], max_new_tokens or tasks[t].max_new_tokens)
            for t in task:
                summaries.append(analysis_of(FAILURES).run(lm, tasks[t], folders[(m, t)], readout=readout or default_readout(tasks[t]),
                                                           panel=panel, decoding=deployed_decoding(tasks[t], max_new_tokens),
                                                           criterion=criterion, batch_size=batch_size, progress=not quiet,
                                                           circular=circular, grading=grading))
        screen = analysis_of(SCREEN).run(out, [RunDir(folders[c]) for c in cells], criterion) if len(cells) > 1 else None
        return summaries, screen

    summaries, screen = execute(body)
    for s in summaries:
        typer.echo(f"{s.model} on {s.task}: {s.n_questions} questions, deployed accuracy {s.deployed_accuracy:.3f}")
        typer.echo(f"  recognition (gold first): {s.recognition_accuracy}")
        typer.echo(f"  failure set: {s.n_failure}   healthy panel: {s.n_panel}")
        if s.failure_empty_reason:
            typer.echo(f"  failure set is empty: {s.failure_empty_reason}")
        sc = s.screen
        typer.echo(f"  screen: recognition {sc['recognition_score']:.3f} (chance {sc['recognition_chance']:.3f}, excess "
                   f"{sc['recognition_excess']:+.3f} [{sc['recognition_excess_ci'][0]:+.3f}, {sc['recognition_excess_ci'][1]:+.3f}]) "
                   f"vs generation {sc['generation_score']:.3f}{' (circular)' if sc.get('circular') else ''}, "
                   f"difference {sc['difference']:+.3f} [{sc['difference_ci'][0]:+.3f}, {sc['difference_ci'][1]:+.3f}]: "
                   f"{'a failure cell' if sc['failure'] else 'not a failure cell'}")
        _print_cohort_warnings(s)
        print_multiple_choice(s)
    typer.echo(f"failure criterion: {summaries[0].screen['criterion']}")
    if screen is not None:
        _figures(out)
        typer.echo(f"screen: {screen.n_failure_cells} of {screen.n_cells} cells are failure cells")
    run_folder(out)


def repair(
    model: ModelOpt = "smollm2", task: TaskOpt = "arc_easy", data: DataOpt = None, n: NOpt = 24, task_seed: TaskSeedOpt = None,
    out: OutOpt = Path("runs/repair"), readout: ReadoutOpt = None, panel: PanelOpt = PANEL_CAP,
    split_seed: SplitSeedOpt = 0, layers: LayersOpt = None,
    sweep: Annotated[str, typer.Option("--sweep", help="all: every component at every layer; mlp: the MLP at every layer, "
                                       "then attention and whole layer at the chosen layer only (a third of the cost); "
                                       "layer: the whole layer at every layer, then MLP and attention at the chosen one")] = "all",
    ablation: AblationOpt = "zero", units: UnitsSilencedOpt = None,
    read_at: Annotated[str, typer.Option("--read-at", help="where each block's failure direction is read, to score "
                                         "its units (--units) and, where no failure's answer parts from its gold on "
                                         "a token, to break a tie between MLP blocks: prompt (the prompt's last "
                                         "position) | answer (where each deployed reply's answer starts), as rnr units "
                                         "and rnr steer --read-at read the chosen block")] = "prompt",
    permute_control: PermuteOpt = False, circular: CircularOpt = False, grading: GradingOpt = None, max_new_tokens: MaxTokOpt = None,
    batch_size: BatchOpt = 32, task_config: TaskConfigOpt = None, on_invalid: OnInvalidOpt = "refuse",
    log_to: LogToOpt = None, quiet: QuietOpt = False,
    num_fewshot: NumFewshotOpt = 0, fewshot_split: FewshotSplitOpt = None, fewshot_seed: FewshotSeedOpt = 1234,
    apply_chat_template: ChatTemplateOpt = False,
):
    """Silence every layer's MLP / attention / whole layer: repair and damage rates; the
    block chosen on half the failures and panel, scored on the other half."""
    check_log_to(log_to)
    at_least("--units", units)
    check_read_at(read_at)
    from rnr_interp.analyses.localise.cohort import Split
    from rnr_interp.analyses.localise.choice import tie_note
    from rnr_interp.analyses.localise.repair import controls_table
    from rnr_interp.records import REPAIR

    s = _localise(REPAIR, model, task, data, n, out, max_new_tokens, batch_size, quiet, task_config=task_config, task_seed=task_seed,
                  on_invalid=on_invalid, lm_eval=lm_eval_options(num_fewshot, fewshot_split, fewshot_seed, apply_chat_template), readout=readout, panel=panel,
                  split=Split(seed=split_seed), sweep=sweep, permutation_control=permute_control, circular=circular,
                  ablation=ablation, units=units, read_at=read_at, grading=grading,
                  per_model=lambda lm: {"layers": parse_layers(layers, lm.n_layers)})
    sp = s.split
    typer.echo(f"{s.model} on {s.task}: failure set {s.n_failure} ({sp['n_failure_selection']} choose, "
               f"{sp['n_failure_heldout']} held out), panel {s.n_panel} ({sp['n_panel_selection']} / {sp['n_panel_heldout']}); "
               f"split stratified by {', '.join(sp['stratified_by'])}{'; circular' if s.circular['on'] else ''}")
    _print_cohort_warnings(s)
    where = "where each deployed reply's answer starts" if s.read_at == "answer" else "at the prompt's end"
    if s.units is not None:
        typer.echo(f"  each MLP block silenced in its {s.units} units most along its own failure direction, read {where} "
                   "(the units are in the repair table's silenced_units column)")
    elif s.read_at is not None:
        typer.echo(f"  a tie between MLP blocks that no direct effect breaks is broken reading each block's failure "
                   f"direction {where}")
    if s.failure_empty_reason:
        typer.echo(f"  no repair to find: {s.failure_empty_reason}")
    controls = controls_table(s.to_json())
    if controls.empty:
        typer.echo("  no MLP block repaired any failure of the selection part")
    else:
        typer.echo("  held-out rates (95% Wilson; power = chance to detect the paper's 67.6% repair / 12% damage at this n):")
    for r in controls.itertuples():
        typer.echo(f"    {r.block:38s} repair {r.repair_heldout:.3f} [{r.repair_lo:.3f}, {r.repair_hi:.3f}] of {r.n_failure_heldout}"
                   f"{_power({'power': r.repair_power})}   damage {r.damage_heldout:.3f} [{r.damage_lo:.3f}, {r.damage_hi:.3f}] "
                   f"of {r.n_panel_heldout}{_power({'power': r.damage_power})}")
    for component, best in (s.best or {}).items():
        if (note := tie_note(component, best, sp)) is not None:
            typer.echo(f"  {note}")
    chosen = (s.at_chosen_layer or {}).get("mlp")
    if chosen is not None:
        typer.echo(f"  chosen MLP repair beside the held-out one: selection part {_num(chosen['repair']['selection']['rate'])} "
                   f"of {chosen['repair']['selection']['n']} (chose the block), all questions "
                   f"{_num(chosen['repair']['all']['rate'])} of {chosen['repair']['all']['n']}")
    print_multiple_choice(s)
    run_folder(out)
    log_finished(out, log_to)


def steer(
    model: ModelOpt = "smollm2", task: TaskOpt = "arc_easy", data: DataOpt = None, n: NOpt = 24, task_seed: TaskSeedOpt = None,
    out: OutOpt = Path("runs/steer"), layer: LayerOpt = None,
    component: Annotated[str, typer.Option("--component", help="mlp | attn | layer")] = "mlp",
    repair_run: RepairRunOpt = None,
    alphas: AlphasOpt = None, alpha_unit: AlphaUnitOpt = "rms",
    readout: ReadoutOpt = None, panel: PanelOpt = PANEL_CAP, split_seed: SplitSeedOpt = 0,
    permute_control: PermuteOpt = False, circular: CircularOpt = False, grading: GradingOpt = None,
    read_at: ReadAtOpt = "prompt",
    steer_at: SteerAtOpt = "every",
    random_control: Annotated[bool, typer.Option(
        "--random-control", help="the same sweep along a random direction as long as the steered vector, printed "
        "beside: a rescue or induction any push of that size gives is not the direction's (as many rows again)")] = False,
    clamp_control: Annotated[bool, typer.Option(
        "--clamp-control", help="also clamp the block's write to the panel's mean along v, within the span of "
        "the failures' writes and within a random span of that rank, on the held-out failures and panel: a rescue "
        "where the failure's write differs in size or direction from question to question, which no single alpha "
        "along one v undoes (an MLP or attention block's own v)")] = False,
    max_new_tokens: MaxTokOpt = None,
    batch_size: BatchOpt = 32, task_config: TaskConfigOpt = None, on_invalid: OnInvalidOpt = "refuse",
    log_to: LogToOpt = None, quiet: QuietOpt = False,
    num_fewshot: NumFewshotOpt = 0, fewshot_split: FewshotSplitOpt = None, fewshot_seed: FewshotSeedOpt = 1234,
    apply_chat_template: ChatTemplateOpt = False,
    vector: Annotated[Optional[Path], typer.Option("--vector", help="steer along this vector instead of v: a 1-D tensor "
                                                   "saved with torch.save (read as weights only)")] = None,
    site: Annotated[Optional[str], typer.Option("--site", help="with --vector, where to add it: a site-table key, a "
                                                "block's TransformerLens hook name, or blocks.N.NAME (default: "
                                                "--component's output)")] = None,
):
    """Steer the chosen block along v (from the selection parts, or --vector): rescue
    held-out failures, induce failures in the held-out panel."""
    check_log_to(log_to)
    from rnr_interp.analyses.localise.cohort import Split
    from rnr_interp.interventions import COMPONENT_SITE
    from rnr_interp.records import STEER

    one_of("--component", component, COMPONENT_SITE)
    check_alpha_unit(alpha_unit)
    check_read_at(read_at)
    check_steer_at(steer_at)
    s = _localise(STEER, model, task, data, n, out, max_new_tokens, batch_size, quiet, task_config=task_config, task_seed=task_seed,
                  on_invalid=on_invalid, lm_eval=lm_eval_options(num_fewshot, fewshot_split, fewshot_seed, apply_chat_template), layer=layer,
                  component=component, repair_run=repair_run, alphas=None if alphas is None else numbers("--alphas", alphas),
                  alpha_unit=alpha_unit, readout=readout, panel=panel, split=Split(seed=split_seed),
                  permutation_control=permute_control, circular=circular, site=site, grading=grading, read_at=read_at,
                  steer_at=steer_at, random_control=random_control, clamp_control=clamp_control,
                  vector=None if vector is None else _vector_file(vector))
    _print_curve(s, "steering", f"{component} layer {s.layer} ({s.block_choice}), |v| = {s.v_norm or 0:.3f}, "
                 f"residual RMS norm {s.residual_rms or 0:.3f}; alpha in {s.alpha_unit_words}",
                 "  alpha  rescue (held-out failures)   induction (held-out panel)   [95% Wilson]", ("alpha", "direction"),
                 lambda alpha, r: f"  {alpha:5g}  {_rate(r['rescue'])}   {_rate(r['induction'])}")
    if s.skipped is None and s.random_control:
        import pandas as pd

        typer.echo(f"  the same along a random direction (seed {s.random_control['seed']}, as long as the steered vector, "
                   f"cosine {s.random_control['cosine_with_v']:+.3f} with it):")
        for alpha, sub in pd.DataFrame(s.random_control["table"]).groupby("alpha"):
            r = {d: row for d, row in zip(sub["direction"], sub.to_dict("records"))}
            typer.echo(f"  {alpha:5g}  {_rate(r['rescue'])}   {_rate(r['induction'])}")
    if s.skipped is None and s.clamp_control:
        clamp = s.clamp_control
        spectrum = ", ".join(f"{x:.3f}" for x in clamp["spectrum"][:clamp["rank"] + 2])
        typer.echo(f"  the block's write clamped to the panel's mean: along v ({clamp['value_along_v']:+.3f}, the "
                   f"failures' {clamp['failure_value_along_v']:+.3f}), within the failures' span (rank {clamp['rank']}: "
                   f"the top directions holding {clamp['energy']:g} of their length; shares {spectrum}, ...) and within "
                   "a random span of that rank:")
        for r in clamp["table"]:
            typer.echo(f"    {r['clamped']:6s} {r['way']:6s} {_rate(r)}")
    print_multiple_choice(s)
    run_folder(out)
    log_finished(out, log_to)


def _vector_file(path: Path):
    """The tensor saved in `path`, read with torch's weights-only loader (no code runs), or a one-line refusal."""
    import pickle

    import torch

    if not path.is_file():
        fail(f"--vector {path}: no such file")
    try:
        vector = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        fail(f"--vector {path} is not a tensor saved with torch.save ({str(e).splitlines()[0]})")
    if not isinstance(vector, torch.Tensor):
        fail(f"--vector {path} holds a {type(vector).__name__}, not a tensor")
    return vector


def units(
    model: ModelOpt = "smollm2", task: TaskOpt = "arc_easy", data: DataOpt = None, n: NOpt = 24, task_seed: TaskSeedOpt = None,
    out: OutOpt = Path("runs/units"), layer: LayerOpt = None, repair_run: RepairRunOpt = None,
    ks: Annotated[str, typer.Option("--ks", help="comma-separated k grid")] = _KS,
    seed: SeedOpt = 0,
    draws: Annotated[int, typer.Option("--draws", help="random-k draws per k (the control's spread)")] = DEFAULT_DRAWS,
    readout: ReadoutOpt = None, panel: PanelOpt = PANEL_CAP, split_seed: SplitSeedOpt = 0,
    permute_control: PermuteOpt = False, circular: CircularOpt = False, grading: GradingOpt = None, read_at: ReadAtOpt = "prompt",
    max_new_tokens: MaxTokOpt = None, batch_size: BatchOpt = 32,
    task_config: TaskConfigOpt = None, on_invalid: OnInvalidOpt = "refuse",
    log_to: LogToOpt = None, quiet: QuietOpt = False,
    num_fewshot: NumFewshotOpt = 0, fewshot_split: FewshotSplitOpt = None, fewshot_seed: FewshotSeedOpt = 1234,
    apply_chat_template: ChatTemplateOpt = False,
):
    """Silence the top-k MLP units along v vs k random units (many draws): share of the
    block's held-out repair."""
    check_log_to(log_to)
    from rnr_interp.analyses.localise.cohort import Split
    from rnr_interp.records import UNITS

    check_read_at(read_at)
    s = _localise(UNITS, model, task, data, n, out, max_new_tokens, batch_size, quiet, task_config=task_config, task_seed=task_seed,
                  on_invalid=on_invalid, lm_eval=lm_eval_options(num_fewshot, fewshot_split, fewshot_seed, apply_chat_template), layer=layer,
                  repair_run=repair_run, ks=numbers("--ks", ks, int), seed=seed, draws=draws, readout=readout,
                  panel=panel, split=Split(seed=split_seed), permutation_control=permute_control, circular=circular,
                  grading=grading, read_at=read_at)
    _print_curve(s, "unit analysis", f"MLP layer {s.layer} ({s.block_choice}), held-out whole-MLP repair "
                 f"{s.whole_block_repair or 0:.3f}",
                 f"  k     top    random: mean (sd; min-max of {s.random_draws} draws)   (fraction of the whole-MLP repair)",
                 None, lambda k, r: f"  {k:<5d} {_num(r['top'])}  {_num(r['random_mean'])} ({_num(r['random_sd'])}; "
                                    f"{_num(r['random_min'])}-{_num(r['random_max'])})", rows="spread")
    print_multiple_choice(s)
    run_folder(out)
    log_finished(out, log_to)
