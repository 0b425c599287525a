"""One self-contained HTML page per run folder (and an index page for a sweep).

A page shows what the run folder holds and nothing else: the audit table and pass@k
(summary.json), the per-question drill-down (records), one section per figure set of
`registry.REGISTRY` whose tables the run holds (routing; repair, steering and units;
checkpoint comparison), any other artefact as a table, and the run's configuration. plotly.js is inlined once per page, so the page
opens offline; it loads nothing from the network.
"""

from __future__ import annotations

import html
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rnr_interp.report.text import answer_change_line, chance_blocks, interval
from rnr_interp.records import DEPLOYED, RunDir, RunFolderError, load_runs, write_text_atomic, writer_lock
from rnr_interp.report.figures import ROUTING_TABLES, Figures, audit_figures, read_table, routing_figures_of, run_label, summary_of
from rnr_interp.report.registry import REGISTRY, FigureSet, present_tables

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
    for entry in REGISTRY:
        _registered_section(page, entry)
    _other_artefacts_section(page)
    _config_section(page, summary)
    return document(f"{page.label} — {run.path.name}", _header(run, summary, back_link) + "".join(page.blocks)), page.figures


def _summary_section(page: Page, s: dict[str, Any]) -> None:
    if not s:
        page.section("Summary", note="No summary.json yet: the run has not finished.")
        return
    rows: list[tuple[str, str]] = []
    if "D" in s and "O_K" in s:
        level = f"{s.get('level', 0.95):.0%} {s.get('ci', '')} interval".strip()
        grading = s.get("grading", "flexible")
        other = next((g for g in ("strict", "flexible") if g != grading and isinstance(s.get(g), dict)), None)
        rows += [
            ("D, realized (deployed answer correct)", _ci(s["D"], s.get("D_ci"))),
            (f"O_K, reachable (any of K={s.get('k')} samples correct)", _ci(s["O_K"], s.get("O_K_ci"))),
            ("gap O_K − D (paired)", _ci(s["gap"], s.get("gap_ci"))),
        ]
        head = ["quantity", f"{grading} [{level}]"]
        if other:
            head.append(other)
            rows = [(*row, _ci(s[other][key], s[other].get(f"{key}_ci"))) for row, key in zip(rows, ("D", "O_K", "gap"))]
        if isinstance(null := s.get("null"), dict):
            rows.append((f"chance null ({null.get('method')}): O_K", _ci(null["O_K"], null.get("O_K_ci")), *([""] if other else [])))
            rows.append(("gap above the null (O_K − D) − (O_K − D)_null", _ci(null["gap_above_null"], null.get("gap_above_null_ci")),
                         *([""] if other else [])))
        facts = [f"{s.get('n_questions')} questions", f"probe {s.get('probe')}", f"K={s.get('k')}",
                 f"T={s.get('temperature')}", level, f"graded {grading}", f"unparsed {s.get('unparsed_rate', 0):.1%} of candidates"]
        if isinstance(s.get("unfinished_rate"), dict):
            facts.append("stopped by the token limit: " + ", ".join(f"{p} {r:.0%}" for p, r in s["unfinished_rate"].items()))
        body = table_html(head, rows) + f'<p class="facts">{escape_html(" · ".join(facts))}</p>'
        if isinstance(null, dict) and null.get("indistinguishable"):
            body += '<p class="facts">the reachable set is indistinguishable from chance at this n</p>'
        body += "".join(f'<p class="facts">warning: {escape_html(w)}</p>' for w in s.get("warnings") or ())
    else:
        body = ""
    body += _localisation_html(s)
    if isinstance(snap := s.get("snapshot"), dict):  # `rnr route-summary` of a run in progress
        line = f"snapshot of {snap.get('of')}: {snap.get('questions_done')} of {snap.get('questions_total')} questions written"
        body += f'<p class="facts">{escape_html(line)}</p>'
    if isinstance(s.get("oracle_at_k"), dict):
        oracle = [("deployed", _num(s.get("deployed")))] + [(f"oracle@K, {m}", _num(v)) for m, v in s["oracle_at_k"].items()]
        body += table_html(["route search", "accuracy (cells kept)"], oracle)
    if isinstance(s.get("cells"), dict) and s["cells"]:
        # Per cell, excluded ones too: a collapsed cell is still something to look at.
        methods = sorted({m for c in s["cells"].values() for m in c.get("oracle_at_k", {})})
        rows = [(cell, "excluded (format collapse)" if c.get("excluded") else "kept", _num(c.get("unparsed_rate")),
                 *(_num(c.get("oracle_at_k", {}).get(m)) for m in methods)) for cell, c in s["cells"].items()]
        body += table_html(["cell", "status", "unparsed", *(f"oracle@K {m}" for m in methods)], rows)
        nulls = [(cell, m, _num(c["oracle_at_k"].get(m)), _num(null.get("O_K")),
                  _ci(null["O_K_minus_null"], null.get("O_K_minus_null_ci")))
                 for cell, c in s["cells"].items() for m, null in (c.get("null") or {}).items()]
        if nulls:
            body += table_html(["cell", "method", "oracle@K", "chance null", "oracle − null"], nulls)
    if isinstance(s.get("layers"), dict) and s["layers"]:
        ranked = [(space, f"{e['action']} {e['layer']}", _ci(e["gain"], e.get("gain_ci")), _num(e.get("null_gain")),
                   "above chance" if e.get("above_chance") else "")
                  for space, per in s["layers"].items() for e in per.get("ranked", [per.get("top")]) if e]
        body += table_html(["space", "layer (largest gains first)", "gain: full path wrong, a correct route takes it",
                            "chance null", ""], ranked)
    if isinstance(s.get("selectors"), dict) and s["selectors"]:
        sel = [(name, _num(v.get("accuracy")), _num(v.get("gap_recovery_median"))) for name, v in s["selectors"].items()]
        body += table_html(["selector", "accuracy", "median gap recovery"], sel)
    if s.get("excluded_cells"):
        body += f'<p class="facts">excluded cells: {escape_html(", ".join(map(str, s["excluded_cells"])))}</p>'
    for label, block in chance_blocks(s).items():
        body += chance_html(block, label)
    if s.get("answer_changes"):
        body += "".join(f'<p class="facts">{escape_html(answer_change_line(p, c))}</p>' for p, c in s["answer_changes"].items())
    if isinstance(s.get("permutation_control"), dict):
        body += permutation_html(s["permutation_control"])
    if body:
        page.section(f"Summary ({s.get('kind', page.run.config.get('kind', 'run'))})", body)


