"""What every command shares: option types, the error line, input loading and the
command skeleton."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterable, Optional, TypeVar

import typer

if TYPE_CHECKING:  # torch and pandas load on first use, so `rnr --help` stays quick
    from rnr_interp.models import LoadedModel
    from rnr_interp.records import AuditSummary, CohortSummary, CompareSummary, RouteSummary
    from rnr_interp.engine.sampling import RunSize
    from rnr_interp.tasks.base import Task

T = TypeVar("T")


def out_folder(value: str | Path) -> Path:
    """The parser of every --out: the empty string names no folder (as a Path it would
    be the working directory)."""
    if isinstance(value, Path):
        return value
    if value == "":
        raise typer.BadParameter("must name a folder, got the empty string")
    return Path(value)


# Options every analysis command shares (same names, same defaults).
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="smollm2 | gemma3-270m | tiny-llama[:L] | path.gguf | checkpoint dir | hub name")]
TaskOpt = Annotated[str, typer.Option("--task", "-t", help="gsm8k | arc | arc_easy | piqa | boolq | logiqa | hellaswag | jsonl | "
                                      "arithmetic | arithmetic_mc | copy | lm-eval:NAME (an installed lm-eval task)")]
DataOpt = Annotated[Optional[Path], typer.Option("--data", help="data file (default: ../shared/data/<task file>)")]
TaskConfigOpt = Annotated[Optional[Path], typer.Option(
    "--task-config", help="your own lm-eval task YAML (replaces --task); !function is refused outside lm-eval's installed tasks")]
NumFewshotOpt = Annotated[int, typer.Option(
    "--num-fewshot", help="lm-eval tasks: examples before each question, drawn as lm-eval does (default 0, whatever the YAML says)")]
FewshotSplitOpt = Annotated[Optional[str], typer.Option(
    "--fewshot-split", help="lm-eval tasks: the split the examples come from (default: the YAML's fewshot_split, else training_split, ...)")]
FewshotSeedOpt = Annotated[int, typer.Option("--fewshot-seed", help="lm-eval tasks: the few-shot sampler's seed (lm-eval's default 1234)")]
ChatTemplateOpt = Annotated[bool, typer.Option(
    "--apply-chat-template", help="lm-eval tasks: ask through the model's chat template (default: the raw prompt, as lm-eval)")]
OnInvalidOpt = Annotated[str, typer.Option(
    "--on-invalid", help="a data row that does not parse: refuse (the file) | skip (the row, listed in the manifest and summary)")]
NOpt = Annotated[Optional[int], typer.Option("--n", help="only the first N questions")]
TaskSeedOpt = Annotated[Optional[int], typer.Option(
    "--task-seed", help="generated tasks (arithmetic, arithmetic_mc, copy): the seed that draws their questions "
                        "(default 0); another seed gives other questions, e.g. to check a finding out of sample")]
KOpt = Annotated[int, typer.Option("--k", help="probe budget K per question")]
OutOpt = Annotated[Path, typer.Option("--out", "-o", parser=out_folder,
                                      help="run folder: new, empty, or a run of the same config to resume")]
SeedOpt = Annotated[int, typer.Option("--seed", help="base seed of every random draw")]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="questions per batched forward")]
TempOpt = Annotated[float, typer.Option("--temperature", help="probe sampling temperature")]
MaxTokOpt = Annotated[Optional[int], typer.Option("--max-new-tokens", help="generation length (default: the task's)")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar (model loading included)",
                                        callback=lambda quiet: silence_loading_bars(quiet))]
GradingOpt = Annotated[Optional[str], typer.Option(
    "--grading", help="headline grading: strict (the default for a new run: the task's answer format, not cut by the "
                      "token limit) | flexible (the answer kind's fallbacks too); a resumed run keeps its own, "
                      "the other is shown beside (docs/grading.md)")]
AnswerTypeOpt = Annotated[Optional[str], typer.Option(
    "--answer-type", help="jsonl free-form answers: auto (number when every gold is one) | number | text")]
SaveLogprobsOpt = Annotated[bool, typer.Option(
    "--save-logprobs", help="the records also hold each candidate's token ids and per-token log-probs "
                            "(token_ids, token_logprobs; docs/records.md)")]
AblationOpt = Annotated[str, typer.Option(
    "--ablation", help="how a block is silenced: zero (the paper's: it writes nothing) | mean (it writes its mean write "
    "over the task's prompts: removes only the block's deviation from its usual output)")]
UnitsSilencedOpt = Annotated[Optional[int], typer.Option(
    "--units", help="silence each MLP block in its K units most along that block's own failure direction alone "
                    "(scored on the selection part, as `rnr units` scores a block), not the whole block (the paper's); "
                    "attention and whole layers as --ablation says")]
SteerAtOpt = Annotated[str, typer.Option(
    "--steer-at", help="where the vector is added: every (every position, the default) | prompt (the prompt's last "
                       "position alone: the state that chooses the reply's first token; generated tokens are not steered) | reply (the "
                       "prompt's last position and every generated one: where a reply that opens with a preamble "
                       "states its answer; the prompt is read unsteered)")]
ReadAtOpt = Annotated[str, typer.Option(
    "--read-at", help="where v (and the units' contributions) are read: prompt (the prompt's last position) | answer "
    "(where each deployed reply's answer starts: after 'The final answer is' when the reply writes that)")]
AlphasOpt = Annotated[Optional[str], typer.Option(
    "--alphas", help="comma-separated alpha grid, in --alpha-unit (default: 0,0.125,0.25,0.5,1,2 for rms; "
                     "0,0.5,1,2,4,8 for raw)")]
AlphaUnitOpt = Annotated[str, typer.Option(
    "--alpha-unit", help="rms: alpha in multiples of the residual stream's RMS norm at the layer, along unit v; "
                         "raw: multiples of the unnormalised v; write: multiples of the RMS norm of what the block "
                         "itself writes, along unit v")]
LogToOpt = Annotated[Optional[str], typer.Option(
    "--log-to", help="when the run ends, log its config, summary and tables to wandb (an offline run under WANDB_DIR, "
                     "else ./wandb) or mlflow (MLFLOW_TRACKING_URI, else the file store ./mlruns)")]

#: errors that mean bad input (a message for the user, not a traceback); the package's
#: own errors subclass ValueError, and OSError covers unreadable or unwritable paths
USER_ERRORS: tuple[type[Exception], ...] = (ValueError, OSError)
KNOWN_ERRORS = USER_ERRORS
#: set by `rnr --debug` (or RNR_DEBUG=1): errors show their traceback instead of one line
debug = False


def one_line(message: str) -> str:
    """A message on one line (third-party messages can span several)."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def say_error(message: str) -> None:
    """The error line: `error: ...` on stderr, one line whatever the message."""
    typer.secho(f"error: {one_line(message)}", fg=typer.colors.RED, err=True)


