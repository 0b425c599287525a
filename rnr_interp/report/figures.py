"""Audit and routing figures, as plotly figures built from a run folder's tables.

Conventions (shared with repair_figures / compare_figures): every title ends with the
run's label (model · task · budget, see `run_label`), every axis says what it counts
and in which unit, budgets (K, search evaluations) are on a log axis, and signed
differences are centred at zero (a symmetric axis here; a diverging colour scale with
zmid=0 in heatmaps).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from rnr_interp.records import AuditSummary, CompareSummary, RouteSummary, RunDir, Summary

TEMPLATE = "plotly_white"
#: one colour per search method, stable across figures and runs
METHOD_COLOURS = {"random": "#7f7f7f", "random_matched": "#bcbd22", "mcts": "#1f77b4", "hill_climb": "#2ca02c",
                  "genetic": "#d62728", "random_matched_mcts": "#aec7e8", "random_matched_hill_climb": "#98df8a",
                  "random_matched_genetic": "#ff9896"}
FIGURE_SIZE = {"width": 820, "height": 460}
Figures = list[tuple[str, go.Figure]]


def run_label(config: dict[str, Any], summary: Summary | None) -> str:
    """'model · task (n q) · K=…, T=…': what every title of this run ends with (the
    summary's model and task are the config's; its questions and K where it has them)."""
    model = config.get("model") or "?"
    task = (config.get("task") or {}).get("name") or "?"
    n = getattr(summary, "n_questions", None) or (config.get("task") or {}).get("n_questions")
    probe = config.get("probe") or {}
    k = getattr(summary, "k", None) or probe.get("k") or config.get("k")
    budget = [f"K={k}"] if k else []
    t = summary.temperature if isinstance(summary, (AuditSummary, CompareSummary)) else probe.get("temperature")
    if isinstance(t, (int, float)):
        budget.append(f"T={t:g}")
    if (b := config.get("budget")) is not None:
        budget.append(f"budget={b}")
    parts = [str(model), f"{task} ({n} q)" if n else str(task)]
    return " · ".join(parts + ([", ".join(budget)] if budget else []))


def titled(fig: go.Figure, what: str, label: str) -> go.Figure:
    fig.update_layout(template=TEMPLATE, title={"text": f"{what}<br><sup>{label}</sup>"}, **FIGURE_SIZE,
                      margin={"t": 80})
    return fig


def log_budget_axis(fig: go.Figure, values: Iterable[float], title: str) -> None:
    """A log x axis ticked at powers of two and the largest value, as budgets are chosen."""
    top = max(values, default=1)
    ticks = sorted({2**i for i in range(int(np.log2(max(top, 1))) + 1)} | {top})
    fig.update_xaxes(type="log", title=title, tickvals=ticks, ticktext=[f"{t:g}" for t in ticks], minor={"showgrid": False})


def _hline(fig: go.Figure, y: float, text: str, where: str = "top left") -> None:
    fig.add_hline(y=y, line={"dash": "dash", "color": "black", "width": 1},
                  annotation_text=text, annotation_position=where)


# -- audit ------------------------------------------------------------------------


def pass_at_k_figure(ks: Iterable[int], passes: Iterable[float], deployed: float | None, label: str,
                     votes: dict[str, Any] | None = None, beside: tuple[str, Iterable[float]] | None = None,
                     null: float | None = None) -> go.Figure:
    """Unbiased pass@k against k (log axis), with the deployed accuracy D for reference:
    the curve's distance above D at k=K is the gap. `votes` (the summary's vote_at_k)
    adds the answer-blind votes over the same k samples, dashed: the deployable line.
    `beside` (grading, curve): the other grading's pass@k, dotted; `null`: the chance
    null's O_K at k=K."""
    ks, passes = list(ks), list(passes)
    fig = go.Figure(go.Scatter(x=ks, y=passes, mode="lines+markers", name="pass@k (temperature samples)"))
    if beside is not None:
        fig.add_scatter(x=ks, y=list(beside[1]), mode="lines", line={"dash": "dot"}, name=f"pass@k, graded {beside[0]}")
    if null is not None:
        _hline(fig, null, f"chance null O_K = {null:.3f}", "bottom right")
    for name, values in (votes or {}).items():
        if name != "k":
            fig.add_scatter(x=votes["k"], y=values, mode="lines", line={"dash": "dash"}, name=f"vote@k: {name} (answer-blind)")
    if deployed is not None:
        _hline(fig, deployed, f"deployed D = {deployed:.3f}")
    log_budget_axis(fig, ks, "k, samples per question (log scale)")
    fig.update_yaxes(title="pass@k (fraction of questions)", range=[0, 1.02])
    return titled(fig, "pass@k: reachable accuracy within k samples", label)


