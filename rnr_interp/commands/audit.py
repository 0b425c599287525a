"""Commands of the audit layer: model-info, audit, pass-at-k, temperature-sweep, route, route-cells."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from rnr_interp.commands.common import (
    AnswerTypeOpt, BatchOpt, DataOpt, GradingOpt, KOpt, LogToOpt, MaxTokOpt, ModelOpt, NOpt, OnInvalidOpt, OutOpt, QuietOpt,
    SaveLogprobsOpt, SeedOpt, TaskConfigOpt, TaskOpt, TaskSeedOpt, TempOpt, NumFewshotOpt, FewshotSplitOpt, FewshotSeedOpt, ChatTemplateOpt,
    lm_eval_options, at_least, built, check_grading_option, check_log_to, check_out, execute, fail, fmt_ci, load_inputs,
    log_finished, out_folder, print_grading, print_multiple_choice, run_folder,
)
from rnr_interp.engine.decoding import SAMPLING_TEMPERATURE

if TYPE_CHECKING:
    from rnr_interp.records import AuditSummary, RouteSummary


def model_info(spec: Annotated[str, typer.Argument(help="model spec")]):
    """Print the loaded model's facts as one JSON object."""
    from rnr_interp.models import load_model

    lm = execute(lambda: load_model(spec))
    typer.echo(json.dumps(lm.facts()))


def audit(
    model: ModelOpt = "smollm2",
    task: TaskOpt = "arithmetic",
    data: DataOpt = None,
    n: NOpt = None,
    task_seed: TaskSeedOpt = None,
    k: KOpt = 32,
    out: OutOpt = Path("runs/audit"),
    temperature: TempOpt = SAMPLING_TEMPERATURE,
    top_p: Annotated[float, typer.Option("--top-p")] = 1.0,
    deployed_temperature: Annotated[float, typer.Option("--deployed-temperature", help="0 = greedy")] = 0.0,
    max_new_tokens: MaxTokOpt = None,
    seed: SeedOpt = 0,
    batch_size: BatchOpt = 8,
    ci: Annotated[str, typer.Option("--ci", help="wilson | bootstrap")] = "wilson",
    prompt_like: Annotated[Optional[Path], typer.Option(
        "--prompt-like", help="audit run folder whose prompt format to ask in (e.g. the base model's, for compare --shared-prompt)")] = None,
    answer_type: AnswerTypeOpt = None,
    task_config: TaskConfigOpt = None,
    num_fewshot: NumFewshotOpt = 0,
    fewshot_split: FewshotSplitOpt = None,
    fewshot_seed: FewshotSeedOpt = 1234,
    apply_chat_template: ChatTemplateOpt = False,
    on_invalid: OnInvalidOpt = "refuse",
    grading: GradingOpt = None,
    circular: Annotated[bool, typer.Option("--circular", help="multiple choice: also ask every question under each "
                                           "cyclic shift of its options; right = right under every shift (m times the cost)")] = False,
    save_logprobs: SaveLogprobsOpt = False,
    log_to: LogToOpt = None,
    quiet: QuietOpt = False,
):
    """Realized (deployed) vs reachable (any of K samples) per question: D, O_K, gap, read against a chance null."""
    from rnr_interp.engine.decoding import Decoding
    from rnr_interp.engine.sampling import Probe, deployed_decoding
    from rnr_interp.records import AUDIT
    from rnr_interp.report.kinds import analysis_of

    if ci not in ("wilson", "bootstrap"):
        fail(f"--ci must be wilson or bootstrap, got {ci!r}")
    at_least("--batch-size", batch_size)
    check_grading_option(grading)
    check_log_to(log_to)
    probe = built(Probe, {"k": "--k", "temperature": "--temperature", "top_p": "--top-p"},
                  k=k, temperature=temperature, top_p=top_p, seed=seed)
    # the deployed decoding's own checks, before anything is loaded (its length comes with the task)
    built(Decoding, {"temperature": "--deployed-temperature"}, temperature=deployed_temperature, max_new_tokens=1)

    shared_format = prompt_format_of(prompt_like) if prompt_like is not None else None

    def body():
        lm, t = load_inputs(model, task, data, n, out=out, task_seed=task_seed, max_new_tokens=max_new_tokens, answer_type=answer_type,
                            task_config=task_config, on_invalid=on_invalid, size=audit_size(k, batch_size),
                            lm_eval=lm_eval_options(num_fewshot, fewshot_split, fewshot_seed, apply_chat_template))
        if shared_format is not None:  # else the task's own format (an lm-eval task's raw prompt)
            lm.prompt_override = shared_format
        deployed = deployed_decoding(t, max_new_tokens, temperature=deployed_temperature)
        return analysis_of(AUDIT).run(lm, t, out, probe=probe, deployed=deployed, batch_size=batch_size, ci=ci, progress=not quiet,
                                      grading=grading, circular=circular, save_logprobs=save_logprobs)

    print_audit_table(execute(body))
    run_folder(out)
    log_finished(out, log_to)


