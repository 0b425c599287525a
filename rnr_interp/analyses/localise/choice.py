"""Which block a sweep's repair table names: per component, the highest selectivity on
the selection part, and how ties are broken (`CHOICE_RULE`): MLP blocks still tied after
repair and damage by which writes the failure, else what acts through what (`mediation`),
reading each tied block silenced as the sweep silenced it (`silencing`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from rnr_interp.analyses.localise.mediation import (
    RULE as TIE_RULE, WRITES_AT_LEAST, direct_shares, moved_shares, tie_break)
from rnr_interp.analyses.localise.silencing import as_swept
from rnr_interp.models import LoadedModel
from rnr_interp.tasks.base import Question, Task

CHOICE_RULE = ("highest repair - damage on the selection part (ties: higher repair, lower damage; MLP blocks still "
               f"tied: {TIE_RULE}; other components: the earlier layer)")


def best_blocks(table: pd.DataFrame, on: str = "selection",
                ties: Mapping[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any] | None]:
    """Per component, the block with the highest selectivity on part `on` ("selection"
    or "all"; ties: higher repair, then lower damage, then the earlier layer); None when
    it repaired nothing there. `tied_with`: the other layers equal to it on all three
    (on a selection part of one failure and no panel, every layer that repairs that
    failure ties). `ties`: per component, a broken tie (`break_tie`) naming another of
    the tied layers, which is then the block (its record under ``tie_break``)."""
    suffix = "" if on == "all" else f"_{on}"
    out: dict[str, dict[str, Any] | None] = {}
    for c, sub in table.groupby("component", sort=False):
        sub = sub[sub[f"repair_rate{suffix}"].fillna(0) > 0]
        if sub.empty:
            out[str(c)] = None
            continue
        damage = sub[f"damage_rate{suffix}"].fillna(0)
        ranked = sub.assign(_d=damage, _s=sub[f"repair_rate{suffix}"] - damage).sort_values(
            ["_s", f"repair_rate{suffix}", "_d", "layer"], ascending=[False, False, True, True], kind="stable")
        top = ranked.iloc[0]
        same = ((ranked["_s"] == top["_s"]) & (ranked[f"repair_rate{suffix}"] == top[f"repair_rate{suffix}"])
                & (ranked["_d"] == top["_d"]))
        tied = [int(x) for x in ranked.loc[same, "layer"]]
        broken = (ties or {}).get(str(c))
        if broken is not None and sorted(broken["tied"]) != sorted(tied):
            broken = None  # broken on another part or table: not this tie
        named = tied[0] if broken is None else int(broken["named"])
        out[str(c)] = {"layer": named, "repair_rate": float(top[f"repair_rate{suffix}"]),
                       "damage_rate": float(top[f"damage_rate{suffix}"]), "selectivity": float(top["_s"]), "chosen_on": on,
                       "tied_with": [x for x in tied if x != named], **({} if broken is None else {"tie_break": broken})}
    return out


def break_tie(lm: LoadedModel, task: Task, table: pd.DataFrame, selection: tuple[Sequence[Question], Sequence[Question]],
              ablation: str = "zero", batch_size: int = 16, component: str = "mlp",
              contexts: Mapping[str, Sequence[int]] | None = None,
              replies: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """{component: record} when `component`'s best blocks on the selection part tie:
    the tied block named by `mediation.RULE`, each silenced as the
    sweep silenced it (`silencing.as_swept`) and read where the sweep read its units
    (`contexts`, by question id; else the prompts); {} when nothing ties, or the selection
    part lacks failures or a panel to read a failure direction from (the earliest is
    named then). The deployed `replies` (by question id) give the direct effects
    (`mediation.direct_shares`) the rule names the block by; without them, where no
    failure's reply parts from its gold on a token, or where no tied block's direct
    effect stands out (`mediation.writer`), what acts through what names it."""
    best = best_blocks(table, on="selection").get(component) if component in set(table["component"]) else None
    if best is None or not best["tied_with"] or not selection[0] or not selection[1]:
        return {}
    tied = [best["layer"], *best["tied_with"]]
    silence = as_swept(lm, task, table, [(layer, component) for layer in tied], ablation, batch_size)
    moved = moved_shares(lm, task, *selection, {layer: silence[layer, component] for layer in tied}, component, batch_size,
                         contexts)
    direct = (direct_shares(lm, task, selection[0], replies, {layer: silence[layer, component] for layer in tied},
                            component, batch_size) if replies is not None else None)
    return {component: tie_break(tied, moved, direct)}


def tie_note(component: str, best: dict[str, Any] | None, split: dict[str, Any]) -> str | None:
    """One line saying that `best` (a `best_blocks` entry) ties with other layers on the
    selection part (None when it does not)."""
    if best is None or not best.get("tied_with"):
        return None
    layers = ", ".join(str(x) for x in sorted([best["layer"], *best["tied_with"]]))
    broken = best.get("tie_break", {})
    earliest = best["layer"] < min(best["tied_with"])
    by_direct = broken.get("named_by") == "direct effect"
    why = ("the earliest" if not broken else
           "the one whose own write carries the most of its repair to the logits" if by_direct
           else "the one every earlier tied block acts through" if not earliest
           else "the earliest (no later one is acted through by every earlier one)")
    direct = broken.get("direct")
    shares = "" if not direct else (
        ("; mean direct effect of each (nats): " if by_direct
         else f"; no tied block's own write stands out (by at least {WRITES_AT_LEAST:g} nats and above every "
              "other's) in its direct effect on the logits (nats): ")
        + ", ".join(f"{d['block']} {d['direct']:+.2f}" for d in direct))
    return (f"the best {component} block is a tie on the selection part ({split['n_failure_selection']} failures, "
            f"{split['n_panel_selection']} panel): layers {layers} rank alike and {why}, {best['layer']}, is named{shares}")