def hit_count_figure(scores: pd.DataFrame, label: str) -> go.Figure:
    """Questions by how many of their K samples were correct, stacked by whether the
    deployed answer was: the deployed-wrong bars right of zero are the gap."""
    k = int(scores["n"].max())
    fig = go.Figure()
    for deployed, name, colour in ((True, "deployed answer correct", "#2ca02c"), (False, "deployed answer wrong", "#d62728")):
        counts = scores.loc[scores["d"] == deployed, "c"].value_counts().reindex(range(k + 1), fill_value=0)
        fig.add_bar(x=counts.index.tolist(), y=counts.tolist(), name=name, marker_color=colour)
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title=f"correct samples out of K={k} (count)", dtick=1 if k <= 16 else None)
    fig.update_yaxes(title="questions (count)", dtick=1 if len(scores) <= 12 else None)
    return titled(fig, "Per-question sample hit counts", label)


def audit_figures(run: RunDir, scores: pd.DataFrame | None, label: str) -> Figures:
    """pass@k (from the summary) and hit counts (from the scored records), where present."""
    figs: Figures = []
    summary = summary_of(run)
    curve = (summary.pass_at_k if isinstance(summary, AuditSummary) else None) or {}
    if curve.get("k"):
        other = next((g for g in ("strict", "flexible") if g != summary.grading and curve.get(g)), None)
        null = summary.null or {}
        figs.append(("pass_at_k", pass_at_k_figure(curve["k"], curve["pass"], summary.D, label, summary.vote_at_k,
                                                   beside=(other, curve[other]) if other else None, null=null.get("O_K"))))
    if scores is not None and len(scores):
        figs.append(("hit_counts", hit_count_figure(scores, label)))
    return figs


# -- routing ----------------------------------------------------------------------


def route_curves_figure(curves: pd.DataFrame, deployed: float | None, label: str,
                        excluded: Iterable[str] = ()) -> go.Figure:
    """Accuracy against search budget (table route_curves: [cell,] method, kind, budget,
    accuracy, lo, hi): each method's oracle (solid) and the answer-blind votes over the
    random routes (dashed, the deployable line), averaged over the cells not `excluded`;
    a single cell's lines carry their bootstrap intervals. Older tables (an `oracle`
    column, no kind) draw as oracle lines."""
    if "accuracy" not in curves:
        curves = curves.rename(columns={"oracle": "accuracy"})
    if "kind" not in curves:
        curves = curves.assign(kind="oracle")
    n_cells = 1
    if "cell" in curves:
        curves = curves[~curves["cell"].isin(set(excluded))]
        n_cells = curves["cell"].nunique()
        if n_cells > 1:
            curves = curves.groupby(["kind", "method", "budget"], sort=False, as_index=False)["accuracy"].mean()
    fig = go.Figure()
    for (kind, method), rows in curves.groupby(["kind", "method"], sort=False):
        rows = rows.sort_values("budget")
        band = {"error_y": {"type": "data", "array": rows["hi"] - rows["accuracy"], "arrayminus": rows["accuracy"] - rows["lo"],
                            "thickness": 0.6, "width": 0}} if "lo" in rows else {}
        vote = kind == "vote"
        fig.add_scatter(x=rows["budget"], y=rows["accuracy"], mode="lines" if vote else "lines+markers",
                        name=f"vote: {method} (random routes, answer-blind)" if vote else f"oracle: {method}",
                        line={"color": METHOD_COLOURS.get(str(method)), "dash": "dash" if vote else "solid"}, **band)
    if deployed is not None:
        _hline(fig, deployed, f"deployed = {deployed:.3f}")
    log_budget_axis(fig, curves["budget"], "budget K, routes evaluated per question (log scale)")
    fig.update_yaxes(title="accuracy (fraction of questions)", range=[0, 1.02])
    mean = f", mean over {n_cells} cells" if n_cells > 1 else ""
    return titled(fig, f"Route-search oracle and deployable vote vs budget{mean}", label)


