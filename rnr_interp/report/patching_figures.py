"""The activation-patching heatmap: how much of the clean answer's lead each head (or
layer) carries back into the corrupted run (`analyses.patching`)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from rnr_interp.analyses.patching import mean_recovered


def patching_heatmap(table: pd.DataFrame, title: str = "Activation patching") -> go.Figure:
    """Layer x head heatmap of `recovered` averaged over pairs (a `patching_sweep` table;
    layer x position for a sweep by position, one column for a layer-level sweep of every
    position at once), diverging around 0."""
    grid = mean_recovered(table)
    axis = "head" if table["head"].notna().any() else "position"
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy(), x=[str(c) for c in grid.columns], y=[int(i) for i in grid.index],
        colorscale="RdBu", zmid=0, colorbar=dict(title="recovered"),
        hovertemplate=f"layer %{{y}}, {axis} %{{x}}: %{{z:.3f}}<extra></extra>",
    ))
    site = ", ".join(sorted(table["site"].unique()))
    fig.update_layout(title=f"{title} ({site}; mean over {table['pair'].nunique()} pairs)",
                      xaxis_title=axis, yaxis_title="layer", yaxis_autorange="reversed")
    return fig
