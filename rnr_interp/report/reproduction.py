"""The reproduction's index page: the findings table, the cost of each part, a link to
each part's own report (a sweep index of its run folders, `html.write_report`), and
the paper's figure kinds drawn across each part's runs:

- audit: oracle pass@k and majority vote@k per task (`task_curves_figure`);
- routing: the route figures over every cell of the part (oracle and vote curves,
  sorted random - structured differences, selector gap recovery) on the concatenated
  tables, and the cross-cell aggregate's advantage figure (the registry);
- temperature: the selection gap against T (the registry's temperature sweep figure);
- localisation: the failure screen scatter, then each passing cell's repair/damage by
  layer and component, controls, steering and units (the registry);
- checkpoints: change in D and O_K, per-question transitions and propensity bins
  (`compare_figures`) over the recipes.

The page reads what the driver passes (profile, per-part status and cost, findings) and
the run folders; it computes nothing.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from rnr_interp.records import AUDIT, COMPARE, LOCALISATION_SWEEPS, MANIFEST, ROUTE, TEMPERATURE_SWEEP, RunDir, load_runs
from rnr_interp.report import compare_figures
from rnr_interp.report.figures import (
    ROUTING_TABLES,
    Figures,
    read_table,
    route_distance_figure,
    routing_figures_of,
    summary_of,
)
from rnr_interp.report.html import INDEX_NAME, Page, document, write_page, write_report
from rnr_interp.report.sections import escape_html, table_html
from rnr_interp.report.kinds import figure_sets, finished_runs
from rnr_interp.report.registry import present_tables
from rnr_interp.report.reproduction_figures import task_curves_figure
from rnr_interp.report.text import interval

#: the run folders a part writes beside its cells: the routing part's cross-cell
#: aggregate and the localisation part's cell-level screen
ROUTE_CELLS, SCREEN = "route_cells", "screen"


def _finished_at(path: Path) -> RunDir | None:
    """The run folder at `path` once it has finished; None while it is absent (its
    part failed or has not reached it) or unfinished."""
    if not (path / MANIFEST).is_file():
        return None
    run = RunDir(path)
    return run if run.has_summary() else None


def write_reproduction_report(root: Path, profile: str, model: str, why: dict[str, str],
                              parts: dict[str, dict[str, Any]], findings: Sequence[dict[str, Any]]) -> Path:
    """Each part's report (``PART/index.html``) and the root's ``index.html``."""
    links = {}
    for name in parts:
        folder = root / name
        if folder.is_dir() and load_runs(folder):
            try:
                links[name] = write_report(folder).relative_to(root).as_posix()
            except Exception as err:  # a part whose report fails still gets its row and figures
                warnings.warn(f"the report of {folder} failed: {err!r}", stacklevel=2)
    label = f"{model} · profile {profile}"
    page = Page(None, label)
    page.blocks.append(f"<h1>Reachability Is Not Realization, reproduced on {escape_html(model)}</h1>"
                       f'<p class="facts">profile {escape_html(profile)} · root {escape_html(str(root))}</p>')
    _findings_section(page, findings)
    _parts_section(page, parts, links, why)
    _audit_section(page, root / "1_audit", label)
    _routing_section(page, root / "2_routing", label)
    _temperature_section(page, root / "3_temperature", label)
    _localisation_section(page, root / "4_localisation", label)
    _checkpoint_section(page, root / "5_checkpoints")
    text = document(f"reproduction on {model} ({profile})", "".join(page.blocks))
    return write_page(root / INDEX_NAME, text, page.figures, images=False)


def _findings_section(page: Page, findings: Sequence[dict[str, Any]]) -> None:
    head = ["claim (paper)", "paper", "scope", "this model", "value", "95% interval", "n", "verdict", "why",
            "planted effect this n detects"]
    rows = [(f["claim"], f["paper"], f["scope"], f["measured"] or "—",
             "—" if f["value"] is None else f"{f['value']:.3f}", interval(f["ci"], "—"), "—" if f["n"] is None else f["n"],
             f'<b class="verdict">{escape_html(f["verdict"])}</b>', f["why"], f.get("planted") or "—") for f in findings]
    rows = [tuple(c if isinstance(c, str) and c.startswith("<b") else escape_html(c) for c in r) for r in rows]
    page.section("Findings: the paper's claims on this model", table_html(head, rows, raw=True),
                 note="Computed from the run folders' summaries (findings.json). Verdicts compare the 95% interval "
                      "with the stated threshold; an interval that spans it is 'not testable here' at this size. "
                      "A row 'reported, not judged' shows a number the paper reports on no claim's threshold.")


def where_spent(part: dict[str, Any]) -> str:
    """A part's seconds by the device they were spent on, when it ran on more than one
    or not on the CPU ("" for a CPU-only part recorded before devices were)."""
    by_device = part.get("seconds_by_device") or {}
    if not by_device or (len(by_device) == 1 and next(iter(by_device)).startswith("cpu")):
        return ""
    return "; ".join(f"{dev}: {sec:.0f} s" for dev, sec in by_device.items())


def _parts_section(page: Page, parts: dict[str, dict[str, Any]], links: dict[str, str], why: dict[str, str]) -> None:
    rows = []
    for name, p in parts.items():
        link = f'<a href="{escape_html(links[name])}">{escape_html(name)}</a>' if name in links else escape_html(name)
        where = where_spent(p)
        seconds = f"{p.get('seconds', 0):.0f}" + (f" ({where})" if where else "")
        rows.append((link, escape_html(p.get("title", "")), escape_html(p.get("status", "")), escape_html(seconds),
                     escape_html(p.get("error") or why.get(name, why.get("all", "")))))
    page.section("Parts: status and cost", table_html(["part", "what", "status", "wall seconds", "sizes / error"], rows, raw=True),
                 note="Wall seconds summed over invocations until the part finished (a resumed part keeps what it cost).")


def _audit_section(page: Page, folder: Path, label: str) -> None:
    curves = []
    for run in finished_runs(folder, AUDIT):
        s = run.read_summary()
        pk = s.pass_at_k or {}
        if pk.get("k"):
            vote = (s.vote_at_k or {}).get("majority")
            curves.append({"task": s.task, "k": pk["k"], "pass": pk["pass"], "vote": vote, "D": s.D})
    if curves:
        page.section("1 · Realization audit", figures=[("task_curves", task_curves_figure(curves, label))])


def _registered(run: RunDir, label: str, prefix: str = "") -> Figures:
    """Every registry figure of `run`, names prefixed (several runs share a page)."""
    figs: Figures = []
    for entry in figure_sets(run):
        if present_tables(run, entry):
            figs += [(f"{prefix}{name}", fig) for name, fig in entry.draw(run, label)]
    return figs


def _routing_section(page: Page, folder: Path, label: str) -> None:
    runs = finished_runs(folder, ROUTE)
    tables = [[t for r in runs if (t := read_table(r, name)) is not None and len(t)] for name in ROUTING_TABLES]
    figs = routing_figures_of(*(pd.concat(ts, ignore_index=True) if ts else None for ts in tables), None,
                              f"{label} · {len(runs)} routing runs")
    if distances := [t for r in runs if (t := read_table(r, "route_distances")) is not None and len(t)]:
        figs.append(("route_distances", route_distance_figure(pd.concat(distances, ignore_index=True),
                                                              f"{label} · {len(runs)} routing runs")))
    if cells := _finished_at(folder / ROUTE_CELLS):
        figs += _registered(cells, f"{label} · clean cells")
    if figs:
        page.section("2 · Routing cells across tasks and spaces", figures=figs)


def _temperature_section(page: Page, folder: Path, label: str) -> None:
    figs = [f for run in finished_runs(folder, TEMPERATURE_SWEEP) for f in _registered(run, f"{label} · {run.path.name}")]
    if figs:
        page.section("3 · Selection gap vs temperature", figures=figs)


def _localisation_section(page: Page, folder: Path, label: str) -> None:
    figs: Figures = []
    if screen := _finished_at(folder / SCREEN):
        figs += _registered(screen, label)
    for run in finished_runs(folder, *LOCALISATION_SWEEPS):
        cell = run.path.parent.name
        figs += _registered(run, f"{label} · {cell}", prefix=f"{cell}_")
    if figs:
        page.section("4 · Failure screen, repair with same-layer controls, steering, units", figures=figs)


def _checkpoint_section(page: Page, folder: Path) -> None:
    runs = finished_runs(folder, COMPARE)
    if not runs:
        return
    pairs = [(r.path.name.removeprefix("compare_"), r) for r in runs]
    figs: Figures = [("checkpoint_change", compare_figures.change_figure([(n, summary_of(r)) for n, r in pairs])),
                     ("checkpoint_propensity", compare_figures.propensity_figure([(n, r.read_table("propensity")) for n, r in pairs]))]
    figs += [(f"{n}_transitions", compare_figures.gained_lost_figure(r.read_table("transitions"))) for n, r in pairs]
    page.section("5 · Checkpoint audit", figures=figs)