def cell_difference(cells: pd.DataFrame) -> pd.DataFrame:
    """Per cell and structured method: random's oracle minus the method's, over cells
    not excluded; columns cell, method, diff."""
    kept = cells[~cells["excluded"].astype(bool)] if "excluded" in cells else cells
    wide = kept.pivot_table(index="cell", columns="method", values="oracle", aggfunc="mean")
    if "random" not in wide:
        return pd.DataFrame(columns=["cell", "method", "diff"])
    diffs = [
        pd.DataFrame({"cell": wide.index, "method": method, "diff": (wide["random"] - wide[method]).to_numpy()})
        for method in wide.columns if not str(method).startswith("random")
    ]
    out = pd.concat(diffs, ignore_index=True) if diffs else pd.DataFrame(columns=["cell", "method", "diff"])
    return out.dropna(subset=["diff"])


def cell_difference_figure(cells: pd.DataFrame, label: str) -> go.Figure | None:
    """Random-minus-structured oracle per cell, each method's cells sorted (a quantile
    view, y symmetric about zero): points below zero are cells where the structured
    search reaches more. None without a random baseline or a structured method."""
    diff = cell_difference(cells)
    if diff.empty:
        return None
    n_excluded = int(cells["excluded"].astype(bool).groupby(cells["cell"]).any().sum()) if "excluded" in cells else 0
    fig = go.Figure()
    for method, rows in diff.groupby("method", sort=False):
        rows = rows.sort_values("diff")
        fig.add_scatter(x=np.arange(1, len(rows) + 1), y=rows["diff"], mode="lines+markers", name=f"random − {method}",
                        line={"color": METHOD_COLOURS.get(str(method))}, customdata=rows["cell"],
                        hovertemplate="cell %{customdata}<br>difference %{y:.3f}<extra></extra>")
    bound = 1.05 * float(max(diff["diff"].abs().max(), 0.05))
    fig.add_hline(y=0, line={"color": "black", "width": 1})
    fig.update_xaxes(title="cell rank (sorted by difference within each method)", dtick=1 if len(diff) <= 60 else None)
    fig.update_yaxes(title="oracle difference, random − structured (accuracy)", range=[-bound, bound], zeroline=False)
    note = f", {n_excluded} excluded cell{'s' * (n_excluded != 1)} left out" if n_excluded else ""
    return titled(fig, f"Random vs structured route search per cell{note}", label)


def advantage_figure(advantage: pd.DataFrame, label: str) -> go.Figure:
    """The cross-cell view (table `advantage` of `rnr route-cells`): random − structured
    oracle at matched K per clean cell, sorted within each search, with paired intervals;
    hollow markers for untested comparisons (no method of the cell beat greedy)."""
    fig = go.Figure()
    for search, rows in advantage.groupby("search", sort=False):
        rows = rows.sort_values("advantage")
        tested = rows["informative"].astype(bool) if "informative" in rows else pd.Series(True, index=rows.index)
        fig.add_scatter(x=np.arange(1, len(rows) + 1), y=rows["advantage"], mode="markers", name=f"random − {search}",
                        marker={"color": METHOD_COLOURS.get(str(search)),
                                "symbol": ["circle" if t else "circle-open" for t in tested]}, customdata=rows["cell"],
                        error_y={"type": "data", "array": rows["hi"] - rows["advantage"], "arrayminus": rows["advantage"] - rows["lo"]},
                        hovertemplate="cell %{customdata}<br>difference %{y:.3f}<extra></extra>")
    bound = 1.05 * float(max(advantage[["lo", "hi"]].abs().max().max(), 0.05))
    fig.add_hline(y=0, line={"color": "black", "width": 1})
    fig.update_xaxes(title="clean cell rank (sorted within each search)")
    fig.update_yaxes(title="oracle@K difference, random − structured (accuracy)", range=[-bound, bound], zeroline=False)
    return titled(fig, "Random vs structured route search across cells (95% paired intervals)", label)


