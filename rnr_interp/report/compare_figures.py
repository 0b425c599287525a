"""Figures of a checkpoint audit (kind "compare"): where the gains came from, how D and
O_K moved per (base, trained) pair, and realization by the base model's propensity."""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.graph_objects as go

from rnr_interp.records import CompareSummary, RunDir
from rnr_interp.report.figures import Figures


def gained_lost_figure(transitions: pd.DataFrame) -> go.Figure:
    """Gained and lost questions (realized transitions), each bar split by whether the
    base model could already reach the question."""
    fig = go.Figure()
    kinds = ["gained", "lost"]
    for reachable, name in ((True, "base reachable"), (False, "base unreachable")):
        part = transitions[transitions["base_reachable"] == reachable]
        fig.add_bar(name=name, x=kinds, y=[int((part["realized"] == k).sum()) for k in kinds])
    fig.update_layout(barmode="stack", title="Realized transitions by base reachability",
                      xaxis_title="realized transition", yaxis_title="questions")
    return fig


def change_figure(pairs: Sequence[tuple[str, CompareSummary]]) -> go.Figure:
    """Change in D and in O_K (trained minus base) with paired intervals, one group per
    (label, compare summary) pair."""
    fig = go.Figure()
    labels = [label for label, _ in pairs]
    for metric in ("D", "O_K"):
        stats = [s.stats[metric] for _, s in pairs]
        fig.add_bar(
            name=f"change in {metric}", x=labels, y=[m["change"] for m in stats],
            error_y=dict(type="data", symmetric=False,
                         array=[m["change_ci"][1] - m["change"] for m in stats],
                         arrayminus=[m["change"] - m["change_ci"][0] for m in stats]),
        )
    fig.update_layout(barmode="group", title="Realized (D) and reachable (O_K) change per checkpoint",
                      yaxis_title="trained - base")
    return fig


def propensity_figure(pairs: Sequence[tuple[str, pd.DataFrame]]) -> go.Figure:
    """The trained model's realization rate per bin of the base hit rate c/n, among
    base-reachable, unrealized questions; bar text is the bin size."""
    fig = go.Figure()
    for label, table in pairs:
        fig.add_bar(name=label, x=list(table["bin"]), y=list(table["realized_rate"]),
                    text=[f"n={n}" for n in table["n"]], textposition="outside")
    fig.update_layout(barmode="group", title="Realization of base-reachable questions by base propensity",
                      xaxis_title="base hit rate c/n", yaxis_title="trained realization rate", yaxis_range=[0, 1.1])
    return fig


def figures(run: RunDir, label: str = "trained") -> Figures:
    """All three figures of one compare run folder (the report's registry entry)."""
    summary = run.read_summary()
    return [
        ("gained_lost", gained_lost_figure(run.read_table("transitions"))),
        ("change", change_figure([(label, summary)])),
        ("propensity", propensity_figure([(label, run.read_table("propensity"))])),
    ]