def _localisation_html(s: dict[str, Any]) -> str:
    """A failures/repair/steer/units summary's opening: the cohort's sizes and
    recognition by readout, then (repair) the best block per component."""
    if "n_failure" not in s:
        return ""
    rows = [("questions", escape_html(s.get("n_questions"))), ("deployed accuracy", _num(s.get("deployed_accuracy"))),
            *((f"recognition, gold first ({readout})", _num(v)) for readout, v in (s.get("recognition_accuracy") or {}).items()),
            ("failure set (recognised, answered wrong)", escape_html(s.get("n_failure"))),
            ("healthy panel (answered right)", escape_html(s.get("n_panel")))]
    screen = s.get("screen") or {}
    if "recognition_chance" in screen:
        lo, hi = screen["recognition_excess_ci"]
        rows.append(("recognition over chance (1 / options), 95% Wilson",
                     f"{_num(screen['recognition_excess'])} [{_num(lo)}, {_num(hi)}] over {_num(screen['recognition_chance'])}"))
    if (s.get("circular") or {}).get("on"):
        rows.append(("circular (right under every shift), letter-locked left out", escape_html(s["circular"]["n_letter_locked"])))
    if (split := s.get("split") or {}).get("stratified_by"):
        rows.append(("split stratified by", escape_html(", ".join(split["stratified_by"]))))
    html = table_html(["cohort", "value"], rows)
    if s.get("failure_empty_reason"):
        html += f'<p class="facts">failure set empty: {escape_html(s["failure_empty_reason"])}</p>'
    if (bias := s.get("letter_bias") or {}).get("message"):
        html += f'<p class="warning">warning: {escape_html(bias["message"])} (rule: {escape_html(bias["rule"])})</p>'
    if isinstance(s.get("best"), dict):
        best = [(c, *(("nothing repaired", "", "", "") if b is None else
                      (escape_html(b.get("layer")), _num(b.get("repair_rate")), _num(b.get("damage_rate")), _num(b.get("selectivity")))))
                for c, b in s["best"].items()]
        # These rates are on the selection half that chose each block (in-sample, so
        # optimistic); the held-out rates are in the controls table.
        html += table_html(["best block (chosen on the selection half)", "layer", "repair, selection half",
                             "damage, selection half", "selectivity, selection half"], best)
    return html


