"""The `rnr` command line. Each analysis module owns its command function; this file
holds the shared options and registers the commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Realized vs reachable: question-level audits of language models.")

# Options every analysis command shares (same names, same defaults).
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="smollm2 | tiny-llama[:L] | path.gguf | checkpoint dir | hub name")]
TaskOpt = Annotated[str, typer.Option("--task", "-t", help="gsm8k | arc | arc_easy | piqa | boolq | logiqa | hellaswag | jsonl | arithmetic | arithmetic_mc")]
DataOpt = Annotated[Optional[Path], typer.Option("--data", help="data file (default: ../shared/data/<task file>)")]
NOpt = Annotated[Optional[int], typer.Option("--n", help="only the first N questions")]
KOpt = Annotated[int, typer.Option("--k", help="probe budget K per question")]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="run folder (resumed if it exists with the same config)")]
SeedOpt = Annotated[int, typer.Option("--seed", help="base seed of every random draw")]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="questions per batched forward")]
TempOpt = Annotated[float, typer.Option("--temperature", help="probe sampling temperature")]
MaxTokOpt = Annotated[Optional[int], typer.Option("--max-new-tokens", help="generation length (default: the task's)")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")]


def fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def load_inputs(model: str, task: str, data: Optional[Path], n: Optional[int]):
    """Model and task for a command, with one-line errors for bad input."""
    from rnr_interp.models import ModelSpecError, load_model
    from rnr_interp.tasks import DataFormatError, load_task

    try:
        t = load_task(task, data=data, n=n)
    except (ValueError, FileNotFoundError, DataFormatError) as exc:
        fail(str(exc))
    if len(t) == 0:
        fail(f"task {task!r} has no questions")
    try:
        lm = load_model(model)
    except ModelSpecError as exc:
        fail(str(exc))
    return lm, t


def fmt_ci(value: float, ci) -> str:
    return f"{value:6.3f}  [{ci[0]:.3f}, {ci[1]:.3f}]"


@app.command("model-info")
def model_info(spec: Annotated[str, typer.Argument(help="model spec")]):
    """Print the loaded model's facts as one JSON object."""
    from rnr_interp.models import ModelSpecError, load_model

    try:
        lm = load_model(spec)
    except ModelSpecError as exc:
        fail(str(exc))
    typer.echo(json.dumps(lm.facts()))


@app.command()
def audit(
    model: ModelOpt = "smollm2",
    task: TaskOpt = "arithmetic",
    data: DataOpt = None,
    n: NOpt = None,
    k: KOpt = 32,
    out: OutOpt = Path("runs/audit"),
    temperature: TempOpt = 1.0,
    top_p: Annotated[float, typer.Option("--top-p")] = 1.0,
    deployed_temperature: Annotated[float, typer.Option("--deployed-temperature", help="0 = greedy")] = 0.0,
    max_new_tokens: MaxTokOpt = None,
    seed: SeedOpt = 0,
    batch_size: BatchOpt = 8,
    ci: Annotated[str, typer.Option("--ci", help="wilson | bootstrap")] = "wilson",
    quiet: QuietOpt = False,
):
    """Realized (deployed) vs reachable (any of K samples) per question: D, O_K, gap."""
    from rnr_interp.audit import run_audit
    from rnr_interp.generate import Decoding
    from rnr_interp.records import ConfigMismatchError
    from rnr_interp.sampling import Probe

    if ci not in ("wilson", "bootstrap"):
        fail(f"--ci must be wilson or bootstrap, got {ci!r}")
    lm, t = load_inputs(model, task, data, n)
    try:
        probe = Probe(k=k, temperature=temperature, top_p=top_p, seed=seed)
        deployed = Decoding(temperature=deployed_temperature, max_new_tokens=max_new_tokens or t.max_new_tokens)
        summary = run_audit(lm, t, out, probe=probe, deployed=deployed, batch_size=batch_size, ci=ci, progress=not quiet)
    except ConfigMismatchError as exc:
        fail(f"{exc} (use another --out, or the same options as the existing run)")
    except ValueError as exc:
        fail(str(exc))
    print_audit_table(summary)
    typer.echo(f"run folder: {out}")


def print_audit_table(s: dict) -> None:
    typer.echo(f"{s.get('model')} on {s.get('task')}: {s['n_questions']} questions, K={s['k']}, T={s.get('temperature')}  ({s['level']:.0%} {s['ci']} intervals)")
    typer.echo(f"  D    (realized)   {fmt_ci(s['D'], s['D_ci'])}")
    typer.echo(f"  O_K  (reachable)  {fmt_ci(s['O_K'], s['O_K_ci'])}")
    typer.echo(f"  gap  O_K - D      {fmt_ci(s['gap'], s['gap_ci'])}")


