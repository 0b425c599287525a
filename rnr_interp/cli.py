"""The `rnr` command line: registers the commands of `rnr_interp.commands`.

The top of the import order (models/tasks/records/metrics -> interventions ->
generate/sampling -> analyses -> report -> cli): nothing in the package imports this
module or `commands` (tests/test_layering.py checks).
"""

from __future__ import annotations

import sys

import typer

from rnr_interp.commands import audit, compare, localise, report, sweep

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Realized vs reachable: question-level audits of language models.")

COMMANDS = {
    "model-info": audit.model_info,
    "audit": audit.audit,
    "pass-at-k": audit.pass_at_k,
    "route": audit.route,
    "failures": localise.failures,
    "repair": localise.repair,
    "steer": localise.steer,
    "units": localise.units,
    "compare": compare.compare,
    "report": report.report,
    "sweep": sweep.sweep,
}
for name, command in COMMANDS.items():
    app.command(name)(command)


def main() -> None:  # pragma: no cover
    app(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    main()
