"""A run's summary as HTML, one function per summary type (the body of a page's
Summary section), and the small HTML helpers every page shares.

Each function reads its typed summary (`records.summaries`); the registry of analyses
(`report.kinds`) names which one a kind's page uses.
"""

from __future__ import annotations

import html
from typing import Any

from rnr_interp.records import (
    AuditSummary, CohortSummary, CompareSummary, RepairSummary, RouteSummary, Summary,
)
from rnr_interp.report.text import answer_change_line, chance_blocks, interval


def audit_html(s: AuditSummary) -> str:
    """D, O_K and the gap under the headline grading (the other beside), the chance
    null, the facts of the run, its warnings and its chance baselines."""
    level = f"{s.level if s.level is not None else 0.95:.0%} {s.ci or ''} interval".strip()
    other = s.beside()
    rows: list[tuple[str, ...]] = [
        ("D, realized (deployed answer correct)", with_interval(s.D, s.D_ci)),
        (f"O_K, reachable (any of K={s.k} samples correct)", with_interval(s.O_K, s.O_K_ci)),
        ("gap O_K − D (paired)", with_interval(s.gap, s.gap_ci)),
    ]
    head = ["quantity", f"{s.headline} [{level}]"]
    if other:
        head.append(other)
        block = s.graded(other) or {}
        rows = [(*row, with_interval(block[key], block.get(f"{key}_ci"))) for row, key in zip(rows, ("D", "O_K", "gap"))]
    null = s.null
    if null is not None:
        pad = ("",) if other else ()
        rows.append((f"chance null ({null.get('method')}): O_K", with_interval(null["O_K"], null.get("O_K_ci")), *pad))
        rows.append(("gap above the null (O_K − D) − (O_K − D)_null",
                     with_interval(null["gap_above_null"], null.get("gap_above_null_ci")), *pad))
    facts = [f"{s.n_questions} questions", f"probe {s.probe}", f"K={s.k}", f"T={s.temperature}", level,
             f"graded {s.headline}", f"unparsed {s.unparsed_rate or 0:.1%} of candidates"]
    if s.unfinished_rate:
        facts.append("stopped by the token limit: " + ", ".join(f"{p} {r:.0%}" for p, r in s.unfinished_rate.items()))
    body = table_html(head, rows) + f'<p class="facts">{escape_html(" · ".join(facts))}</p>'
    if null is not None and null.get("indistinguishable"):
        body += '<p class="facts">the reachable set is indistinguishable from chance at this n</p>'
    body += "".join(f'<p class="facts">warning: {escape_html(w)}</p>' for w in s.warnings or ())
    return body + chance_section_html(s.chance)