def silence_loading_bars(quiet: bool) -> bool:
    """With --quiet, no progress bars from transformers and huggingface_hub either
    (model loading, downloads). The option's callback, so every command taking
    QuietOpt honours it before it loads anything."""
    if quiet:
        import huggingface_hub.utils
        import transformers

        transformers.utils.logging.disable_progress_bar()
        huggingface_hub.utils.disable_progress_bars()
    return quiet


def fail(message: str) -> None:
    """One line on stderr naming the problem, exit 2."""
    say_error(message)
    raise typer.Exit(2)


def numbers(option: str, text: str, kind: type = float) -> list:
    """A comma-separated list of `kind` (finite), or a one-line refusal naming `option`."""
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) for v in values):
        fail(f"{option} must be comma-separated {'whole ' if kind is int else ''}numbers, got {text!r}")
    return values


def one_of(option: str, value: Optional[str], choices: Iterable[str]) -> None:
    """Refuse `value` outside the closed list `choices`, naming `option` and the list."""
    choices = list(choices)
    if value not in choices:
        fail(f"{option} must be one of {', '.join(choices)}, got {value!r}")


def check_read_at(read_at: str) -> None:
    from rnr_interp.analyses.localise.defaults import READ_AT

    one_of("--read-at", read_at, READ_AT)


def check_alpha_unit(alpha_unit: str) -> None:
    from rnr_interp.analyses.localise.defaults import ALPHA_UNITS

    one_of("--alpha-unit", alpha_unit, ALPHA_UNITS)


def check_steer_at(steer_at: str) -> None:
    from rnr_interp.interventions import STEER_AT

    one_of("--steer-at", steer_at, STEER_AT)


def at_least(option: str, value: Optional[int], low: int = 1) -> None:
    """Refuse an integer option below `low` (None: not given, nothing to check)."""
    if value is not None and value < low:
        fail(f"{option} must be >= {low}, got {value}")