@app.command("pass-at-k")
def pass_at_k(run: Annotated[Path, typer.Argument(help="run folder")],
              probe: Annotated[str, typer.Option("--probe")] = "temperature"):
    """Print the unbiased pass@k curve of a run, k = 1..n."""
    from rnr_interp.audit import summarize
    from rnr_interp.records import RunDir

    if not (run / "manifest.json").is_file():
        fail(f"{run} is not a run folder (no manifest.json)")
    s = summarize(RunDir(run), probe)
    typer.echo(f"D (deployed) = {s['D']:.3f}")
    typer.echo("k\tpass@k")
    for k, p in zip(s["pass_at_k"]["k"], s["pass_at_k"]["pass"]):
        typer.echo(f"{k}\t{p:.4f}")


@app.command()
def route(
    model: ModelOpt = "smollm2",
    task: TaskOpt = "arithmetic",
    data: DataOpt = None,
    n: NOpt = None,
    k: KOpt = 16,
    out: OutOpt = Path("runs/route"),
    space: Annotated[list[str], typer.Option("--space", help="native | polar | skiponly (repeatable)")] = ["native"],
    methods: Annotated[str, typer.Option("--methods", help="comma-separated: random,mcts,hill_climb,genetic")] = "random,mcts,hill_climb,genetic",
    temperature: TempOpt = 1.0,
    collapse: Annotated[float, typer.Option("--collapse", help="unparsed-rate threshold for format collapse")] = 0.5,
    min_len: Annotated[Optional[int], typer.Option("--min-len", help="shortest route (default: L - L//3)")] = None,
    max_len: Annotated[Optional[int], typer.Option("--max-len", help="longest route (default: L + L//3)")] = None,
    seed: SeedOpt = 0,
    batch_size: BatchOpt = 16,
    quiet: QuietOpt = False,
):
    """Random layer routes vs structured search (MCTS, hill climbing, genetic) at a matched budget, plus answer-blind selectors."""
    from rnr_interp.records import ConfigMismatchError
    from rnr_interp.routing.audit import RouteConfig, run_route_audit
    from rnr_interp.routing.spaces import SPACES

    bad = [s for s in space if s not in SPACES]
    if bad:
        fail(f"unknown --space {bad[0]!r}; known: {', '.join(SPACES)}")
    lm, t = load_inputs(model, task, data, n)
    cfg = RouteConfig(k=k, spaces=tuple(space), methods=tuple(m.strip() for m in methods.split(",") if m.strip()),
                      temperature=temperature, seed=seed, collapse=collapse, batch_size=batch_size,
                      min_len=min_len, max_len=max_len)
    try:
        s = run_route_audit(lm, t, out, cfg, progress=not quiet)
    except (ConfigMismatchError, ValueError) as exc:
        fail(str(exc))
    typer.echo(f"{s['model']} on {s['task']}: {s['n_questions']} questions, budget K={s['k']} route evaluations per method")
    typer.echo(f"  deployed (greedy, full path)  {s['deployed']:.3f}")
    for m, v in s["oracle_at_k"].items():
        typer.echo(f"  oracle@K {m:<12}         {v:.3f}")
    for name, v in s["selectors"].items():
        typer.echo(f"  selector {name:<20} acc {v['accuracy']:.3f}  gap recovery (median) {v['gap_recovery_median']:.3f}")
    if s["excluded_cells"]:
        typer.echo(f"  excluded (format collapse): {', '.join(s['excluded_cells'])}")
    typer.echo(f"run folder: {out}")


def _register_analysis_commands() -> None:
    """Commands whose functions live with their analysis (each imports torch lazily)."""
    from rnr_interp.compare import compare_command
    from rnr_interp.repair import failures_command, repair_command
    from rnr_interp.report.html import report_command
    from rnr_interp.steering import steer_command, units_command
    from rnr_interp.sweep import sweep_command

    app.command("failures")(failures_command)
    app.command("repair")(repair_command)
    app.command("steer")(steer_command)
    app.command("units")(units_command)
    app.command("compare")(compare_command)
    app.command("report")(report_command)
    app.command("sweep")(sweep_command)


_register_analysis_commands()


def main() -> None:  # pragma: no cover
    app(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    main()
