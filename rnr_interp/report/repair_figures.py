"""Figures of the failure-localisation analyses (plotly; each function returns a Figure).

Inputs are the run-folder tables: `repair` (layer, component, repair_rate, damage_rate,
n_failure, n_panel, and the held-out columns), `controls` (the chosen block and its
same-layer controls, held out), `steering` (alpha, direction, rate, lo, hi, n), `units`
(k, selection, draw, recovered_fraction). `title` names model, task and budget (set sizes); the caller
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


def controls_figure(controls: pd.DataFrame, title: str = "") -> go.Figure:
    """The paper's control table for one case: the chosen MLP block, attention and the
    whole layer at that same layer, then each component's own best, with held-out
    repair and damage (95% Wilson intervals, each on its own denominator)."""
    def cell(rate, lo, hi, n):
        return "n/a" if n == 0 else f"{rate:.1%} [{lo:.1%}, {hi:.1%}] of {n}"

    rows = list(controls.itertuples())
    fig = go.Figure(go.Table(
        header={"values": ["silenced block", "repair (held-out failures)", "damage (held-out panel)"]},
        cells={"values": [[r.block for r in rows],
                          [cell(r.repair_heldout, r.repair_lo, r.repair_hi, r.n_failure_heldout) for r in rows],
                          [cell(r.damage_heldout, r.damage_lo, r.damage_hi, r.n_panel_heldout) for r in rows]]},
    ))
    fig.update_layout(title=f"chosen block and same-layer controls, held out: {title}")
    return fig


#: the x-axis label per alpha unit (`steering.ALPHA_UNITS`); runs written before the
#: unit existed steered in raw multiples of v
ALPHA_AXIS = {"rms": "alpha (multiples of the residual stream's RMS norm, along unit v)",
              "raw": "alpha (raw multiples of the unnormalised v)",
              "write": "alpha (multiples of the RMS norm of the block's own write, along unit v)"}


#: one colour per steering direction, so v's curve and its random control pair up
STEERING_COLOURS = {"rescue": "#1f77b4", "induction": "#d62728"}


def steering_curves(table: pd.DataFrame, title: str = "", alpha_unit: str = "raw",
                    random: pd.DataFrame | None = None, clamp: pd.DataFrame | None = None) -> go.Figure:
    """Rescue rate (-alpha v on the failure set) and induction rate (+alpha v on the
    panel) against alpha, in `alpha_unit`; dashed beside them, the same along a random
    direction of the same length (`random`: the run's ``steering_random`` table); dotted,
    the induced answers that are ones the failure set gave (``as_failure_rate``);
    horizontal lines, the clamp control's rescue and damage (`clamp`: the run's
    ``steering_clamp`` table), which has no alpha."""
    names = {"rescue": "rescue (failure set, -alpha v)", "induction": "induction (panel, +alpha v)"}
    fig = go.Figure()
    for kind, frame in (("v", table), ("random", random)):
        if frame is None:
            continue
        for direction, sub in frame.groupby("direction", sort=False):
            sub = sub.sort_values("alpha")
            n = int(sub["n"].iloc[0]) if len(sub) else 0
            bars = ({"error_y": {"type": "data", "symmetric": False, "array": sub["hi"] - sub["rate"],
                                 "arrayminus": sub["rate"] - sub["lo"]}} if {"lo", "hi"} <= set(sub.columns) and kind == "v"
                    else {})
            name = names.get(str(direction), direction) if kind == "v" else f"{direction} along a random direction"
            line = {"color": STEERING_COLOURS.get(str(direction))} | ({"dash": "dash"} if kind == "random" else {})
            fig.add_trace(go.Scatter(x=sub["alpha"], y=sub["rate"], mode="lines+markers", name=f"{name}, n={n}",
                                     line=line, **bars))
            if "as_failure_rate" in sub.columns and sub["as_failure_rate"].notna().any():
                fig.add_trace(go.Scatter(x=sub["alpha"], y=sub["as_failure_rate"], mode="lines+markers",
                                         name=f"{name}: to an answer the failure set gave, n={n}",
                                         line=line | {"dash": "dot" if kind == "v" else "dashdot"}))
    where = {"v": "along v", "span": "within the failures' span", "random": "within a random span"}
    dashes = {"v": "dashdot", "span": "longdash", "random": "dot"}
    for r in ([] if clamp is None else clamp.to_dict("records")):
        fig.add_hline(y=r["rate"], line_dash=dashes.get(r["clamped"], "dot"),
                      line_color=STEERING_COLOURS["rescue" if r["way"] == "rescue" else "induction"],
                      annotation_text=f"write clamped {where.get(r['clamped'], r['clamped'])} (rank {int(r['rank'])}): "
                                      f"{r['way']} {r['rate']:.2f} (n={int(r['n'])})")
    fig.update_layout(title=f"reciprocal steering (95% Wilson): {title}", xaxis_title=ALPHA_AXIS.get(alpha_unit, alpha_unit),
                      yaxis_title="fraction of questions flipped", yaxis_range=[-0.05, 1.05])
    return fig


def units_curve(table: pd.DataFrame, title: str = "") -> go.Figure:
    """Fraction of the whole-MLP repair recovered by silencing k units: top-k by
    directional contribution vs k random units (the mean of the draws, the band their
    min-max)."""
    fig = go.Figure()
    for selection, sub in table.groupby("selection", sort=False):
        by_k = sub.groupby("k")["recovered_fraction"]
        mean = by_k.mean().sort_index()
        if selection == "random" and by_k.size().max() > 1:
            lo, hi = by_k.min().sort_index(), by_k.max().sort_index()
            fig.add_trace(go.Scatter(x=[*hi.index, *lo.index[::-1]], y=[*hi, *lo[::-1]], fill="toself", mode="none",
                                     opacity=0.3, name=f"random units, min-max of {by_k.size().max()} draws"))
        fig.add_trace(go.Scatter(x=mean.index, y=mean, mode="lines+markers",
                                 name="random units (mean of draws)" if selection == "random" else f"{selection} units"))
    fig.add_hline(y=1, line_dash="dot", line_color="grey")
    fig.update_layout(title=f"repair recovered by silencing k MLP units: {title}", xaxis_title="k (units silenced)",
                      yaxis_title="fraction of the whole-MLP repair", xaxis_type="log")
    return fig


def screen_scatter(table: pd.DataFrame, margin: float, title: str = "") -> go.Figure:
    """Generation score against recognition score per cell (the paper's Figure 4a):
    y = x, the criterion's region (recognition - generation >= margin, shaded; a cell
    there also needs its paired interval above 0), failure cells marked."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[margin, 1, 1, margin], y=[0, 0, 1 - margin, 0], fill="toself", mode="none",
                             fillcolor="rgba(214,39,40,0.12)", name=f"recognition - generation >= {margin:g}"))
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line={"dash": "dot", "color": "grey"}, name="y = x"))
    for failure, sub in table.groupby("failure"):
        fig.add_trace(go.Scatter(
            x=sub["recognition_score"], y=sub["generation_score"], mode="markers+text",
            text=[f"{m} / {t}" for m, t in zip(sub["model"], sub["task"])], textposition="top center",
            marker={"size": 10, "color": "#d62728" if failure else "#7f7f7f"},
            name="failure cell" if failure else "not a failure cell",
            customdata=sub[["n_questions", "difference_lo", "difference_hi"]].to_numpy(),
            hovertemplate="%{text}<br>recognition %{x:.3f}, generation %{y:.3f}<br>n=%{customdata[0]}, "
                          "difference CI [%{customdata[1]:.3f}, %{customdata[2]:.3f}]<extra></extra>"))
    fig.update_layout(title=f"failure screen per cell: {title}",
                      xaxis_title="recognition score (gold option ranked first; chance is 1 / options)",
                      yaxis_title="generation score (deployed answer right)", xaxis_range=[0, 1], yaxis_range=[0, 1])
    return fig


def figures(run: RunDir, label: str) -> Figures:
    """The repair, steering and units figures of the tables `run` holds with rows."""
    figs: Figures = []
    if (t := read_table(run, "repair")) is not None and len(t):
        figs += [(name, draw(t, label)) for name, draw in (
            ("selectivity_heatmap", selectivity_heatmap), ("repair_heatmap", repair_heatmap),
            ("damage_heatmap", damage_heatmap), ("selectivity", selectivity_plot))]
    if (t := read_table(run, "screen")) is not None and len(t):
        figs.append(("screen_scatter", screen_scatter(t, float(run.config["criterion"]["margin"]), label)))
    if (t := read_table(run, "controls")) is not None and len(t):
        figs.append(("controls", controls_figure(t, label)))
    if (t := read_table(run, "steering")) is not None and len(t):
        where = " · steered at the prompt's end" if run.config.get("steer_at") == "prompt" else ""
        figs.append(("steering_curves", steering_curves(t, label + where, str(run.config.get("alpha_unit", "raw")),
                                                         read_table(run, "steering_random"),
                                                         read_table(run, "steering_clamp"))))
    if (t := read_table(run, "units")) is not None and len(t):
        figs.append(("units_curve", units_curve(t, label)))
    return figs
