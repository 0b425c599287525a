"""Figures of the failure-localisation analyses (plotly; each function returns a Figure).

Inputs are the run-folder tables: `repair` (layer, component, repair_rate, damage_rate,
n_failure, n_panel), `steering` (alpha, direction, rate, n), `units` (k, selection,
recovered_fraction). `title` names model, task and budget (set sizes); the caller
builds it. `figures(run, label)` draws every one the run folder has tables for (the
report's registry entry).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from rnr_interp.records import RunDir
from rnr_interp.report.figures import Figures, read_table

COMPONENT_ORDER = ("mlp", "attn", "layer")
COMPONENT_LABELS = {"mlp": "MLP", "attn": "attention", "layer": "whole layer"}


def _grid(table: pd.DataFrame, value: str) -> pd.DataFrame:
    """layers x components, components in a fixed order."""
    grid = table.pivot(index="layer", columns="component", values=value).sort_index()
    return grid[[c for c in COMPONENT_ORDER if c in grid.columns]]


def _sizes(table: pd.DataFrame) -> str:
    if table.empty:
        return ""
    return f" (failure set n={int(table['n_failure'].iloc[0])}, panel n={int(table['n_panel'].iloc[0])})"


def _heatmap(table: pd.DataFrame, value: str, label: str, title: str, colorscale, zmid: float | None, zrange) -> go.Figure:
    grid = _grid(table, value)
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy().T, x=grid.index.tolist(), y=[COMPONENT_LABELS[c] for c in grid.columns],
        colorscale=colorscale, zmid=zmid, zmin=zrange[0], zmax=zrange[1], colorbar={"title": label},
        hovertemplate="layer %{x}<br>%{y}<br>" + label + " %{z:.3f}<extra></extra>",
    ))
    fig.update_layout(title=f"{label} when silenced: {title}{_sizes(table)}",
                      xaxis_title="layer", yaxis_title="silenced component")
    return fig


def repair_heatmap(table: pd.DataFrame, title: str = "") -> go.Figure:
    """Fraction of the failure set answered right with each block zero-ablated."""
    return _heatmap(table, "repair_rate", "repair rate", title, "Greens", None, (0, 1))


def damage_heatmap(table: pd.DataFrame, title: str = "") -> go.Figure:
    """Fraction of the healthy panel answered wrong with each block zero-ablated."""
    return _heatmap(table, "damage_rate", "damage rate", title, "Reds", None, (0, 1))


def selectivity_heatmap(table: pd.DataFrame, title: str = "") -> go.Figure:
    """repair - damage, diverging colours centred at zero."""
    table = table.assign(selectivity=table["repair_rate"] - table["damage_rate"])
    return _heatmap(table, "selectivity", "repair - damage", title, "RdBu", 0.0, (-1, 1))


def selectivity_plot(table: pd.DataFrame, title: str = "") -> go.Figure:
    """repair - damage per layer, one line per component (above zero: the block helps
    the failures more than it hurts the panel)."""
    fig = go.Figure()
    for c in COMPONENT_ORDER:
        sub = table[table["component"] == c].sort_values("layer")
        if sub.empty:
            continue
        fig.add_trace(go.Scatter(x=sub["layer"], y=sub["repair_rate"] - sub["damage_rate"], mode="lines+markers",
                                 name=COMPONENT_LABELS[c]))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(title=f"selectivity (repair - damage): {title}{_sizes(table)}", xaxis_title="layer",
                      yaxis_title="repair rate - damage rate", yaxis_range=[-1.05, 1.05])
    return fig


def steering_curves(table: pd.DataFrame, title: str = "") -> go.Figure:
    """Rescue rate (-alpha v on the failure set) and induction rate (+alpha v on the
    panel) against alpha."""
    names = {"rescue": "rescue (failure set, -alpha v)", "induction": "induction (panel, +alpha v)"}
    fig = go.Figure()
    for direction, sub in table.groupby("direction", sort=False):
        sub = sub.sort_values("alpha")
        n = int(sub["n"].iloc[0]) if len(sub) else 0
        fig.add_trace(go.Scatter(x=sub["alpha"], y=sub["rate"], mode="lines+markers",
                                 name=f"{names.get(str(direction), direction)}, n={n}"))
    fig.update_layout(title=f"reciprocal steering: {title}", xaxis_title="alpha (multiple of v)",
                      yaxis_title="fraction of questions flipped", yaxis_range=[-0.05, 1.05])
    return fig


def units_curve(table: pd.DataFrame, title: str = "") -> go.Figure:
    """Fraction of the whole-MLP repair recovered by silencing k units: top-k by
    directional contribution vs k random units."""
    fig = go.Figure()
    for selection, sub in table.groupby("selection", sort=False):
        sub = sub.groupby("k", as_index=False)["recovered_fraction"].mean().sort_values("k")
        fig.add_trace(go.Scatter(x=sub["k"], y=sub["recovered_fraction"], mode="lines+markers",
                                 name=f"{selection} units"))
    fig.add_hline(y=1, line_dash="dot", line_color="grey")
    fig.update_layout(title=f"repair recovered by silencing k MLP units: {title}", xaxis_title="k (units silenced)",
                      yaxis_title="fraction of the whole-MLP repair", xaxis_type="log")
    return fig


def figures(run: RunDir, label: str) -> Figures:
    """The repair, steering and units figures of the tables `run` holds with rows."""
    figs: Figures = []
    if (t := read_table(run, "repair")) is not None and len(t):
        figs += [(name, draw(t, label)) for name, draw in (
            ("selectivity_heatmap", selectivity_heatmap), ("repair_heatmap", repair_heatmap),
            ("damage_heatmap", damage_heatmap), ("selectivity", selectivity_plot))]
    if (t := read_table(run, "steering")) is not None and len(t):
        figs.append(("steering_curves", steering_curves(t, label)))
    if (t := read_table(run, "units")) is not None and len(t):
        figs.append(("units_curve", units_curve(t, label)))
    return figs
