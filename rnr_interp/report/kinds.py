"""The one registry of analyses: what each kind of run folder is and how it is read.

Every analysis is registered here once, as an `Analysis`: its kind (the `kind` of its
run config), its typed summary (`records.summaries`), the dataclass of its settings, the
function that runs it, the function that summarises a finished run from its records
alone (where there is one: what `rnr regrade` calls), its figure sets
(`report.registry`) and the body of its page's Summary section (`report.sections`).
The analysis commands run their kind's function (`analysis_of(kind).run`), and
`rnr regrade`, `rnr report`, the reproduction's index and its findings look a run's kind
up here instead of testing kind names. docs/contributing.md adds one.

The analyses load torch, so `run`, `summarize` and `config` name their function or
class by module and name (`Lazy`) and import it on first use: a report needs none.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from rnr_interp.records import (
    AUDIT, COMPARE, FAILURES, REPAIR, ROUTE, ROUTE_CELLS, SCREEN, STEER, TEMPERATURE_SWEEP, UNITS, AuditSummary,
    CompareSummary, FailuresSummary, RepairSummary, RouteCellsSummary, RouteSummary, RunDir, ScreenSummary,
    SteerSummary, Summary, SummaryError, TemperatureSweepSummary, UnitsSummary, VALIDATE, ValidateSummary, load_runs, register_summary,
    summary_type,
)
from rnr_interp.report import sections
from rnr_interp.report.registry import (
    COMPARE_FIGURES, CROSS_CELL_FIGURES, LOCALISATION_FIGURES, REGISTRY, ROUTING_FIGURES, TEMPERATURE_FIGURES,
    VALIDATE_FIGURES, FigureSet,
)

S = TypeVar("S", bound=Summary)

if TYPE_CHECKING:
    from rnr_interp.tasks.base import Task


@dataclass(frozen=True)
class Lazy:
    """A function or class of the package named by module and name, imported when first used."""

    module: str
    name: str

    def resolve(self) -> Any:
        return getattr(importlib.import_module(self.module), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


#: summarize(run, task=, grading=, target=) -> the run's summary from its records (no
#: model): `task` reads what old records lack and the chance null, `grading` the headline
#: (None: the run's), `target` the folder that gets the tables
Summarize = Callable[..., Summary]


class Analysis(Protocol):
    """What the package knows of one kind of analysis."""

    kind: str
    summary: type[Summary]
    #: the dataclass of its settings
    config: Lazy | None
    #: the entry point that makes the run folder and returns its summary
    run: Lazy
    #: the summary from records alone (`Summarize`), or None when the kind has none
    summarize: Summarize | None
    figures: tuple[FigureSet, ...]
    #: the table that holds its rows where its run writes no records of its own (the
    #: notebook's `Result.records`), or None
    rows_table: str | None

    def section(self, summary: Any) -> str:
        """The body of the run page's Summary section ("" for none)."""
        ...


@dataclass(frozen=True)
class Registered:
    """An `Analysis` made of its parts (the package's own, and the worked example's)."""

    kind: str
    summary: type[Summary]
    config: Lazy | None
    run: Lazy
    section: Callable[[Any], str]
    figures: tuple[FigureSet, ...] = ()
    summarize: Summarize | None = None
    rows_table: str | None = None

    def __post_init__(self) -> None:
        if self.summary.KIND != self.kind:
            raise ValueError(f"analysis {self.kind!r}: its summary is the {self.summary.KIND!r} kind's")


def summarize_audit(run: RunDir, *, task: Task | None = None, grading: str | None = None,
                    target: RunDir | None = None) -> AuditSummary:
    """An audit's summary from its records, in the intervals its summary had (Wilson when
    it has none this version reads)."""
    from rnr_interp.analyses.audit import summarize

    try:
        ci = (run.read_summary().ci if run.has_summary() else None) or "wilson"
    except SummaryError:
        ci = "wilson"
    probe = (run.config.get("probe") or {}).get("name", "temperature")
    return summarize(run, probe, ci=ci, task=task, grading=grading)


def summarize_route(run: RunDir, *, task: Task | None = None, grading: str | None = None,
                    target: RunDir | None = None) -> RouteSummary:
    """A route run's summary from its records, its tables into `target`. Runs from before
    self-verification scores were stored (experiments/runs/gsm8k40) are the one exception
    to "no model": the model scores their candidates again (the forwards the run itself
    now makes)."""
    from rnr_interp.analyses.routing.config import route_config_of
    from rnr_interp.analyses.routing.summary import summarize_routes, verification_stored

    lm = None
    if not verification_stored(run):
        from rnr_interp.models import load_model

        facts = run.config.get("model_facts") or {}
        lm = load_model(run.config["model"], dtype=facts.get("dtype"))
    return summarize_routes(run, route_config_of(run), grading=grading, target=target, task=task, lm=lm)


def _analyses(*entries: Analysis) -> dict[str, Analysis]:
    out: dict[str, Analysis] = {}
    for entry in entries:
        if entry.kind in out:
            raise ValueError(f"analysis {entry.kind!r} registered twice")
        out[entry.kind] = entry
    return out