def audit_size(k: int, batch_size: int) -> Callable[..., tuple[Any, str]]:
    """An audit's size (`sampling.RunSize`) for `load_inputs`: the deployed answer and K
    samples per question, voted over K, generated for `batch_size` questions at once."""
    from rnr_interp.engine.sampling import run_size

    def size(t, max_new_tokens, generating):
        batch = min(batch_size, len(t))
        return run_size(t, k, fixed_rows=1, rows_per_vote=1, max_new_tokens=max_new_tokens, batch_rows=(batch, batch),
                        generating=generating), "--k"

    return size


def prompt_format_of(run: Path):
    """The prompt format recorded in an audit run's manifest (one-line error if none)."""
    from rnr_interp.models import PromptFormat
    from rnr_interp.records import RunDir

    if not (run / "manifest.json").is_file():
        fail(f"{run} is not a run folder (no manifest.json)")
    described = RunDir(run).config.get("prompt_format")
    if described is None:
        fail(f"run {run} records no prompt format (made before prompt formats were recorded); rerun its audit")
    try:
        return PromptFormat.from_description(described)
    except (ValueError, KeyError) as exc:
        fail(f"run {run}: bad prompt format record ({exc})")


def print_audit_table(s: AuditSummary) -> None:
    grading, other = s.headline, s.beside()
    typer.echo(f"{s.model} on {s.task}: {s.n_questions} questions, K={s.k}, T={s.temperature}  "
               f"({s.level:.0%} {s.ci} intervals; graded {grading}{f', {other} beside' if other else ''})")

    def beside(key: str) -> str:
        return f"   {other} {s.graded(other)[key]:.3f}" if other else ""

    typer.echo(f"  D    (realized)   {fmt_ci(s.D, s.D_ci)}{beside('D')}")
    typer.echo(f"  O_K  (reachable)  {fmt_ci(s.O_K, s.O_K_ci)}{beside('O_K')}")
    typer.echo(f"  gap  O_K - D      {fmt_ci(s.gap, s.gap_ci)}{beside('gap')}")
    if s.circular is not None and grading in s.circular:
        c = s.circular[grading]
        typer.echo(f"  circular ({len(s.circular['shifts'])} shifts, right under every one): D {fmt_ci(c['D'], c['D_ci'])}"
                   f"  O_K {fmt_ci(c['O_K'], c['O_K_ci'])}  gap {fmt_ci(c['gap'], c['gap_ci'])}")
        if "null" in c:
            from rnr_interp.grading import null_line  # the CLI starts without the analyses

            typer.echo(f"  circular {null_line(c['null'], s.k)}")
    if s.majority is not None:
        m = s.majority
        typer.echo(f"  majority@K (answer-blind vote, ties to the first sample)  {fmt_ci(m['accuracy'], m['accuracy_ci'])}")
        typer.echo(f"  selection gap O_K - majority      {fmt_ci(m['selection_gap'], m['selection_gap_ci'])}")
        typer.echo(f"  majority gap recovery             {fmt_ci(m['gap_recovery'], m['gap_recovery_ci'])}")
    print_grading(s)
    print_multiple_choice(s)