def route_html(s: RouteSummary) -> str:
    """The route run's oracles per method, each cell's oracles and chance nulls, the
    selectors across kept cells and the excluded cells."""
    body = ""
    if s.snapshot is not None:  # `rnr route-summary` of a run in progress
        snap = s.snapshot
        line = f"snapshot of {snap.get('of')}: {snap.get('questions_done')} of {snap.get('questions_total')} questions written"
        body += f'<p class="facts">{escape_html(line)}</p>'
    oracle = [("deployed", number(s.deployed))] + [(f"oracle@K, {m}", number(v)) for m, v in s.oracle_at_k.items()]
    body += table_html(["route search", "accuracy (cells kept)"], oracle)
    if s.cells:
        # Per cell, excluded ones too: a collapsed cell is still something to look at.
        methods = sorted({m for c in s.cells.values() for m in c.get("oracle_at_k", {})})
        rows = [(cell, "excluded (format collapse)" if c.get("excluded") else "kept", number(c.get("unparsed_rate")),
                 *(number(c.get("oracle_at_k", {}).get(m)) for m in methods)) for cell, c in s.cells.items()]
        body += table_html(["cell", "status", "unparsed", *(f"oracle@K {m}" for m in methods)], rows)
        nulls = [(cell, m, number(c["oracle_at_k"].get(m)), number(null.get("O_K")),
                  with_interval(null["O_K_minus_null"], null.get("O_K_minus_null_ci")))
                 for cell, c in s.cells.items() for m, null in (c.get("null") or {}).items()]
        if nulls:
            body += table_html(["cell", "method", "oracle@K", "chance null", "oracle − null"], nulls)
    if s.layers:
        ranked = [(space, f"{e['action']} {e['layer']}", with_interval(e["gain"], e.get("gain_ci")), number(e.get("null_gain")),
                   "above chance" if e.get("above_chance") else "")
                  for space, per in s.layers.items() for e in per.get("ranked", [per.get("top")]) if e]
        body += table_html(["space", "layer (largest gains first)", "gain: full path wrong, a correct route takes it",
                            "chance null", ""], ranked)
    if s.selectors:
        sel = [(name, number(v.get("accuracy")), number(v.get("gap_recovery_median"))) for name, v in s.selectors.items()]
        body += table_html(["selector", "accuracy", "median gap recovery"], sel)
    if s.excluded_cells:
        body += f'<p class="facts">excluded cells: {escape_html(", ".join(map(str, s.excluded_cells)))}</p>'
    body += "".join(f'<p class="facts">warning: {escape_html(w)}</p>' for w in s.warnings or ())
    return body


def cohort_html(s: CohortSummary) -> str:
    """A failures/repair/steer/units summary: the cohort's sizes and recognition by
    readout, then (repair) the best block per component, the chance baselines, how the
    interventions moved answers and the permutation control."""
    rows = [("questions", escape_html(s.n_questions)), ("deployed accuracy", number(s.deployed_accuracy)),
            *((f"recognition, gold first ({readout})", number(v)) for readout, v in (s.recognition_accuracy or {}).items()),
            ("failure set (recognised, answered wrong)", escape_html(s.n_failure)),
            ("healthy panel (answered right)", escape_html(s.n_panel))]
    screen = getattr(s, "screen", None) or {}
    if "recognition_chance" in screen:
        lo, hi = screen["recognition_excess_ci"]
        rows.append(("recognition over chance (1 / options), 95% Wilson",
                     f"{number(screen['recognition_excess'])} [{number(lo)}, {number(hi)}] over {number(screen['recognition_chance'])}"))
    if (s.circular or {}).get("on"):
        rows.append(("circular (right under every shift), letter-locked left out", escape_html(s.circular["n_letter_locked"])))
    if (split := s.split or {}).get("stratified_by"):
        rows.append(("split stratified by", escape_html(", ".join(split["stratified_by"]))))
    body = table_html(["cohort", "value"], rows)
    if s.failure_empty_reason:
        body += f'<p class="facts">failure set empty: {escape_html(s.failure_empty_reason)}</p>'
    if (bias := s.letter_bias or {}).get("message"):
        body += f'<p class="warning">warning: {escape_html(bias["message"])} (rule: {escape_html(bias["rule"])})</p>'
    if isinstance(s, RepairSummary) and s.best is not None:
        best = [(c, *(("nothing repaired", "", "", "", "") if b is None else
                      (escape_html(b.get("layer")), number(b.get("repair_rate")), number(b.get("damage_rate")),
                       number(b.get("selectivity")), escape_html(", ".join(map(str, b.get("tied_with") or []))))))
                for c, b in s.best.items()]
        # These rates are on the selection half that chose each block (in-sample, so
        # optimistic); the held-out rates are in the controls table.
        body += table_html(["best block (chosen on the selection half)", "layer", "repair, selection half",
                            "damage, selection half", "selectivity, selection half", "tied with"], best)
        if s.choice_rule:
            body += f'<p class="facts">choice rule: {escape_html(s.choice_rule)}</p>'
    body += chance_section_html(s.chance)
    if s.answer_changes:
        body += "".join(f'<p class="facts">{escape_html(answer_change_line(p, c))}</p>' for p, c in s.answer_changes.items())
    if s.permutation_control is not None:
        body += permutation_html(s.permutation_control)
    return body