def built(factory: Callable[..., T], options: dict[str, str], **values: Any) -> T:
    """`factory(**values)` (a config dataclass that checks itself when made), its
    refusal reworded to name the command-line option: the dataclasses start each
    message with the field's name, and `options` maps fields to options."""
    try:
        return factory(**values)
    except ValueError as exc:
        field, _, rest = str(exc).partition(" ")
        fail(f"{options[field]} {rest}" if field in options else str(exc))
    raise AssertionError("unreachable")  # fail() always exits


def check_out(out: Path, option: str = "--out", marks: tuple[str, ...] | None = None) -> None:
    """Refuse an output folder that is a file, under a file or not writable, or an
    existing folder that is not this tool's: one without any of `marks` (default: a run
    folder's manifest) that holds anything but such folders (`records.check_out_folder`).
    Creates nothing."""
    from rnr_interp.records import MANIFEST, check_out_folder

    check_out_folder(out, option, marks if marks is not None else (MANIFEST,))


def execute(body: Callable[[], T], *, known: tuple[type[Exception], ...] = KNOWN_ERRORS, context: str = "") -> T:
    """The command skeleton: run `body` (load inputs, run the analysis) and return its
    result for the command to print; a known error becomes `fail` (prefixed by
    `context`) unless `debug` asks for the traceback, and a run folder with another
    config says how to proceed."""
    from rnr_interp.records import ConfigMismatchError

    try:
        return body()
    except known as exc:
        if debug:
            raise
        hint = " (use another --out, or the same options as the existing run)" if isinstance(exc, ConfigMismatchError) else ""
        fail(f"{context}{exc}{hint}")
    raise AssertionError("unreachable")  # fail() always exits


def seeded(task_seed: Optional[int]) -> dict[str, int]:
    """`load_task`'s seed for a generated task when --task-seed is given (a file task
    refuses it, naming the task); nothing otherwise, so the task draws as it always did."""
    return {} if task_seed is None else {"seed": task_seed}


def load_inputs(model: str, task: str, data: Optional[Path], n: Optional[int], *, out: Optional[Path] = None,
                max_new_tokens: Optional[int] = None, answer_type: Optional[str] = None,
                task_config: Optional[Path] = None, on_invalid: str = "refuse", lm_eval: Optional[dict] = None,
                size: Optional[Callable[..., tuple[RunSize, str]]] = None,
                task_seed: Optional[int] = None) -> tuple[LoadedModel, Task]:
    """Model and task of a command, after the checks every analysis shares: --n,
    --max-new-tokens and --out first (cheap), then the task (quicker to find wrong than
    the model), the run's size, the model, and whether every prompt the run will ask plus
    the tokens to generate fits the model's context. Nothing is created. `answer_type`
    (jsonl only) chooses how free-form answers are graded; `task_config` is an lm-eval
    YAML that replaces `task`; `on_invalid` says what an invalid data row does (skipped
    rows are counted on stderr); `lm_eval` holds an lm-eval task's options
    (`load_lm_eval`'s num_fewshot, fewshot_split, fewshot_seed, apply_chat_template;
    refused for other tasks when set); `task_seed` draws a generated task's questions
    (`seeded`). An lm-eval task asked raw (its default) is asked
    in a bare prompt format (`sampling.ask_as_the_task_says`), recorded as every prompt format is.
    `size(task, max_new_tokens, generating)` gives the run's
    `RunSize` and the option that sets its budget, checked against the machine's memory
    (`sampling.check_run_size`): before the model loads (generating None), and once it
    has, with its batched generations (generating: the model and the longest prompt's
    token count)."""
    from rnr_interp.models import load_model
    from rnr_interp.engine.sampling import ask_as_the_task_says, check_prompts_fit, check_run_size
    from rnr_interp.tasks import LM_EVAL_PREFIX, HFLoadError, load_task

    at_least("--n", n)
    at_least("--max-new-tokens", max_new_tokens)
    if out is not None:
        check_out(out)
    if answer_type is not None and task != "jsonl":
        raise ValueError(f"--answer-type applies to --task jsonl only (task {task!r} fixes its answer kind)")
    is_lm_eval = task_config is not None or task.startswith(LM_EVAL_PREFIX)
    if lm_eval and not is_lm_eval and (set_option := next((k for k in ("num_fewshot", "apply_chat_template") if lm_eval.get(k)), None)):
        raise ValueError(f"--{set_option.replace('_', '-')} applies to lm-eval tasks only (task {task!r} has its own prompt)")
    try:
        t = load_task(task, data=data, n=n, on_invalid=on_invalid, task_config=task_config, **seeded(task_seed),
                      **({"answer_type": answer_type} if answer_type else {}), **(lm_eval if lm_eval and is_lm_eval else {}))
    except HFLoadError as exc:  # an unreadable dataset folder or Arrow file is bad input too
        raise ValueError(str(exc)) from None
    if len(t) == 0:
        raise ValueError(f"task {task!r} has no questions")
    say_skipped(t)
    new_tokens = max_new_tokens or t.max_new_tokens
    if size is not None:
        check_run_size(*size(t, new_tokens, None))
    lm = load_model(model)
    ask_as_the_task_says(lm, t)
    longest = check_prompts_fit(lm, t, new_tokens)
    if size is not None:
        check_run_size(*size(t, new_tokens, (lm, longest)))
    return lm, t