def chance_html(chance: dict[str, Any], label: str = "") -> str:
    """A multiple-choice summary's chance baselines (metrics.chance_baselines) as a table,
    the deployed answer counts, and the dominant-option warning: on every MC page."""
    k = chance.get("k")
    prefix = f"{label}: " if label else ""
    rows = [(f"{prefix}guessing, {how}", _num(chance[key]["D"]), _num(chance[key].get("O_K")))
            for how, key in (("uniform over each question's options", "uniform"),
                             ("like the model's deployed answers", "deployed_distribution"))]
    counts = ", ".join(f"{o} {n}" for o, n in chance["deployed_counts"].items() if n)
    html = table_html(["chance baseline", "D", f"O_K (K={k})" if k else "O_K (no samples)"], rows)
    html += f'<p class="facts">{escape_html(prefix)}deployed answers: {escape_html(counts)}</p>'
    if chance.get("warning"):
        html += f'<p class="warning">{escape_html(prefix)}warning: {escape_html(chance["warning"])}</p>'
    return html


def permutation_html(control: dict[str, Any]) -> str:
    """The letter-permutation control (`cohort.permutation_summary`): a table of each
    intervention's repair rate unrotated and rotated and where its repairs went under
    rotation, with the rotation and its reading stated."""
    if "skipped" in control:
        return f'<p class="facts">permutation control: none ({escape_html(control["skipped"])})</p>'

    def rate(p: dict[str, Any]) -> str:
        return f"{p['k']} of {p['n']}: " + (_ci(p["rate"], p["ci"]) if p["n"] else "—")

    rows = [("rotated, no intervention", rate(control["baseline"]), "", "", "", "")]
    rows += [(probe, rate(c["repair"]), rate(c["unrotated_repair"]), str(c["repairs"]["follow_content"]),
              str(c["repairs"]["follow_position"]), str(c["repairs"]["other"])) for probe, c in control["probes"].items()]
    head = ["permutation control (held-out failures)", "right, options rotated [95% Wilson]", "repaired unrotated",
            "of those: rotated gold (content)", "old gold letter (position)", "other / none"]
    changes = "".join(f'<p class="facts">{escape_html(answer_change_line(f"{p}, rotated answers vs rotated deployed", c["answer_changes"]))}</p>'
                      for p, c in control["probes"].items())
    return (f'<p class="facts">permutation control: {escape_html(control["rotation"])}</p>' + table_html(head, rows) + changes
            + f'<p class="facts">reading: {escape_html(control["reading"])}</p>')


def _drilldown_section(page: Page, summary: dict[str, Any]) -> pd.DataFrame | None:
    """Per-question table from the records; returns the question scores (None without
    records, or when they cannot be scored as one audit)."""
    from rnr_interp.metrics import question_scores

    records = page.run.read_records()
    if records.empty:
        return None
    probes = records.loc[records["probe"] != DEPLOYED, "probe"]
    if probes.empty:
        return None
    wanted = [summary.get("probe"), (page.run.config.get("probe") or {}).get("name"), "temperature"]
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
    answer = f"{mark(deployed['correct'])} {escape_html(_extracted(deployed['extracted']))}<details><summary>text</summary><pre>{escape_html(_clip(deployed['text']))}</pre></details>"
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