def compare_html(s: CompareSummary) -> str:
    """A checkpoint comparison's summary on its page: the two runs' chance baselines
    (its numbers are drawn by the compare figures)."""
    return chance_section_html(s.chance)


def no_html(s: Summary) -> str:
    """A kind whose summary is all in its figures and tables."""
    return ""


def chance_section_html(chance: Any) -> str:
    """Every chance baseline a summary carries (one run's, or base and trained)."""
    return "".join(chance_html(block, label) for label, block in chance_blocks(chance).items())


def chance_html(chance: dict[str, Any], label: str = "") -> str:
    """A multiple-choice summary's chance baselines (metrics.chance_baselines) as a table,
    the deployed answer counts, and the dominant-option warning: on every MC page."""
    k = chance.get("k")
    prefix = f"{label}: " if label else ""
    rows = [(f"{prefix}guessing, {how}", number(chance[key]["D"]), number(chance[key].get("O_K")))
            for how, key in (("uniform over each question's options", "uniform"),
                             ("like the model's deployed answers", "deployed_distribution"))]
    counts = ", ".join(f"{o} {n}" for o, n in chance["deployed_counts"].items() if n)
    html = table_html(["chance baseline", "D", f"O_K (K={k})" if k else "O_K (no samples)"], rows)
    html += f'<p class="facts">{escape_html(prefix)}deployed answers: {escape_html(counts)}</p>'
    if chance.get("warning"):
        html += f'<p class="warning">{escape_html(prefix)}warning: {escape_html(chance["warning"])}</p>'
    return html


def permutation_html(control: dict[str, Any]) -> str:
    """The letter-permutation control (`readings.permutation_summary`): a table of each
    intervention's repair rate unrotated and rotated and where its repairs went under
    rotation, with the rotation and its reading stated."""
    if "skipped" in control:
        return f'<p class="facts">permutation control: none ({escape_html(control["skipped"])})</p>'

    def rate(p: dict[str, Any]) -> str:
        return f"{p['k']} of {p['n']}: " + (with_interval(p["rate"], p["ci"]) if p["n"] else "—")

    rows = [("rotated, no intervention", rate(control["baseline"]), "", "", "", "")]
    rows += [(probe, rate(c["repair"]), rate(c["unrotated_repair"]), str(c["repairs"]["follow_content"]),
              str(c["repairs"]["follow_position"]), str(c["repairs"]["other"])) for probe, c in control["probes"].items()]
    head = ["permutation control (held-out failures)", "right, options rotated [95% Wilson]", "repaired unrotated",
            "of those: rotated gold (content)", "old gold letter (position)", "other / none"]
    changes = "".join(f'<p class="facts">{escape_html(answer_change_line(f"{p}, rotated answers vs rotated deployed", c["answer_changes"]))}</p>'
                      for p, c in control["probes"].items())
    return (f'<p class="facts">permutation control: {escape_html(control["rotation"])}</p>' + table_html(head, rows) + changes
            + f'<p class="facts">reading: {escape_html(control["reading"])}</p>')


# -- HTML helpers ---------------------------------------------------------------------


def table_html(head: list[str], rows: list[tuple[str, ...]], raw: bool = False) -> str:
    cell = (lambda v: str(v)) if raw else escape_html
    return ("<table><tr>" + "".join(f"<th>{escape_html(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows) + "</table>")


def escape_html(value: Any) -> str:
    return html.escape(str(value))


def number(value: Any) -> str:
    """A number at three decimals (NaN: undefined, e.g. recovery of a zero gap), else the value escaped."""
    if isinstance(value, (int, float)):
        return "— (undefined)" if value != value else f"{value:.3f}"
    return escape_html(value if value is not None else "—")


def with_interval(value: float, ci: Any) -> str:
    return f"{value:.3f} {interval(ci)}".rstrip()