def pass_at_k(run: Annotated[Path, typer.Argument(help="run folder")],
              probe: Annotated[str, typer.Option("--probe")] = "temperature",
              grading: GradingOpt = None):
    """Print the unbiased pass@k curve of a run, k = 1..n, under its headline grading with the other beside."""
    from rnr_interp.analyses.audit import summarize
    from rnr_interp.records import RunDir

    check_grading_option(grading)
    if not (run / "manifest.json").is_file():
        fail(f"{run} is not a run folder (no manifest.json)")
    folder = execute(lambda: RunDir(run), context=f"{run}: ")  # a damaged folder or part: one line
    total, done = (folder.config.get("task") or {}).get("n_questions"), len(execute(folder.done_question_ids, context=f"{run}: "))
    if not done:
        fail(f"{run} is unfinished: no question sampled yet")

    def body():
        probes = {p for _, p in folder.stored_groups()}
        if probe not in probes:
            fail(f"{run} has no records of probe {probe!r} (it has: {', '.join(sorted(probes)) or 'no records'}); pass --probe")
        return summarize(folder, probe, task=run_task(folder), grading=grading)

    s = execute(body, context=f"{run}: ")
    if total is not None and done < total:
        typer.echo(f"unfinished run: {done} of {total} questions sampled; pass@k below is over those {done} "
                   f"(rerun the same command to finish it)", err=True)
    headline, curves = s.headline, s.pass_at_k
    others = [g for g in ("strict", "flexible") if g != headline and g in curves]
    typer.echo(f"D (deployed, {headline}) = {s.D:.3f}" + "".join(f"   {g} {s.graded(g)['D']:.3f}" for g in others))
    typer.echo("\t".join(["k", f"pass@k ({headline})", *(f"pass@k ({g})" for g in others)]))
    for i, (k, p) in enumerate(zip(curves["k"], curves["pass"])):
        typer.echo("\t".join([str(k), f"{p:.4f}", *(f"{curves[g][i]:.4f}" for g in others)]))
    print_grading(s)


def regrade(
    run: Annotated[Path, typer.Argument(help="a run folder (audit or route); its records are only read")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="write the summary and tables here instead of into RUN "
                                                "(a folder with RUN's manifest, summary and tables, no records)")] = None,
    grading: GradingOpt = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="the run's data file, where it is not at the path the manifest names")] = None,
    quiet: QuietOpt = False,
):
    """Rewrite a run's summary and tables from its records under a grading (default: the run's) and the chance null; records are never touched."""
    from rnr_interp.records import RunDir

    check_grading_option(grading)
    if not (run / "manifest.json").is_file():
        fail(f"{run} is not a run folder (no manifest.json)")

    def body():
        from rnr_interp.records import writer_lock
        from rnr_interp.report.kinds import regradable, regrade as rewrite
        from rnr_interp.tasks import reload_task

        folder = RunDir(run)
        regradable(folder)
        described = folder.config["task"]
        task = reload_task({**described, "source": str(data)} if data is not None else described)
        # A regrade writes into a folder only as its writer: a run still being written is refused.
        target, lock = (folder, writer_lock(run)) if out is None else regraded_folder(folder, out)
        summary = rewrite(folder, task=task, grading=grading, target=target)
        del lock  # the writer lock goes with the last reference in this process
        return target, summary

    target, s = execute(body, context=f"{run}: ")
    from rnr_interp.records import AuditSummary, RouteSummary

    if isinstance(s, RouteSummary):
        print_route_summary(s)
    elif isinstance(s, AuditSummary):
        print_audit_table(s)
    else:
        typer.echo(f"{s.kind} summary rewritten from {s.regraded['records_parts']} records part(s)")
    run_folder(target.path)