ANALYSES: dict[str, Analysis] = _analyses(
    Registered(AUDIT, AuditSummary, Lazy("rnr_interp.engine.sampling", "Probe"),
               Lazy("rnr_interp.analyses.audit", "run_audit"), sections.audit_html, summarize=summarize_audit),
    Registered(ROUTE, RouteSummary, Lazy("rnr_interp.analyses.routing.config", "RouteConfig"),
               Lazy("rnr_interp.analyses.routing.run", "run_route_audit"), sections.route_html, (ROUTING_FIGURES,),
               summarize=summarize_route),
    Registered(ROUTE_CELLS, RouteCellsSummary, None, Lazy("rnr_interp.analyses.routing.cells", "write_route_cells"),
               sections.no_html, (CROSS_CELL_FIGURES,)),
    Registered(TEMPERATURE_SWEEP, TemperatureSweepSummary, None,
               Lazy("rnr_interp.analyses.sweep", "run_temperature_sweep"), sections.no_html, (TEMPERATURE_FIGURES,)),
    Registered(FAILURES, FailuresSummary, Lazy("rnr_interp.analyses.localise.recognition", "FailureCriterion"),
               Lazy("rnr_interp.analyses.localise.repair", "run_failures"), sections.cohort_html, (LOCALISATION_FIGURES,)),
    Registered(SCREEN, ScreenSummary, Lazy("rnr_interp.analyses.localise.recognition", "FailureCriterion"),
               Lazy("rnr_interp.analyses.localise.repair", "write_screen"), sections.no_html, (LOCALISATION_FIGURES,)),
    Registered(REPAIR, RepairSummary, Lazy("rnr_interp.analyses.localise.cohort", "Split"),
               Lazy("rnr_interp.analyses.localise.repair", "run_repair"), sections.cohort_html, (LOCALISATION_FIGURES,)),
    Registered(STEER, SteerSummary, Lazy("rnr_interp.analyses.localise.cohort", "Split"),
               Lazy("rnr_interp.analyses.localise.steering", "run_steer"), sections.cohort_html, (LOCALISATION_FIGURES,),
               rows_table="steering"),  # on a repair run's cohort: one row per intervention asked
    Registered(UNITS, UnitsSummary, Lazy("rnr_interp.analyses.localise.cohort", "Split"),
               Lazy("rnr_interp.analyses.localise.steering", "run_units"), sections.cohort_html, (LOCALISATION_FIGURES,)),
    Registered(COMPARE, CompareSummary, None, Lazy("rnr_interp.analyses.checkpoints", "compare_runs"),
               sections.compare_html, (COMPARE_FIGURES,), rows_table="transitions"),  # one row per question
    Registered(VALIDATE, ValidateSummary, Lazy("rnr_interp.analyses.validate", "Profile"),
               Lazy("rnr_interp.analyses.validate", "run_validate"), sections.no_html, (VALIDATE_FIGURES,)),
)


def register(analysis: Analysis) -> Analysis:
    """Add an analysis (and its summary class) to the registry, once; ValueError when
    its kind is taken. The package's own are listed in `ANALYSES`; an analysis of your
    own registers itself when its module is imported (docs/contributing.md)."""
    if analysis.kind in ANALYSES:
        raise ValueError(f"analysis {analysis.kind!r} registered twice")
    register_summary(analysis.summary)
    ANALYSES[analysis.kind] = analysis
    return analysis


def analysis_of(kind: Any) -> Analysis:
    """The registered analysis of `kind` (a run config's), or ValueError naming the kinds."""
    if kind not in ANALYSES:
        summary_type(kind, "run config")  # a kind with a summary type but no analysis is a registry bug
        raise AssertionError(f"analysis kind {kind!r} has a summary type but is not registered")
    return ANALYSES[kind]


def finished_runs(folder: Path, *kinds: str) -> list[RunDir]:
    """The finished runs (summary written) under `folder` of the registered `kinds`
    (any kind when none is named); none when the folder is absent."""
    if unknown := [kind for kind in kinds if kind not in ANALYSES]:
        raise ValueError(f"no registered analysis of kind {unknown[0]!r}; the kinds: {', '.join(ANALYSES)}")
    return [run for run in load_runs(folder, *kinds) if run.has_summary()] if folder.is_dir() else []


def figure_sets(run: RunDir) -> tuple[FigureSet, ...]:
    """The figure sets of the run's kind; every set for a folder of no registered kind
    (each draws only when the run holds its tables)."""
    return ANALYSES[run.kind].figures if run.kind in ANALYSES else REGISTRY


def regradable(run: RunDir) -> Analysis:
    """The run's analysis, when its summary can be rewritten from its records; else
    ValueError naming the kinds that can."""
    if run.kind not in ANALYSES or ANALYSES[run.kind].summarize is None:
        can = " and ".join(k for k, a in ANALYSES.items() if a.summarize is not None)
        raise ValueError(f"regrade rewrites {can} runs; {run.path} is a {run.kind!r} run")
    return ANALYSES[run.kind]


def regrade(run: RunDir, *, task: Task | None, grading: str | None = None, target: RunDir | None = None) -> Summary:
    """The run's summary rewritten from its records (`Analysis.summarize`), with where it
    was regraded from, written into `target` (default: the run)."""
    target = target or run
    summary = regradable(run).summarize(run, task=task, grading=grading, target=target)
    summary = summary.but(regraded={"from": str(run.path), "records_parts": len(run.parts())})
    return target.write_summary(marked_unfinished(summary, run))


def marked_unfinished(summary: S, run: RunDir) -> S:
    """`summary`, saying so in `unfinished` and in a warning (shown by the CLI and the
    report) when `run` holds fewer questions than its task: a summary of a run that is
    still going, or was stopped, is not that run's result."""
    total, done = (run.config.get("task") or {}).get("n_questions"), len(run.done_question_ids())
    if total is None or done >= total:
        return summary
    note = (f"written from an unfinished run: {done} of {total} questions sampled, the numbers are over those {done} "
            "(finish the run with its own command, then regrade)")
    return summary.but(unfinished={"questions_done": done, "questions": total},
                       warnings=[*(summary.warnings or ()), note])