def lm_eval_options(num_fewshot: int, fewshot_split: Optional[str], fewshot_seed: int, apply_chat_template: bool) -> dict:
    """The lm-eval task options of a command line, as `load_inputs` takes them."""
    return {"num_fewshot": num_fewshot, "fewshot_split": fewshot_split, "fewshot_seed": fewshot_seed,
            "apply_chat_template": apply_chat_template}


def say_skipped(task: Task) -> None:
    """How many data rows `--on-invalid skip` dropped, on stderr (nothing when none)."""
    if task.skipped_rows:
        first = task.skipped_rows[0]
        typer.echo(f"skipped {len(task.skipped_rows)} invalid row(s) of {task.source} (listed in the run's manifest and "
                   f"summary; first: row {first['row']}: {first['reason']})", err=True)


def check_grading_option(grading: Optional[str]) -> None:
    """Refuse a --grading that is not one of the gradings (None: not given)."""
    from rnr_interp.records import GRADINGS

    if grading is not None:
        one_of("--grading", grading, GRADINGS)


def print_grading(summary: AuditSummary | RouteSummary) -> None:
    """What a summary says about its grading: the null's reading and the unfinished
    rates, with their warnings (audit, regrade and pass-at-k alike)."""
    from rnr_interp.grading import null_line

    if summary.null:
        typer.echo(f"  {null_line(summary.null, summary.k)}")
    if summary.unfinished_rate:
        typer.echo("  stopped by the token limit: " + ", ".join(f"{p} {r:.0%}" for p, r in summary.unfinished_rate.items()))
    for warning in summary.warnings or ():
        typer.echo(f"warning: {warning}", err=True)


def fmt_ci(value: float, ci) -> str:
    return f"{value:6.3f}  [{ci[0]:.3f}, {ci[1]:.3f}]"


def run_folder(out: Path) -> None:
    typer.echo(f"run folder: {out}")


def check_log_to(log_to: Optional[str]) -> None:
    """Refuse --log-to's tracker before anything runs: unknown, or its package missing."""
    from rnr_interp.report.trackers import check_tracker

    if log_to is not None:
        execute(lambda: check_tracker(log_to), context="--log-to: ")


def log_finished(out: Path, log_to: Optional[str]) -> None:
    """Log the finished run in `out` to --log-to's tracker. The run stays as written
    whatever the tracker raises, so any failure there is one line saying so."""
    from rnr_interp.report.trackers import log_run

    if log_to is not None:
        where = execute(lambda: log_run(out, log_to), known=(Exception,),
                        context=f"the run in {out} is complete; logging it to {log_to} failed: ")
        typer.echo(f"logged to {log_to}: {where}")


def print_multiple_choice(summary: AuditSummary | CohortSummary | CompareSummary) -> None:
    """What a multiple-choice summary carries to read it against chance: the baselines,
    the deployed answer counts and warning, and (localisation) how interventions moved
    answers and the permutation control."""
    from rnr_interp.records import CohortSummary
    from rnr_interp.report.text import answer_change_line, chance_blocks, chance_lines, permutation_lines

    for label, block in chance_blocks(summary.chance).items():
        for line in chance_lines(block):
            typer.echo(f"  {label + ': ' if label else ''}{line}")
    if not isinstance(summary, CohortSummary):
        return
    for probe, changes in (summary.answer_changes or {}).items():
        typer.echo(f"  {answer_change_line(probe, changes)}")
    for line in permutation_lines(summary.permutation_control) if summary.permutation_control is not None else ():
        typer.echo(f"  {line}")
