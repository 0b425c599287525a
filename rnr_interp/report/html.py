"""One self-contained HTML page per run folder (and an index page for a sweep).

A page shows what the run folder holds and nothing else: the audit table and pass@k
(summary.json), the per-question drill-down (records), one section per figure set of
`registry.REGISTRY` whose tables the run holds (routing; repair, steering and units;
checkpoint comparison), any other artefact as a table, and the run's configuration. plotly.js is inlined once per page, so the page
opens offline; it loads nothing from the network.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rnr_interp.records import DEPLOYED, AuditSummary, RunDir, RunFolderError, Summary, load_runs, write_text_atomic, writer_lock
from rnr_interp.report.figures import ROUTING_TABLES, Figures, audit_figures, read_table, routing_figures_of, run_label, summary_of
from rnr_interp.report.kinds import analysis_of
from rnr_interp.report.registry import REGISTRY, FigureSet, present_tables
from rnr_interp.report.sections import escape_html, table_html, with_interval

REPORT_NAME = "report.html"
INDEX_NAME = "index.html"
FIGURES_DIR = "figures"
SAMPLES_SHOWN = 3
MAX_QUESTIONS = 500
TEXT_CHARS = 400


@dataclass
class Page:
    """A run's page being assembled: HTML blocks in order, the figures they embed."""

    run: RunDir | None  # None for a sweep's index
    label: str
    blocks: list[str] = field(default_factory=list)
    figures: Figures = field(default_factory=list)
    consumed: set[str] = field(default_factory=set)

    def section(self, title: str, body: str = "", figures: Figures = (), note: str = "") -> None:
        parts = [f"<section><h2>{escape_html(title)}</h2>"]
        if note:
            parts.append(f'<p class="note">{escape_html(note)}</p>')
        parts.append(body)
        for name, fig in figures:
            name = self._unique(name)
            include = not self.figures  # plotly.js goes inline once, with the first figure
            self.figures.append((name, fig))
            parts.append(f'<figure data-name="{escape_html(name)}">'
                         + fig.to_html(full_html=False, include_plotlyjs=include, config={"displaylogo": False})
                         + "</figure>")
        self.blocks.append("".join(parts) + "</section>")

    def _unique(self, name: str) -> str:
        taken = {n for n, _ in self.figures}
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "figure"
        out, i = slug, 2
        while out in taken:
            out, i = f"{slug}_{i}", i + 1
        return out


# -- building a page ------------------------------------------------------------------


def build_page(run: RunDir, back_link: str | None = None) -> tuple[str, Figures]:
    """The page of one run, and its figures as (name, figure) for image export."""
    summary = summary_of(run)
    page = Page(run, run_label(run.config, summary))
    _summary_section(page, summary)
    scores = _drilldown_section(page, summary)
    if figs := audit_figures(run, scores, page.label):
        page.section("Reachability", figures=figs)
    for entry in REGISTRY:  # every set whose tables the run holds: the page hides nothing it has
        _registered_section(page, entry)
    _other_artefacts_section(page)
    _config_section(page, summary)
    return document(f"{page.label} — {run.path.name}", _header(run, summary, back_link) + "".join(page.blocks)), page.figures


def _summary_section(page: Page, s: Summary | None) -> None:
    if s is None:
        page.section("Summary", note="No summary.json yet: the run has not finished.")
        return
    if body := analysis_of(s.kind).section(s):
        page.section(f"Summary ({s.kind})", body)