def temperature_sweep_figure(table: pd.DataFrame, label: str) -> go.Figure:
    """Oracle − majority (the selection gap) and oracle − greedy against temperature."""
    fig = go.Figure()
    for col, name in (("oracle_minus_majority", "O_K − majority@K"), ("oracle_minus_weighted_majority", "O_K − weighted vote@K"),
                      ("oracle_minus_greedy", "O_K − D (greedy)")):
        fig.add_scatter(x=table["temperature"], y=table[col], mode="lines+markers", name=name,
                        error_y={"type": "data", "array": table[f"{col}_hi"] - table[col], "arrayminus": table[col] - table[f"{col}_lo"]})
    fig.add_hline(y=0, line={"color": "black", "width": 1})
    fig.update_xaxes(title="sampling temperature")
    fig.update_yaxes(title="gap (fraction of questions; 95% paired intervals)")
    return titled(fig, "Selection gap vs temperature", label)


def selector_recovery_figure(selectors: pd.DataFrame, label: str) -> go.Figure:
    """Distribution over cells of each selector's gap recovery, (selected − greedy) /
    (oracle − greedy): 0 = no better than greedy, 1 = as good as the oracle. One box
    group per candidate source (routes, temperature samples) when the table says."""
    fig = go.Figure()
    sources = selectors.groupby("source", sort=False) if "source" in selectors else [("", selectors)]
    for source, rows in sources:
        fig.add_box(x=rows["selector"], y=rows["gap_recovery"], name=f"{source} candidates" if source else "selectors",
                    boxpoints="all", jitter=0.4, pointpos=0, customdata=rows["cell"],
                    hovertemplate="cell %{customdata}<br>recovery %{y:.3f}<extra></extra>")
    _hline(fig, 0.0, "greedy", "bottom right")
    _hline(fig, 1.0, "oracle", "top right")
    fig.update_layout(boxmode="group")
    fig.update_xaxes(title="selector (answer-blind)")
    fig.update_yaxes(title="gap recovery (fraction of oracle − greedy gap)")
    return titled(fig, "Selector gap recovery across cells", label)


def routing_figures_of(curves: pd.DataFrame | None, cells: pd.DataFrame | None, selectors: pd.DataFrame | None,
                       deployed: float | None, label: str) -> Figures:
    """Whichever of the three routing figures these tables allow (None = absent)."""
    figs: Figures = []
    excluded = set(cells.loc[cells["excluded"].astype(bool), "cell"]) if cells is not None and "excluded" in cells else set()
    if cells is not None and excluded and excluded >= set(cells["cell"]):
        # Every cell collapsed: an empty comparison would hide what happened, so show
        # them all, flagged, rather than nothing.
        excluded = set()
        cells = cells.assign(excluded=False)
        label = f"{label} · ALL CELLS FLAGGED: format collapse (shown for inspection only)"
    if curves is not None and len(curves):
        figs.append(("route_curves", route_curves_figure(curves, deployed, label, excluded)))
    if cells is not None and len(cells) and (fig := cell_difference_figure(cells, label)) is not None:
        figs.append(("route_cell_difference", fig))
    if selectors is not None and len(sel := selectors.dropna(subset=["gap_recovery"])):
        if excluded and "cell" in sel:
            sel = sel[~sel["cell"].isin(excluded)]
        if len(sel):
            figs.append(("selector_recovery", selector_recovery_figure(sel, label)))
    return figs


def route_distance_figure(distances: pd.DataFrame, label: str) -> go.Figure:
    """How far each method's evaluated routes lie from the full path (table
    route_distances: cell, space, method, edits, routes): per space, the share of a
    method's routes at each edit distance (layers skipped or run twice), pooled over the
    space's cells. Random and the searches are comparable only where these agree."""
    from plotly.subplots import make_subplots

    spaces = list(dict.fromkeys(distances["space"]))
    fig = make_subplots(rows=1, cols=len(spaces), shared_yaxes=True, subplot_titles=spaces)
    for col, space in enumerate(spaces, start=1):
        in_space = distances[distances["space"] == space]
        for method, rows in in_space.groupby("method", sort=False):
            counts = rows.groupby("edits")["routes"].sum().sort_index()
            fig.add_scatter(x=counts.index, y=counts / counts.sum(), mode="lines+markers", name=str(method),
                            legendgroup=str(method), showlegend=col == 1, line={"color": METHOD_COLOURS.get(str(method))},
                            row=1, col=col)
        fig.update_xaxes(title="edits from the full path (layers skipped or run twice)", row=1, col=col)
    fig.update_yaxes(title="share of the method's evaluated routes", row=1, col=1)
    return titled(fig, "Distance profile of the evaluated routes", label)


