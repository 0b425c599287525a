"""What every command shares: option types, the error line, input loading and the
command skeleton."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable, Optional, TypeVar

import typer

if TYPE_CHECKING:  # torch and pandas load on first use, so `rnr --help` stays quick
    from rnr_interp.models import LoadedModel
    from rnr_interp.tasks.base import Task

T = TypeVar("T")

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

#: errors that mean bad input (a message for the user, not a traceback)
KNOWN_ERRORS: tuple[type[Exception], ...] = (ValueError, FileNotFoundError)


def fail(message: str) -> None:
    """One line on stderr naming the problem, exit 2."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def execute(body: Callable[[], T], *, known: tuple[type[Exception], ...] = KNOWN_ERRORS, context: str = "") -> T:
    """The command skeleton: run `body` (load inputs, run the analysis) and return its
    result for the command to print; a known error becomes `fail` (prefixed by
    `context`), a run folder with another config says how to proceed."""
    from rnr_interp.records import ConfigMismatchError

    try:
        return body()
    except ConfigMismatchError as exc:
        fail(f"{context}{exc} (use another --out, or the same options as the existing run)")
    except known as exc:
        fail(f"{context}{exc}")
    raise AssertionError("unreachable")  # fail() always exits


def load_inputs(model: str, task: str, data: Optional[Path], n: Optional[int]) -> tuple[LoadedModel, Task]:
    """Model and task of a command (the task first: it is quicker to find wrong)."""
    from rnr_interp.models import load_model
    from rnr_interp.tasks import load_task

    t = load_task(task, data=data, n=n)
    if len(t) == 0:
        raise ValueError(f"task {task!r} has no questions")
    return load_model(model), t


def fmt_ci(value: float, ci) -> str:
    return f"{value:6.3f}  [{ci[0]:.3f}, {ci[1]:.3f}]"


def run_folder(out: Path) -> None:
    typer.echo(f"run folder: {out}")
