"""The report's one registry of figures: run table (kind) -> the function that draws it.

An analysis writes tables into its run folder and draws nothing; the report looks the
tables up here. Each entry names the tables it draws, the section title on the page, the
JSON artefacts shown beside it, and `draw(run, label) -> [(name, figure)]`. A new figure
of an existing table is one function in its figure module; a new kind of table is one
entry here. The reachability figures (pass@k, hit counts) are drawn from the records,
not a table, and come first on every page (`figures.audit_figures`).

`write_run_figures` writes a run's figures as standalone HTML files in its
``figures/`` folder (the localisation commands do so after each run).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rnr_interp.records import RunDir
from rnr_interp.report import compare_figures, repair_figures
from rnr_interp.report import validate_figures
from rnr_interp.report.figures import (
    ROUTING_TABLES,
    Figures,
    cross_cell_figures,
    read_table,
    routing_figures,
    run_label,
    summary_of,
    temperature_figures,
)


@dataclass(frozen=True)
class FigureSet:
    """Figures drawn from `tables` (when the run holds any of them with rows)."""

    title: str
    tables: tuple[str, ...]
    draw: Callable[[RunDir, str], Figures]
    #: JSON artefacts shown in the same section (the sets the figures are about)
    json: tuple[str, ...] = ()


ROUTING_FIGURES = FigureSet("Routing", ROUTING_TABLES, routing_figures)
CROSS_CELL_FIGURES = FigureSet("Routing across cells", ("advantage",), cross_cell_figures)
TEMPERATURE_FIGURES = FigureSet("Selection gap vs temperature", ("temperature_sweep",), temperature_figures)
LOCALISATION_FIGURES = FigureSet("Failure screen, repair, steering and units",
                                 ("screen", "repair", "controls", "steering", "units"), repair_figures.figures,
                                 ("failure_set", "healthy_panel"))
COMPARE_FIGURES = FigureSet("Checkpoint comparison", ("transitions", "propensity"), compare_figures.figures)
VALIDATE_FIGURES = FigureSet("Recovery of planted effects", ("recovery", "detection"), validate_figures.figures)
#: every figure set; each analysis names its own (`report.kinds`)
REGISTRY: tuple[FigureSet, ...] = (ROUTING_FIGURES, CROSS_CELL_FIGURES, TEMPERATURE_FIGURES, LOCALISATION_FIGURES,
                                   COMPARE_FIGURES, VALIDATE_FIGURES)


def present_tables(run: RunDir, entry: FigureSet) -> list[str]:
    """The entry's tables `run` holds with rows (none: nothing to draw)."""
    return [name for name in entry.tables if (t := read_table(run, name)) is not None and len(t)]


def write_run_figures(run: RunDir) -> list[Path]:
    """Every registered figure of `run` as ``figures/NAME.html`` (sharing one local
    plotly.min.js, so the pages open offline). Returns the files written."""
    label = run_label(run.config, summary_of(run))
    folder = run.path / "figures"
    written = []
    for entry in REGISTRY:
        if not present_tables(run, entry):
            continue
        for name, fig in entry.draw(run, label):
            folder.mkdir(exist_ok=True)
            fig.write_html(folder / f"{name}.html", include_plotlyjs="directory")
            written.append(folder / f"{name}.html")
    return written