def regraded_folder(run, out: Path):
    """(`out` as a folder holding `run`'s manifest and no records: where a regrade writes
    its summary and tables when it leaves the run's own as they are; the writer lock on
    it, which the regrade holds until it is done)."""
    from rnr_interp.records import MANIFEST, TASK_FILE, RunDir, write_json_atomic, write_text_atomic, writer_lock

    if out.resolve() == run.path.resolve():
        return run, writer_lock(run.path)
    if (out / MANIFEST).is_file() and RunDir(out).config_hash != run.config_hash:
        raise ValueError(f"--out {out} holds another run; choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    lock = writer_lock(out)
    if (run.path / TASK_FILE).is_file():  # the questions the manifest's checksum vouches for, beside it
        write_text_atomic(out / TASK_FILE, (run.path / TASK_FILE).read_text(encoding="utf-8"))
    write_json_atomic(out / MANIFEST, {**run.manifest, "regraded_from": str(run.path.resolve())})
    return RunDir(out), lock


def run_task(folder):
    """The task a run folder's manifest describes, or None (with a note) when its data
    file is not here: strict grades of old records and the null then cannot be read."""
    from rnr_interp.tasks import reload_task

    try:
        return reload_task(folder.config["task"])
    except (OSError, ValueError) as exc:
        typer.echo(f"note: the run's task cannot be reloaded here ({exc}): no null, and records made before both "
                   "grades were recorded are graded flexibly only", err=True)
        return None


def route(
    model: ModelOpt = "smollm2",
    task: TaskOpt = "arithmetic",
    data: DataOpt = None,
    n: NOpt = None,
    task_seed: TaskSeedOpt = None,
    k: Annotated[int, typer.Option("--k", help="temperature samples K per question")] = 32,
    budget: Annotated[Optional[int], typer.Option("--budget", help="route evaluations per search and question (default: K)")] = None,
    out: OutOpt = Path("runs/route"),
    space: Annotated[list[str], typer.Option("--space", help="native | polar | skiponly (repeatable)")] = ["native"],
    methods: Annotated[str, typer.Option("--methods", help="comma-separated: random,random_matched,mcts,hill_climb,genetic")
                       ] = "random,random_matched,mcts,hill_climb,genetic",
    proposals: Annotated[Optional[int], typer.Option("--proposals", help="routes each structured search proposes per round "
                                                     "(default: MCTS 1, hill climbing 8, genetic 8; 1: all sequential)")] = None,
    temperature: TempOpt = SAMPLING_TEMPERATURE,
    collapse: Annotated[float, typer.Option("--collapse", help="unparsed-rate threshold for format collapse")] = 0.5,
    min_len: Annotated[Optional[int], typer.Option("--min-len", help="shortest route (default: L - L//3)")] = None,
    max_len: Annotated[Optional[int], typer.Option("--max-len", help="longest route (default: L + L//3)")] = None,
    seed: SeedOpt = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", help="questions per chunk: searched together and written "
                                                "together (a stopped chunk resumes from RUN/journal.jsonl); a batched forward "
                                                "holds up to max(this, 64) rows on a CPU, 512 on a GPU")] = 16,
    answer_type: AnswerTypeOpt = None,
    task_config: TaskConfigOpt = None,
    num_fewshot: NumFewshotOpt = 0,
    fewshot_split: FewshotSplitOpt = None,
    fewshot_seed: FewshotSeedOpt = 1234,
    apply_chat_template: ChatTemplateOpt = False,
    on_invalid: OnInvalidOpt = "refuse",
    grading: GradingOpt = None,
    log_to: LogToOpt = None,
    quiet: QuietOpt = False,
):
    """Random layer routes vs structured search (MCTS, hill climbing, genetic) at a matched budget, plus answer-blind selectors."""
    check_log_to(log_to)
    from rnr_interp.analyses.routing.config import RouteConfig
    from rnr_interp.records import ROUTE
    from rnr_interp.report.kinds import analysis_of

    check_grading_option(grading)
    options = {"samples": "--k", "budget": "--budget", "spaces": "--space", "methods": "--methods",
               "temperature": "--temperature", "collapse": "--collapse", "batch_size": "--batch-size",
               "min_len": "--min-len", "max_len": "--max-len", "proposals": "--proposals"}
    cfg = built(RouteConfig, options, samples=k, budget=k if budget is None else budget, spaces=tuple(space),
                methods=tuple(m.strip() for m in methods.split(",") if m.strip()), proposals=proposals, temperature=temperature,
                seed=seed, collapse=collapse, batch_size=batch_size, min_len=min_len, max_len=max_len)

    def body():
        lm, t = load_inputs(model, task, data, n, out=out, task_seed=task_seed, answer_type=answer_type, task_config=task_config,
                            on_invalid=on_invalid, size=route_size(cfg, "--budget" if budget is not None else "--k"),
                            lm_eval=lm_eval_options(num_fewshot, fewshot_split, fewshot_seed, apply_chat_template))
        return analysis_of(ROUTE).run(lm, t, out, cfg, progress=not quiet, grading=grading)

    print_route_summary(execute(body))
    run_folder(out)
    log_finished(out, log_to)


