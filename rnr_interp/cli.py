"""The `rnr` command line: registers the commands of `rnr_interp.commands`.

The top of the import order (models/tasks/records/metrics -> interventions ->
generate/sampling -> analyses -> report -> cli): nothing in the package imports this
module or `commands` (tests/test_layering.py checks).

Bad input never shows a traceback: each command checks its options and inputs before it
creates anything (`commands.common.execute`), and whatever a user can still cause (a
ValueError or OSError from any layer, a usage error such as `--k abc`) ends here as one
line on stderr and exit code 2. `rnr --debug COMMAND ...` (or RNR_DEBUG=1) shows the
traceback instead.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from rnr_interp.commands import audit, common, compare, localise, report, reproduce, sweep
from rnr_interp.commands import plant


class OneLineErrors(TyperGroup):
    """The `rnr` group: usage errors and bad input end as `error: ...` on one stderr
    line with exit code 2, unless --debug asks for the traceback."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        common.debug = bool(os.environ.get("RNR_DEBUG"))
        # `--device` and `--dtype` set these for one invocation only
        saved = {name: os.environ.get(name) for name in ("RNR_DEVICE", "RNR_DTYPE")}
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as exc:  # usage errors: bad option values, unknown options
            if type(exc).__name__ == "NoArgsIsHelpError":  # bare `rnr`: the help, as asked for
                typer.echo(exc.ctx.get_help() if getattr(exc, "ctx", None) else str(exc))
                code = 0
            elif common.debug:
                raise
            else:
                common.say_error(exc.format_message())
                code = 2
        except common.USER_ERRORS as exc:
            if common.debug:
                raise
            common.say_error(str(exc) or type(exc).__name__)
            code = 2
        except typer.Abort:
            typer.echo("aborted", err=True)
            code = 1
        finally:
            common.debug = False  # one invocation's --debug must not outlive it (tests invoke many)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(cls=OneLineErrors, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Realized vs reachable: question-level audits of language models.")


@app.callback()
def _options(
    debug: Annotated[bool, typer.Option("--debug", help="show the traceback of an error")] = False,
    device: Annotated[str | None, typer.Option("--device", help="where models run: cpu (default), cuda, cuda:N, mps or auto "
                                                "(sets RNR_DEVICE for this invocation)")] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="model weights: float32 (default), bfloat16 or float16 "
                                              "(sets RNR_DTYPE for this invocation; recorded in every run's config)")] = None,
) -> None:
    if debug:
        common.debug = True
    if device is not None:
        from rnr_interp.models import resolve_device

        os.environ["RNR_DEVICE"] = resolve_device(device)
    if dtype is not None:
        from rnr_interp.models import resolve_dtype

        os.environ["RNR_DTYPE"] = str(resolve_dtype(dtype)).removeprefix("torch.")


COMMANDS = {
    "model-info": audit.model_info,
    "audit": audit.audit,
    "pass-at-k": audit.pass_at_k,
    "temperature-sweep": audit.temperature_sweep,
    "route": audit.route,
    "route-summary": audit.route_summary,
    "route-cells": audit.route_cells,
    "regrade": audit.regrade,
    "failures": localise.failures,
    "repair": localise.repair,
    "steer": localise.steer,
    "units": localise.units,
    "compare": compare.compare,
    "report": report.report,
    "sweep": sweep.sweep,
    "reproduce": reproduce.reproduce,
    "plant": plant.plant,
    "validate": plant.validate,
}
for name, command in COMMANDS.items():
    app.command(name)(command)


def main() -> None:  # pragma: no cover
    app(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    main()