def _drilldown_section(page: Page, summary: Summary | None) -> pd.DataFrame | None:
    """Per-question table from the records; returns the question scores (None without
    records, or when they cannot be scored as one audit)."""
    from rnr_interp.metrics import question_scores

    records = page.run.read_records()
    if records.empty:
        return None
    probes = records.loc[records["probe"] != DEPLOYED, "probe"]
    if probes.empty:
        return None
    wanted = [summary.probe if isinstance(summary, AuditSummary) else None, (page.run.config.get("probe") or {}).get("name"), "temperature"]
    probe = next((p for p in wanted if p in set(probes)), probes.mode().iloc[0])
    try:
        scores = question_scores(records, probe)
    except ValueError as err:
        page.section("Questions", note=f"The records do not score as one audit ({err}); no drill-down.")
        return None
    questions, why = reload_questions(page.run.config)
    by_q = {qid: rows for qid, rows in records.groupby("question_id", sort=False)}
    order = scores.assign(category=[_category(d, c) for d, c in zip(scores["d"], scores["c"])])
    # Gap questions first, and within a category the most often right first.
    order = order.assign(rank=order["category"].map(CATEGORY_ORDER.index)).sort_values(["rank", "c"], ascending=[True, False], kind="stable")
    shown = order.head(MAX_QUESTIONS)
    head = ["question", "gold", "deployed answer", f"correct of K ({probe})", "category", "samples"]
    rows = [_question_row(qid, row, by_q[qid], probe, questions) for qid, row in shown.iterrows()]
    if (best := _best_routes(page.run)) is not None:  # a route run: the routes that reach what greedy misses
        head.append("best routes (fewest edits)")
        rows = [(*r, best.get(qid, "")) for r, qid in zip(rows, shown.index)]
    counts = order["category"].value_counts()
    # "category: count" joined by " · ": the category names hold commas themselves.
    notes = [f"{len(order)} questions (" + " · ".join(f"{c}: {counts.get(c, 0)}" for c in CATEGORY_ORDER) + ")"]
    if len(order) > len(shown):
        notes.append(f"the first {len(shown)} are shown, reachable-not-realized first")
    if questions is None:
        notes.append(f"question text unavailable ({why})")
    page.section("Questions", table_html(head, rows, raw=True), note="; ".join(notes) + ".")
    return scores


def _best_routes(run: RunDir) -> dict[str, str] | None:
    """Per question, its best correct routes of a route run (table route_questions) as
    HTML lines; None for a run without that table."""
    table = read_table(run, "route_questions")
    if table is None:
        return None
    lines: dict[str, str] = {}
    for r in table.itertuples():
        change = "; ".join(p for p in (f"skips {r.skips}" if r.skips else "", f"repeats {r.repeats}" if r.repeats else "") if p)
        lines[r.question_id] = lines.get(r.question_id, "") + \
            f"<p>{escape_html(r.space)}: {escape_html(change)} ({r.edits} edits; {escape_html(r.methods)})</p>"
    return lines


CATEGORY_ORDER = ["reachable, not realized", "unreached", "realized, no sample right", "realized"]


def _category(d: bool, c: int) -> str:
    if d:
        return "realized" if c else "realized, no sample right"
    return "reachable, not realized" if c else "unreached"


def _question_row(qid: str, score: pd.Series, rows: pd.DataFrame, probe: str, questions: dict[str, Any] | None) -> tuple[str, ...]:
    deployed = rows[rows["probe"] == DEPLOYED].iloc[0]
    samples = rows[rows["probe"] == probe].sort_values("candidate")
    # A right sample first when there is one: it is what makes the question reachable.
    picks = pd.concat([samples[samples["correct"]].head(1), samples[~samples["correct"]]]).head(SAMPLES_SHOWN)
    question = f"<b>{escape_html(qid)}</b>"
    if questions is not None and (q := questions.get(qid)) is not None:
        question += f"<br>{escape_html(_clip(q.text))}"
        if q.choices:
            question += "<ol type=A>" + "".join(f"<li>{escape_html(_clip(c, 120))}</li>" for c in q.choices) + "</ol>"
    mark = lambda ok: '<span class="ok">✓</span>' if ok else '<span class="bad">✗</span>'  # noqa: E731
    answer = (f"{mark(deployed['correct'])} {escape_html(_extracted(deployed['extracted']))}"
              f"<details><summary>text</summary><pre>{escape_html(_clip(deployed['text']))}</pre></details>")
    shown = "".join(
        f"<p>{mark(r.correct)} #{r.candidate} → {escape_html(_extracted(r.extracted))}</p><pre>{escape_html(_clip(r.text))}</pre>"
        for r in picks.itertuples()
    )
    details = f"<details><summary>{len(picks)} of {len(samples)}</summary>{shown}</details>" if len(picks) else ""
    return (question, escape_html(deployed["gold"]), answer, f"{int(score['c'])} / {int(score['n'])}",
            escape_html(_category(bool(score["d"]), int(score["c"]))), details)


