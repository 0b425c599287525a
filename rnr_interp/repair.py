"""Failure localisation and repair: which block, silenced, turns a recognised-but-missed
answer right, and what does silencing it break?

- Failure set: questions whose recognition readout (`recognition.py`) ranks the gold
  option first while the deployed (greedy) generation is wrong: the model "knows" the
  answer and still does not say it. Healthy panel: questions the deployed generation
  gets right (the first `panel` of them in task order).
- Silencing sweep: for every layer and component in {mlp, attn, layer}, zero-ablate it
  and re-run the deployed generation on both sets. Repair rate = fraction of the
  failure set now right; damage rate = fraction of the panel now wrong. Every
  (question, ablation) pair is one batch row with its own intervention set, so the whole
  sweep is a few batched generations, not L x 3 runs.

Each generation is a standard record (probe "deployed" for the baseline,
``ablate:{component}:{layer}`` for sweep rows, see `records.ProbeLabel`), written per
chunk, so an interrupted run resumes where it stopped. The row runner and the cohort
live in `cohort.py` (steering uses them too); this module writes tables and a summary,
and the report draws them (`report.registry`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from rnr_interp.cohort import (
    Row, build_cohort, cohort_summary, deployed_decoding, localisation_config, multiple_choice_readings, rates, run_rows,
)
from rnr_interp.generate import Decoding
from rnr_interp.interventions import COMPONENT_SITE, Ablate
from rnr_interp.models import LoadedModel
from rnr_interp.records import ProbeLabel, RunDir
from rnr_interp.tasks.base import MultipleChoiceTask, Question, Task

#: the block components a sweep silences (the keys of the site table's component map)
COMPONENTS = tuple(COMPONENT_SITE)


# -- silencing sweep ---------------------------------------------------------------


def ablation_probe(component: str, layer: int) -> str:
    return str(ProbeLabel.ablate(component, layer))


def silencing_sweep(
    lm: LoadedModel, task: Task, failure: Sequence[Question], panel: Sequence[Question], *, decoding: Decoding,
    layers: Sequence[int] | None = None, components: Sequence[str] = COMPONENTS,
    run: RunDir | None = None, batch_size: int = 32, progress: bool = False,
) -> pd.DataFrame:
    """The repair table: one row per (layer, component) with repair_rate, damage_rate,
    selectivity (repair - damage), n_failure, n_panel."""
    layers = list(range(lm.n_layers)) if layers is None else list(layers)
    blocks = [(layer, c) for layer in layers for c in components]
    questions = list(dict.fromkeys([*failure, *panel]))
    rows = [Row(q, (Ablate(c, layer),), ablation_probe(c, layer)) for q in questions for layer, c in blocks]
    records = run_rows(lm, task, rows, decoding, run, batch_size=batch_size, desc="sweep", progress=progress)
    table = []
    for layer, c in blocks:
        repair, damage = rates(records, failure, panel, ablation_probe(c, layer))
        table.append({"layer": layer, "component": c, "repair_rate": repair, "damage_rate": damage,
                      "selectivity": repair - damage, "n_failure": len(failure), "n_panel": len(panel)})
    return pd.DataFrame(table)


def best_blocks(table: pd.DataFrame) -> dict[str, dict[str, Any] | None]:
    """Per component, the block with the highest selectivity (ties: higher repair, then
    lower damage, then the earlier layer); None when nothing was repaired."""
    out: dict[str, dict[str, Any] | None] = {}
    for c, sub in table.groupby("component", sort=False):
        sub = sub[sub["repair_rate"].fillna(0) > 0]
        if sub.empty:
            out[str(c)] = None
            continue
        damage = sub["damage_rate"].fillna(0)
        ranked = sub.assign(_d=damage, _s=sub["repair_rate"] - damage).sort_values(
            ["_s", "repair_rate", "_d", "layer"], ascending=[False, False, True, True], kind="stable")
        top = ranked.iloc[0]
        out[str(c)] = {"layer": int(top["layer"]), "repair_rate": float(top["repair_rate"]),
                       "damage_rate": float(top["damage_rate"]), "selectivity": float(top["_s"])}
    return out


# -- run folders ---------------------------------------------------------------------


def run_failures(lm: LoadedModel, task: MultipleChoiceTask, out: str | Path, *, readout: str = "option:mean",
                 panel: int | None = None, decoding: Decoding | None = None, batch_size: int = 32,
                 progress: bool = True) -> dict[str, Any]:
    """Recognition, deployed baseline and the cohort, into a run folder (kind "failures")."""
    decoding = decoding or deployed_decoding(task)
    run = RunDir.create(out, localisation_config("failures", lm, task, decoding, readout, panel, batch_size))
    cohort = build_cohort(lm, task, run, readout=readout, panel=panel, decoding=decoding,
                          batch_size=batch_size, progress=progress)
    summary = {"kind": "failures", "model": lm.spec, "task": task.name, "readout": readout,
               **cohort_summary(cohort, run.read_table("recognition")),
               **multiple_choice_readings(task, run.read_records(), cohort.failure)}
    run.write_summary(summary)
    return summary


def run_repair(lm: LoadedModel, task: MultipleChoiceTask, out: str | Path, *, readout: str = "option:mean",
               panel: int | None = 8, decoding: Decoding | None = None, layers: Sequence[int] | None = None,
               components: Sequence[str] = COMPONENTS, batch_size: int = 32, progress: bool = True) -> dict[str, Any]:
    """Cohort + silencing sweep into a run folder (kind "repair"): the `repair` table,
    and a summary with the best block per component."""
    decoding = decoding or deployed_decoding(task)
    layers = list(range(lm.n_layers)) if layers is None else list(layers)
    run = RunDir.create(out, localisation_config("repair", lm, task, decoding, readout, panel, batch_size,
                                                 layers=layers, components=list(components)))
    cohort = build_cohort(lm, task, run, readout=readout, panel=panel, decoding=decoding,
                          batch_size=batch_size, progress=progress)
    table = silencing_sweep(lm, task, cohort.failure, cohort.panel, decoding=decoding, layers=layers,
                            components=components, run=run, batch_size=batch_size, progress=progress)
    run.write_table("repair", table)
    best = best_blocks(table)
    best_probes = [ablation_probe(c, b["layer"]) for c, b in best.items() if b is not None]
    summary = {"kind": "repair", "model": lm.spec, "task": task.name, "readout": readout,
               **cohort_summary(cohort, run.read_table("recognition")),
               "best": best, "table": table.to_dict(orient="records"),
               **multiple_choice_readings(task, run.read_records(), cohort.failure, best_probes)}
    run.write_summary(summary)
    return summary
