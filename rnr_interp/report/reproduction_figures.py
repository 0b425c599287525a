"""Figures of the reproduction's index page that no single run draws: the plain-sampling
curves of every task on one axis, the selection gap against temperature, and the
cell-level failure screen (recognition vs generation per cell). Each takes plain
values read from run summaries (the page gathers them); conventions as in `figures`.
"""

from __future__ import annotations

from typing import Any, Sequence

import plotly.graph_objects as go

from rnr_interp.report.figures import _log_budget_axis, _titled


def task_curves_figure(curves: Sequence[dict[str, Any]], label: str) -> go.Figure:
    """pass@k (the oracle over k temperature samples) per task, solid, and the
    answer-blind majority vote at each k, dotted, where the audit recorded it; each
    curve ends at its task's K. `curves`: {task, k, pass, vote (or None), D}."""
    fig = go.Figure()
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
    ks: list[int] = []
    for i, c in enumerate(curves):
        colour = palette[i % len(palette)]
        ks += list(c["k"])
        fig.add_scatter(x=c["k"], y=c["pass"], mode="lines", name=f"{c['task']}: oracle pass@k", line={"color": colour})
        if c.get("vote"):
            fig.add_scatter(x=c["k"], y=c["vote"], mode="lines", name=f"{c['task']}: majority vote@k",
                            line={"color": colour, "dash": "dot"})
    _log_budget_axis(fig, ks or [1], "k, temperature samples per question (log scale)")
    fig.update_yaxes(title="accuracy (fraction of questions)", range=[0, 1.02])
    return _titled(fig, "Reachable (oracle) vs deployable (vote) accuracy over k, per task", label)


def temperature_gap_figure(points: Sequence[dict[str, Any]], label: str) -> go.Figure:
    """Against sampling temperature: the oracle - greedy gap O_K - D and, where the
    audit recorded the vote, the selection gap O_K - majority, each with its paired
    95% interval. `points`: {temperature, gap, gap_ci, selection_gap?, selection_gap_ci?}."""
    points = sorted(points, key=lambda p: p["temperature"])
    fig = go.Figure()
    series = (("gap", "oracle − greedy (O_K − D)", "#1f77b4"), ("selection_gap", "oracle − majority vote", "#d62728"))
    for key, name, colour in series:
        have = [p for p in points if p.get(key) is not None]
        if not have:
            continue
        fig.add_scatter(
            x=[p["temperature"] for p in have], y=[p[key] for p in have], mode="lines+markers", name=name,
            line={"color": colour},
            error_y={"type": "data", "symmetric": False, "array": [p[f"{key}_ci"][1] - p[key] for p in have],
                     "arrayminus": [p[key] - p[f"{key}_ci"][0] for p in have]})
    fig.add_hline(y=0, line={"color": "black", "width": 1})
    fig.update_xaxes(title="sampling temperature T")
    fig.update_yaxes(title="gap (fraction of questions)")
    return _titled(fig, "Selection gap vs temperature", label)


def screen_figure(cells: Sequence[dict[str, Any]], criterion: str, label: str) -> go.Figure:
    """Per cell (model x task): generation score (deployed answer right) against
    recognition score (gold option ranked first). Cells above y = x recognise more than
    they generate; the ones that pass the screen are filled. `cells`: {cell,
    generation, recognition, passes}."""
    fig = go.Figure()
    for passes, name, symbol in ((True, "passes the screen", "circle"), (False, "does not pass", "circle-open")):
        have = [c for c in cells if c["passes"] == passes]
        if have:
            fig.add_scatter(x=[c["generation"] for c in have], y=[c["recognition"] for c in have], mode="markers+text",
                            text=[c["cell"] for c in have], textposition="top center", name=name,
                            marker={"size": 11, "symbol": symbol, "color": "#d62728" if passes else "#7f7f7f"})
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="recognition = generation",
                    line={"dash": "dash", "color": "black", "width": 1})
    fig.update_xaxes(title="generation score (deployed answer right, fraction)", range=[-0.02, 1.02])
    fig.update_yaxes(title="recognition score (gold option first, fraction)", range=[-0.02, 1.02])
    return _titled(fig, f"Failure screen per cell: {criterion}", label)