def reload_questions(config: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The run's questions by id, reloaded from the task in its manifest
    (`tasks.reload_task`: an lm-eval task from the questions the run stored, its config
    never rendered again). (None, reason) when the task cannot be reloaded as it was."""
    from rnr_interp.tasks import reload_task

    task = config.get("task") or {}
    try:
        loaded = reload_task(task)
    except FileNotFoundError as err:
        return None, str(err)
    except Exception as err:  # any failure to reload only costs the question text
        return None, f"reloading task {task.get('name')!r} failed: {err}"
    return {q.id: q for q in loaded.questions}, ""


def _registered_section(page: Page, entry: FigureSet) -> None:
    present = present_tables(page.run, entry)
    if not present:
        return
    try:
        figs = entry.draw(page.run, page.label)
    except Exception as err:  # a broken figure must not cost the rest of the report
        warnings.warn(f"{entry.title} figures failed on {page.run.path}: {err!r}", stacklevel=2)
        page.section(entry.title, note=f"Drawing these figures failed ({err!r}); their tables are under Other artefacts.")
        return
    if figs:
        sets = [_json_details(page.run, name) for name in entry.json if _has_json(page.run, name)]
        page.section(entry.title, "".join(sets), figures=figs)
        page.consumed.update(present)
        page.consumed.update(entry.json)


def _has_json(run: RunDir, name: str) -> bool:
    return (run.artefacts_dir / f"{name}.json").is_file()


#: how much of an artefact's JSON a page shows, in bytes
JSON_SHOWN = 20000


def _json_details(run: RunDir, name: str) -> str:
    path = run.artefacts_dir / f"{name}.json"
    with open(path, "rb") as f:  # only what the page shows is read: a foreign folder's artefact may be any size
        text = f.read(JSON_SHOWN).decode("utf-8", "replace")
    size = path.stat().st_size
    if size > JSON_SHOWN:
        text += f"… (+{size - JSON_SHOWN:,} bytes)"
    return f"<details><summary>{escape_html(name)}.json</summary><pre>{escape_html(text)}</pre></details>"


def _other_artefacts_section(page: Page) -> None:
    """Every artefact no section drew, as a table or JSON, so nothing in the folder is hidden."""
    folder = page.run.artefacts_dir
    if not folder.is_dir():
        return
    body, empty = [], []
    for path in sorted(folder.glob("*.parquet")):
        if path.stem not in page.consumed:
            df = page.run.read_table(path.stem)
            if df.empty:
                empty.append(path.stem)
                continue
            more = f" (first 50 of {len(df)} rows)" if len(df) > 50 else ""
            body.append(f"<h3>{escape_html(path.stem)}{more}</h3>" + df.head(50).to_html(classes="data", border=0))
    body += [_json_details(page.run, p.stem) for p in sorted(folder.glob("*.json")) if p.stem not in page.consumed]
    if body:
        note = f"Empty tables: {', '.join(empty)}." if empty else ""
        page.section("Other artefacts", "".join(body), note=note)


def _config_section(page: Page, summary: Summary | None) -> None:
    manifest = {k: v for k, v in page.run.manifest.items() if k != "record_columns"}
    body = f"<details><summary>manifest.json</summary><pre>{escape_html(json.dumps(manifest, indent=2))}</pre></details>"
    if summary is not None:
        body += f"<details><summary>summary.json</summary><pre>{escape_html(json.dumps(summary.to_json(), indent=2))}</pre></details>"
    page.section("Run configuration", body)


# -- the sweep index ------------------------------------------------------------------


def build_index(runs: list[tuple[RunDir, str]], root: Path) -> tuple[str, Figures]:
    """Index page of a sweep (`runs`: run, link to its page): one row per run, and the
    routing figures over every cell of the sweep when its runs hold routing tables."""
    head = ["run", "kind", "model", "task", "questions", "K", "graded", "D", "O_K", "gap", "O_K null"]
    rows, models, tasks = [], set(), set()
    for run, link in runs:
        s, cfg = summary_of(run), run.config
        # the summaries' model and task are the config's (lm.spec, task.name)
        model, task = cfg.get("model") or "", (cfg.get("task") or {}).get("name") or ""
        models.add(str(model)), tasks.add(str(task))
        # the facts several kinds share, where this one has them
        n, k, grading = (getattr(s, name, None) for name in ("n_questions", "k", "grading"))
        audit = s if isinstance(s, AuditSummary) else None
        rows.append((
            f'<a href="{escape_html(link)}">{escape_html(str(run.path.relative_to(root)))}</a>',
            escape_html(s.kind if s is not None else cfg.get("kind", "")), escape_html(model), escape_html(task),
            *(escape_html("" if v is None else v) for v in (n, k, grading)),
            *((with_interval(audit.D, audit.D_ci), with_interval(audit.O_K, audit.O_K_ci), with_interval(audit.gap, audit.gap_ci))
              if audit else ("", "", "")),
            with_interval(audit.null["O_K"], audit.null.get("O_K_ci")) if audit and audit.null is not None else "",
        ))
    page = Page(None, f"sweep of {len(runs)} runs · {', '.join(sorted(models))} · {', '.join(sorted(tasks))}")
    page.blocks.append(f"<h1>{len(runs)} runs in {escape_html(str(root))}</h1>" + table_html(head, rows, raw=True))
    tables = [[t for run, _ in runs if (t := _table(run, name)) is not None] for name in ROUTING_TABLES]
    if figs := routing_figures_of(*(pd.concat(ts, ignore_index=True) if ts else None for ts in tables), None, page.label):
        page.section("Routing across the sweep", figures=figs)
    return document(f"runs in {root.name}", "".join(page.blocks)), page.figures


# -- writing ------------------------------------------------------------------------


def write_report(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                 images: bool = False) -> Path:
    """Write the report of a run folder, or of every run in a sweep folder plus an index,
    under `out` (default: the folder itself): `report.html` per run at the run's relative
    path, `index.html` for a sweep, static images in `figures/` beside each page when
    `images`. Returns the page to open."""
    root = Path(run_dir)
    runs = load_runs(root)
    if not runs:
        raise FileNotFoundError(f"{root} holds no run folders (no manifest.json below it)")
    dest = Path(out) if out is not None else root
    sweep = not (len(runs) == 1 and runs[0].path == root)
    pages: list[tuple[RunDir, str]] = []
    for run in runs:
        rel = run.path.relative_to(root)
        back = os.path.relpath(dest / INDEX_NAME, dest / rel) if sweep else None
        # Into a run folder only as its writer (a run still being written is refused), and
        # never through a link out of the folder written to.
        lock = writer_lock(run.path) if out is None else None
        page = dest / rel / REPORT_NAME
        if not page.parent.resolve().is_relative_to(dest.resolve()):
            raise RunFolderError(f"{page.parent} resolves to {page.parent.resolve()}, outside {dest}; no report is written there")
        write_page(page, *build_page(run, back), images=images)
        del lock
        pages.append((run, (rel / REPORT_NAME).as_posix()))
    if not sweep:
        return dest / REPORT_NAME
    return write_page(dest / INDEX_NAME, *build_index(pages, root), images=images)


def write_page(path: Path, text: str, figures: Figures, images: bool) -> Path:
    """Write a page, with its figures as images in figures/ beside it when asked."""
    if images and figures:
        from rnr_interp.report.export import export_figures

        written = export_figures(figures, path.parent / FIGURES_DIR)
        text = text.replace("</body>", _images_note(written, path.parent) + "</body>")
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, text)


def _images_note(paths: list[Path], folder: Path) -> str:
    links = " ".join(f'<a href="{escape_html(p.relative_to(folder).as_posix())}">{escape_html(p.name)}</a>' for p in paths)
    return f"<section><h2>Static images</h2><p>{links}</p></section>"


# -- HTML helpers ---------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}td,th{border-bottom:1px solid #eee;padding:.25rem .6rem;text-align:left;vertical-align:top}
th{background:#f6f6f6}pre{white-space:pre-wrap;background:#f8f8f8;padding:.3rem;margin:.2rem 0;font-size:.8rem;max-width:40rem}
.note,.facts{color:#555;font-size:.9rem}.warning{color:#d62728;font-weight:bold}.ok{color:#2ca02c;font-weight:bold}.bad{color:#d62728;font-weight:bold}
figure{margin:1rem 0}details summary{cursor:pointer;color:#1f77b4}ol{margin:.2rem 0}
"""


def document(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape_html(title)}</title>'
            f"<style>{_CSS}</style></head><body>{body}</body></html>")


def _header(run: RunDir, summary: Summary | None, back_link: str | None) -> str:
    kind = summary.kind if summary is not None else run.config.get("kind") or "run"
    back = f'<p><a href="{escape_html(back_link)}">← all runs</a></p>' if back_link else ""
    label = run_label(run.config, summary)
    return (f"{back}<h1>{escape_html(label)}</h1><p class=\"facts\">{escape_html(kind)} run · {escape_html(str(run.path))} · "
            f"created {escape_html(run.manifest.get('created', '?'))}</p>")


def _clip(text: str, n: int = TEXT_CHARS) -> str:
    text = str(text)
    return text if len(text) <= n else text[:n] + f"… (+{len(text) - n} chars)"


def _extracted(value: Any) -> str:
    return "(no answer parsed)" if value is None or (isinstance(value, float) and value != value) else str(value)


def _table(run: RunDir, name: str) -> pd.DataFrame | None:
    """A named table with rows, or None (absent or empty: nothing to draw)."""
    df = read_table(run, name)
    return df if df is not None and len(df) else None