def route_size(cfg: Any, option: str) -> Callable[..., tuple[Any, str]]:
    """A route audit's size (`sampling.RunSize`) for `load_inputs`: the deployed answer,
    the temperature samples and every search's budget of routes per question, voted over
    the budget; a chunk's samples (or a route batch, if larger) generated at once."""
    from rnr_interp.analyses.routing.config import route_rows
    from rnr_interp.analyses.routing.run import audit_searches_count
    from rnr_interp.engine.sampling import run_size

    def size(t, max_new_tokens, generating):
        batch = min(cfg.batch_size, len(t))
        routes = max(cfg.batch_size, route_rows(generating[0])) if generating else 0
        # with --k alone the samples grow with the budget; the route rows of a batch do not
        rows = (max(batch, routes), batch) if option == "--k" else (max(batch * (1 + cfg.samples), routes), 0)
        return run_size(t, cfg.budget, fixed_rows=1 + cfg.samples, rows_per_vote=audit_searches_count(cfg),
                        max_new_tokens=t.max_new_tokens, batch_rows=rows, generating=generating), option

    return size


def route_summary(
    run: Annotated[Path, typer.Argument(help="a route run folder, finished or not (it is only read)")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", parser=out_folder, help="the snapshot's run folder (default: RUN-<done>q beside RUN)")] = None,
    quiet: QuietOpt = False,
):
    """Summarise a route run over the chunks written so far, while it goes on: its records are copied into a new run
    folder (--out), which gets a finished run's summary and tables over those questions. Reads records (no model), and
    the task's file where it is here, for the chance nulls."""
    from rnr_interp.records import RunDir
    from rnr_interp.analyses.routing.config import route_config_of
    from rnr_interp.analyses.routing.summary import summarize_so_far

    def body():
        folder = RunDir(run)
        route_config_of(folder)  # a route run
        done = len(folder.done_question_ids())
        target = out if out is not None else run.resolve().with_name(f"{run.resolve().name}-{done}q")
        check_out(target)
        return target, summarize_so_far(folder, target)

    target, s = execute(body, context=f"{run}: ")
    snap = s.snapshot
    if snap["questions_total"] is not None and snap["questions_done"] < snap["questions_total"]:
        typer.echo(f"unfinished run: {snap['questions_done']} of {snap['questions_total']} questions written; "
                   f"the summary below is over those {snap['questions_done']}", err=True)
    print_route_summary(s)
    run_folder(target)


def print_route_summary(s: RouteSummary) -> None:
    grading, other = s.headline, s.beside()
    beside = s.graded(other) if other else None
    typer.echo(f"{s.model} on {s.task}: {s.n_questions} questions, budget {s.budget} route evaluations per method"
               f" (graded {grading}{f', {other} beside' if other else ''})")
    typer.echo(f"  deployed (greedy, full path)  {s.deployed:.3f}" + (f"   {other} {beside['deployed']:.3f}" if other else ""))
    for m, v in s.oracle_at_k.items():
        typer.echo(f"  oracle@K {m:<14}       {v:.3f}" + (f"   {other} {beside['oracle_at_k'][m]:.3f}" if other else ""))
    for cell, c in s.cells.items():
        flags = ("  (excluded: format collapse of the full path)" if c["excluded"] else "") + \
                ("" if c.get("informative", True) else "  (no method beat greedy: tests nothing)")
        typer.echo(f"  {cell}{flags}")
        typer.echo("    mean edits from the full path: " + ", ".join(f"{m} {v:.2f}" for m, v in c.get("edits_mean", {}).items()))
        for m, null in c.get("null", {}).items():
            typer.echo(f"    chance null {m:<14} oracle@K {c['oracle_at_k'][m]:.3f} vs null {null['O_K']:.3f}: "
                       f"oracle - null {fmt_ci(null['O_K_minus_null'], null['O_K_minus_null_ci'])}"
                       + ("" if null.get("above_chance", True) else "  (at chance)"))
        for base, key in (("random", "random_minus_structured"), ("random_matched", "matched_minus_structured")):
            for m, d in c.get(key, {}).items():
                against = d.get("baseline", base)
                two_way = f"   two-way {fmt_ci(d['value'], d['ci_two_way'])}" if "ci_two_way" in d else ""
                typer.echo(f"    {against} - {m:<12} {fmt_ci(d['value'], d['ci'])}{two_way}")
        for name, v in c["selectors"].items():
            typer.echo(f"    selector {name:<18} acc {fmt_ci(v['accuracy'], v['accuracy_ci'])}"
                       f"  gap recovery {fmt_ci(v['gap_recovery'], v['gap_recovery_ci'])}")
    for space, per in (s.layers or {}).items():
        top = per["top"]
        null = "" if top["null_gain"] is None else f", chance null {top['null_gain']:.3f}" + \
            (" (above chance)" if top["above_chance"] else " (not above chance)")
        typer.echo(f"  where the gains are, {space}: {top['action']} layer {top['layer']}, "
                   f"gain {fmt_ci(top['gain'], top['gain_ci'])}{null}")
    if s.excluded_cells:
        typer.echo(f"  excluded (format collapse of the full path): {', '.join(s.excluded_cells)}")
    for line in s.missing or ():
        typer.echo(f"  not computed: {line}")
    print_grading(s)


def temperature_sweep(
    model: ModelOpt = "smollm2",
    task: TaskOpt = "arithmetic",
    data: DataOpt = None,
    n: NOpt = None,
    task_seed: TaskSeedOpt = None,
    k: KOpt = 32,
    temperatures: Annotated[str, typer.Option("--temperatures", help="comma-separated, e.g. 0.7,1.0,1.3")] = "0.7,1.0,1.3",
    out: OutOpt = Path("runs/temperature"),
    seed: SeedOpt = 0,
    batch_size: BatchOpt = 8,
    task_config: TaskConfigOpt = None,
    num_fewshot: NumFewshotOpt = 0,
    fewshot_split: FewshotSplitOpt = None,
    fewshot_seed: FewshotSeedOpt = 1234,
    apply_chat_template: ChatTemplateOpt = False,
    on_invalid: OnInvalidOpt = "refuse",
    grading: GradingOpt = None,
    quiet: QuietOpt = False,
):
    """One audit per temperature: O_K - majority@K and O_K - greedy per temperature, with paired intervals, read against the null."""
    from rnr_interp.records import TEMPERATURE_SWEEP
    from rnr_interp.report.kinds import analysis_of

    try:
        temps = [float(t) for t in temperatures.split(",") if t.strip()]
    except ValueError:
        fail(f"--temperatures must be comma-separated numbers, got {temperatures!r}")
    if not temps or not all(math.isfinite(t) and t > 0 for t in temps):  # before the model loads and the folder is made
        fail(f"--temperatures must be finite numbers > 0, got {temperatures!r}")
    check_grading_option(grading)

    def body():
        lm, t = load_inputs(model, task, data, n, out=out, task_seed=task_seed, task_config=task_config, on_invalid=on_invalid,
                            size=audit_size(k, batch_size), lm_eval=lm_eval_options(num_fewshot, fewshot_split, fewshot_seed, apply_chat_template))
        return analysis_of(TEMPERATURE_SWEEP).run(lm, t, out, temps, k=k, seed=seed, batch_size=batch_size,
                                                  progress=not quiet, grading=grading)

    table = execute(body)
    graded_as = table["grading"].iloc[0] if "grading" in table and len(table) else "flexible"
    other = "flexible" if graded_as == "strict" else "strict"
    null = "O_K_null" in table
    typer.echo(f"graded {graded_as} ({other} beside)")
    typer.echo(f"T\tD\tO_K\tO_K - majority [95% CI]\tO_K - D [95% CI]\tO_K {other}" + ("\tO_K null\tgap above null [95% CI]" if null else "")
               + "\tunfinished")
    for r in table.to_dict("records"):
        gap = fmt_ci(r['oracle_minus_majority'], (r['oracle_minus_majority_lo'], r['oracle_minus_majority_hi']))
        typer.echo(f"{r['temperature']:g}\t{r['D']:.3f}\t{r['O_K']:.3f}\t{gap}"
                   f"\t{fmt_ci(r['oracle_minus_greedy'], (r['oracle_minus_greedy_lo'], r['oracle_minus_greedy_hi']))}"
                   f"\t{r.get(f'O_K_{other}', float('nan')):.3f}"
                   + (f"\t{r['O_K_null']:.3f}\t{fmt_ci(r['gap_above_null'], (r['gap_above_null_lo'], r['gap_above_null_hi']))}" if null else "")
                   + f"\t{r.get('unfinished_rate', float('nan')):.0%}")
    run_folder(out)


def route_cells(
    folder: Annotated[Path, typer.Argument(help="a folder of route runs (models x tasks x spaces)")],
    out: Annotated[Optional[Path], typer.Option("--out", parser=out_folder, help="where to write the tables (default: FOLDER/route_cells)")] = None,
):
    """The cross-cell table in the paper's units: model-task cells, per-space comparisons where random (and
    random_matched) >= each search, medians, selector gap recovery."""
    from rnr_interp.records import ROUTE_CELLS
    from rnr_interp.report.kinds import analysis_of

    if not folder.is_dir():
        fail(f"{folder} is not a folder")
    if out is not None:
        check_out(out)
    run, tables = execute(lambda: analysis_of(ROUTE_CELLS).run(folder, out))
    for r in tables["runs"][~tables["runs"].kept].itertuples():
        typer.echo(f"left out {r.run} ({r.space}): shares {r.shared_questions} questions of {r.model} on {r.task} with "
                   f"{r.overlaps}, which is kept (a cell's questions count once)")
    for r in tables["model_task"].itertuples():
        scope = "format-collapse cells left out" if r.scope == "clean" else "format-collapse cells kept"
        typer.echo(f"{r.baseline} >= every search in {r.holding}/{r.tested} model-task cells ({scope}; "
                   f"{r.untested} of {r.model_task_cells} untested: no method beat greedy, or every comparison "
                   f"at chance, counted apart)")
    counts = tables["counts"]
    for r in counts[(counts.search == "all") & (counts.space != "all")].itertuples():
        typer.echo(f"  {r.baseline:<14} {r.scope:<5} space {r.space:<9} {r.baseline} >= search in "
                   f"{r.baseline_ge_search}/{r.comparisons} comparisons ({r.untested} untested)")
    for r in counts[(counts.search != "all") & (counts.space == "all")].itertuples():
        typer.echo(f"  {r.baseline:<14} {r.scope:<5} median {r.baseline} - {r.search:<10} {r.median_diff:+.3f}"
                   f" over {r.comparisons} comparisons")
    for r in tables["advantage"].itertuples():
        typer.echo(f"  {r.cell:<40} random - {r.search:<10} K={r.k}  {fmt_ci(r.advantage, (r.lo, r.hi))} ({r.interval})"
                   + ("" if r.informative else "  (untested: both oracles at chance)" if r.at_chance else "  (untested)"))
    for r in tables["selector_distribution"].itertuples():
        typer.echo(f"  selector {r.selector:<18} gap recovery median {r.median:.3f} [q25 {r.q25:.3f}, q75 {r.q75:.3f}] over {r.cells} cells")
    for r in tables["collapsed"].itertuples():
        typer.echo(f"  collapsed: {r.cell} (full path unparsed {r.unparsed_rate:.2f})")
    run_folder(run.path)
