"""The report command: a self-contained HTML page per run folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rnr_interp.commands.common import KNOWN_ERRORS, check_out, execute


def report(
    run_dir: Annotated[Path, typer.Argument(help="run folder, or a sweep folder holding several")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="output folder (default: RUN_DIR itself)")] = None,
    images: Annotated[bool, typer.Option("--images/--no-images", help="also write each figure as SVG and PNG (needs Chromium)")] = False,
):
    """Write a self-contained HTML report (index.html for a sweep) of a run folder."""
    from rnr_interp.report.export import ChromiumNotFound
    from rnr_interp.report.html import write_report

    if out is not None:
        check_out(out)
    page = execute(lambda: write_report(run_dir, out, images=images), known=(*KNOWN_ERRORS, ChromiumNotFound))
    typer.echo(f"report: {page}")
