"""The report command: a self-contained HTML page per run folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rnr_interp.commands.common import KNOWN_ERRORS, check_out, execute, out_folder


def report(
    run_dir: Annotated[Path, typer.Argument(help="run folder, or a sweep folder holding several")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", parser=out_folder, help="output folder (default: RUN_DIR itself)")] = None,
    images: Annotated[bool, typer.Option("--images/--no-images", help="also write each figure as SVG and PNG (needs Chromium)")] = False,
):
    """Write a self-contained HTML report (index.html for a sweep) of a run folder."""
    from rnr_interp.records import MANIFEST
    from rnr_interp.report.export import ChromiumNotFound
    from rnr_interp.report.html import INDEX_NAME, REPORT_NAME, write_report

    if out is not None:  # a report folder may be written again
        check_out(out, marks=(MANIFEST, REPORT_NAME, INDEX_NAME))
    page = execute(lambda: write_report(run_dir, out, images=images), known=(*KNOWN_ERRORS, ChromiumNotFound))
    typer.echo(f"report: {page}")
