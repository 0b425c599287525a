"""The figure of the reproduction's index page that no single run draws: the
plain-sampling curves of every task on one axis (oracle pass@k and the majority vote
at each k). It takes plain values read from the audit summaries (the page gathers
them); conventions as in `figures`.
"""

from __future__ import annotations

from typing import Any, Sequence

import plotly.graph_objects as go

from rnr_interp.report.figures import log_budget_axis, titled


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
    log_budget_axis(fig, ks or [1], "k, temperature samples per question (log scale)")
    fig.update_yaxes(title="accuracy (fraction of questions)", range=[0, 1.02])
    return titled(fig, "Reachable (oracle) vs deployable (vote) accuracy over k, per task", label)
