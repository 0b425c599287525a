"""Figures of a validation run (`analyses.validate`): the detection curve, the share of
organisms whose planted effect an analysis recovered against the planted strength, with
Wilson intervals; at strength 0 (the nulls) the share that stayed silent."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from rnr_interp.records import RunDir
from rnr_interp.report.figures import Figures, read_table


def detection_curve(table: pd.DataFrame, title: str = "") -> go.Figure:
    """One line per (kind, analysis): share recovered against strength."""
    fig = go.Figure()
    for (kind, analysis), sub in table.sort_values("strength").groupby(["kind", "analysis"], sort=True):
        fig.add_trace(go.Scatter(
            x=sub["strength"], y=sub["rate"], mode="lines+markers", name=f"{kind}: {analysis}",
            error_y={"type": "data", "symmetric": False, "array": sub["hi"] - sub["rate"], "arrayminus": sub["rate"] - sub["lo"]},
            customdata=sub["n"], hovertemplate="strength %{x}<br>recovered %{y:.2f} of %{customdata}<extra></extra>"))
    fig.update_layout(title=f"Detection curve (strength 0: nulls, share with no false positive): {title}",
                      xaxis_title="planted strength (a multiple of each kind's default)", yaxis_title="share recovered (95% Wilson)", yaxis_range=[0, 1.05])
    return fig


def figures(run: RunDir, label: str) -> Figures:
    """The validation figures of the tables `run` holds with rows."""
    if (t := read_table(run, "detection")) is not None and len(t):
        return [("detection_curve", detection_curve(t, label))]
    return []