def _json_details(run: RunDir, name: str) -> str:
    text = (run.artefacts_dir / f"{name}.json").read_text()
    return f"<details><summary>{escape_html(name)}.json</summary><pre>{escape_html(_clip(text, 20000))}</pre></details>"


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


def _config_section(page: Page, summary: dict[str, Any]) -> None:
    manifest = {k: v for k, v in page.run.manifest.items() if k != "record_columns"}
    body = f"<details><summary>manifest.json</summary><pre>{escape_html(json.dumps(manifest, indent=2))}</pre></details>"
    if summary:
        body += f"<details><summary>summary.json</summary><pre>{escape_html(json.dumps(summary, indent=2))}</pre></details>"
    page.section("Run configuration", body)


# -- the sweep index ------------------------------------------------------------------


def build_index(runs: list[tuple[RunDir, str]], root: Path) -> tuple[str, Figures]:
    """Index page of a sweep (`runs`: run, link to its page): one row per run, and the
    routing figures over every cell of the sweep when its runs hold routing tables."""
    head = ["run", "kind", "model", "task", "questions", "K", "graded", "D", "O_K", "gap", "O_K null"]
    rows, models, tasks = [], set(), set()
    for run, link in runs:
        s, cfg = summary_of(run), run.config
        model, task = s.get("model") or cfg.get("model") or "", s.get("task") or (cfg.get("task") or {}).get("name") or ""
        models.add(str(model)), tasks.add(str(task))
        rows.append((
            f'<a href="{escape_html(link)}">{escape_html(str(run.path.relative_to(root)))}</a>', escape_html(s.get("kind", cfg.get("kind", ""))),
            escape_html(model), escape_html(task), escape_html(s.get("n_questions", "")), escape_html(s.get("k", "")), escape_html(s.get("grading", "")),
            *(_ci(s[key], s.get(f"{key}_ci")) if key in s else "" for key in ("D", "O_K", "gap")),
            _ci(s["null"]["O_K"], s["null"].get("O_K_ci")) if isinstance(s.get("null"), dict) else "",
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


def _header(run: RunDir, summary: dict[str, Any], back_link: str | None) -> str:
    kind = summary.get("kind") or run.config.get("kind") or "run"
    back = f'<p><a href="{escape_html(back_link)}">← all runs</a></p>' if back_link else ""
    label = run_label(run.config, summary)
    return (f"{back}<h1>{escape_html(label)}</h1><p class=\"facts\">{escape_html(kind)} run · {escape_html(str(run.path))} · "
            f"created {escape_html(run.manifest.get('created', '?'))}</p>")


def table_html(head: list[str], rows: list[tuple[str, ...]], raw: bool = False) -> str:
    cell = (lambda v: str(v)) if raw else escape_html
    return ("<table><tr>" + "".join(f"<th>{escape_html(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows) + "</table>")


def escape_html(value: Any) -> str:
    return html.escape(str(value))


def _clip(text: str, n: int = TEXT_CHARS) -> str:
    text = str(text)
    return text if len(text) <= n else text[:n] + f"… (+{len(text) - n} chars)"


def _extracted(value: Any) -> str:
    return "(no answer parsed)" if value is None or (isinstance(value, float) and value != value) else str(value)


def _num(value: Any) -> str:
    if isinstance(value, (int, float)):
        return "— (undefined)" if value != value else f"{value:.3f}"  # NaN: e.g. recovery of a zero gap
    return escape_html(value if value is not None else "—")


def _ci(value: float, ci: Any) -> str:
    return f"{value:.3f} {interval(ci)}".rstrip()


def _table(run: RunDir, name: str) -> pd.DataFrame | None:
    """A named table with rows, or None (absent or empty: nothing to draw)."""
    df = read_table(run, name)
    return df if df is not None and len(df) else None