def routing_figures(run: RunDir, label: str) -> Figures:
    """The routing figures of one run folder."""
    summary = summary_of(run)
    deployed = summary.deployed if isinstance(summary, RouteSummary) else None
    figs = routing_figures_of(*(read_table(run, name) for name in ROUTING_TABLES), deployed, label)
    distances = read_table(run, "route_distances")
    if distances is not None and len(distances):
        figs.append(("route_distances", route_distance_figure(distances, label)))
    layers = read_table(run, "route_layers")
    if layers is not None and len(layers):
        figs.append(("route_layers", route_layers_figure(layers, label)))
    return figs


def route_layers_figure(layers: pd.DataFrame, label: str) -> go.Figure:
    """Where the routes' gains are (table route_layers: space, layer, action, gain,
    null_gain, above_chance): per space a heatmap over layers (x) and actions (skip,
    repeat), coloured by gain above its chance null (the gain itself where the run has
    no null), the cells above chance marked with a star."""
    from plotly.subplots import make_subplots

    spaces = list(dict.fromkeys(layers["space"]))
    fig = make_subplots(rows=len(spaces), cols=1, shared_xaxes=True, subplot_titles=spaces, vertical_spacing=0.12)
    has_null = layers["null_gain"].notna().any()
    for row, space in enumerate(spaces, start=1):
        rows = layers[layers["space"] == space]
        wide = rows.pivot(index="action", columns="layer", values="gain").reindex(["skip", "repeat"])
        null = rows.pivot(index="action", columns="layer", values="null_gain").reindex(["skip", "repeat"])
        above = rows.pivot(index="action", columns="layer", values="above_chance").reindex(["skip", "repeat"]).fillna(False)
        z = wide - null.fillna(0.0) if has_null else wide
        text = [[f"{g:.2f}" + ("*" if a else "") if g > 0 else "" for g, a in zip(gr, ar)]
                for gr, ar in zip(wide.to_numpy(), above.to_numpy())]
        fig.add_heatmap(x=list(wide.columns), y=list(wide.index), z=z.to_numpy(), text=text, texttemplate="%{text}",
                        zmin=-1, zmax=1, colorscale="RdBu", reversescale=True, showscale=row == 1,
                        colorbar={"title": "gain − null" if has_null else "gain"}, row=row, col=1)
    fig.update_xaxes(title="layer", row=len(spaces), col=1)
    fig.update_layout(height=max(FIGURE_SIZE["height"], 220 * len(spaces)))
    title = "Where the gains are: questions a route reaches and the full path misses, by layer and action"
    return titled(fig, title + (" (* above chance)" if has_null else " (no chance null: the task was not at hand)"), label)


ROUTING_TABLES = ("route_curves", "route_cells", "selectors")


def cross_cell_figures(run: RunDir, label: str) -> Figures:
    """The sorted random − structured differences of a `rnr route-cells` folder."""
    advantage = read_table(run, "advantage")
    return [("route_advantage", advantage_figure(advantage, label))] if advantage is not None and len(advantage) else []


def temperature_figures(run: RunDir, label: str) -> Figures:
    table = read_table(run, "temperature_sweep")
    return [("temperature_sweep", temperature_sweep_figure(table, label))] if table is not None and len(table) else []


def summary_of(run: RunDir) -> Summary | None:
    """The run's typed summary, or None while the run has not finished."""
    try:
        return run.read_summary()
    except FileNotFoundError:
        return None


def read_table(run: RunDir, name: str) -> pd.DataFrame | None:
    """The named table, or None when the run has none."""
    try:
        return run.read_table(name)
    except FileNotFoundError:
        return None
