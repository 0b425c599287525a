"""Failure localisation and repair: which block, silenced, turns a recognised-but-missed
answer right, and what does silencing it break?

- Failure set: questions whose recognition readout (`recognition.py`) ranks the gold
  option first while the deployed (greedy) generation is wrong: the model "knows" the
  answer and still does not say it. Healthy panel: questions the deployed generation
  gets right (every one up to `cohort.PANEL_CAP` in task order).
- Silencing sweep: for every layer and component in {mlp, attn, layer}, silence it
  (zero-ablate, the paper's; or, with ``ablation="mean"``, write its mean write over
  the task's prompts instead: `silencers`) and re-run the deployed generation on both
  sets. Repair rate = fraction of the failure set now right; damage rate = fraction of
  the panel now wrong. Every
  (question, ablation) pair is one batch row with its own intervention set, so the whole
  sweep is a few batched generations, not L x 3 runs.
- Summary (the paper's table row): the MLP block with the best selectivity on the
  selection part (`cohort.Split`), and at that SAME layer the held-out repair and damage
  of silencing the MLP, the attention and the whole layer, each with a Wilson interval
  on its own denominator; each component's own best layer is reported apart, labelled.
- Screen: the run's recognition score against chance and against its generation score
  under a stated `recognition.FailureCriterion` (one point of the paper's Figure 4a).
- Permutation control (opt-in): the chosen block re-scored on the held-out failures
  with each question's options rotated by one (`readings.run_permutation_control`).
- Circular (opt-in, `circular.circular_outcomes`): the cohort and every sweep row asked
  under every cyclic shift of the options; right, and a repair, only under all of them.
- Power: each chosen block's held-out rates carry the probability of detecting the
  paper's effect at their n (`metrics.wilson_power`), beside the selection-part and
  all-question rates.

Each generation is a standard record (probe "deployed" for the baseline,
``ablate:{component}:{layer}`` for sweep rows, see `records.ProbeLabel`), written per
chunk, so an interrupted run resumes where it stopped. The row runner and the cohort
live in `cohort.py` (steering uses them too); this module writes tables and a summary,
and the report draws them (`report.registry`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from rnr_interp.analyses.localise.circular import ROTATION, circular_rows
from rnr_interp.analyses.localise.cohort import PANEL_CAP, CohortRun, Split, localisation_config, open_cohort
from rnr_interp.analyses.localise.choice import CHOICE_RULE, best_blocks, break_tie
from rnr_interp.analyses.localise.directions import check_units
from rnr_interp.analyses.localise.positions import check_read_at, read_setting
from rnr_interp.analyses.localise.silencing import as_swept, silencers, units_column
from rnr_interp.analyses.localise.readings import check_permutation_control, outcome_counts
from rnr_interp.engine.rows import run_rows
from rnr_interp.engine.rows import Row
from rnr_interp.engine.decoding import Decoding
from rnr_interp.interventions import COMPONENT_SITE, check_ablation
from rnr_interp.models import LoadedModel
from rnr_interp.metrics import DAMAGE_EFFECT, REPAIR_EFFECT, power_entry, proportion
from rnr_interp.analyses.localise.recognition import FailureCriterion, recognition_chance, screen_cell
from rnr_interp.records import (
    FAILURES, REPAIR, SCREEN, FailuresSummary, ProbeLabel, RepairSummary, RunDir, RunFolderError, ScreenSummary,
)
from rnr_interp.engine.sampling import deployed_decoding
from rnr_interp.tasks.base import Question, Task

#: the block components a sweep silences (the keys of the site table's component map)
COMPONENTS = tuple(COMPONENT_SITE)


# -- silencing sweep ---------------------------------------------------------------

def ablation_probe(component: str, layer: int) -> str:
    return str(ProbeLabel.ablate(component, layer))


def silencing_sweep(
    lm: LoadedModel, task: Task, failure: Sequence[Question], panel: Sequence[Question], *, decoding: Decoding,
    layers: Sequence[int] | None = None, components: Sequence[str] = COMPONENTS, split: Split = Split(),
    run: RunDir | None = None, batch_size: int = 32, progress: bool = False, level: float = 0.95,
    circular: bool = False, ablation: str = "zero", units: int | None = None,
    contexts: Mapping[str, Sequence[int]] | None = None,
) -> pd.DataFrame:
    """The repair table: one row per (layer, component) with repair_rate, damage_rate,
    selectivity (repair - damage) on every question, the same on the selection part
    (`*_selection`) and on the held-out part (`*_heldout`, with Wilson bounds `_lo`,
    `_hi`), and each part's n. With `circular` every row is asked under every cyclic
    shift of its options and a question counts as right only when right under all of
    them (a moved answer is a repair only then). `ablation`: how a block is silenced;
    `units`: an MLP block silenced in its top units alone, scored on the selection parts
    at the end of each one's context in `contexts` (by question id; else its prompt:
    `silencers`)."""
    layers = list(range(lm.n_layers)) if layers is None else list(layers)
    blocks = [(layer, c) for layer in layers for c in components]
    questions = list(dict.fromkeys([*failure, *panel]))
    selection = (split(failure)[0], split(panel)[0])
    silence = silencers(lm, task, blocks, ablation, batch_size, units, selection, contexts) if questions else {}
    rows = [Row(q, (silence[layer, c],), ablation_probe(c, layer)) for q in questions for layer, c in blocks]
    records = run_rows(lm, task, circular_rows(rows) if circular else rows, decoding, run, batch_size=batch_size,
                       desc="sweep", progress=progress)
    # all questions (the heatmaps), the selection part (the choice of block), the held-out
    # part (every reported rate of a choice)
    sets = {"all": (list(failure), list(panel)), "selection": (split(failure)[0], split(panel)[0]),
            "heldout": (split(failure)[1], split(panel)[1])}
    table = []
    for layer, c in blocks:
        row: dict[str, Any] = {"layer": layer, "component": c}
        if units is not None:  # which units an MLP row silenced (empty: the whole block, or no row ran)
            row["silenced_units"] = units_column(silence.get((layer, c)))
        for part, (f, p) in sets.items():
            suffix = "" if part == "all" else f"_{part}"
            fixed, n_f = outcome_counts(records, f, ablation_probe(c, layer), circular)
            right, n_p = outcome_counts(records, p, ablation_probe(c, layer), circular)
            repair, damage = proportion(fixed, n_f, level), proportion(n_p - right, n_p, level)
            row.update({f"repair_rate{suffix}": repair["rate"], f"damage_rate{suffix}": damage["rate"],
                        f"selectivity{suffix}": repair["rate"] - damage["rate"],
                        f"n_failure{suffix}": n_f, f"n_panel{suffix}": n_p})
            if part == "heldout":
                row.update({"repair_rate_heldout_lo": repair["ci"][0], "repair_rate_heldout_hi": repair["ci"][1],
                            "damage_rate_heldout_lo": damage["ci"][0], "damage_rate_heldout_hi": damage["ci"][1]})
        table.append(row)
    return pd.DataFrame(table)


def sweep_cohort(c: CohortRun, layers: Sequence[int], components: Sequence[str], ablation: str = "zero",
                 units: int | None = None, contexts: Mapping[str, Sequence[int]] | None = None) -> pd.DataFrame:
    """`silencing_sweep` of `components` at `layers` over the run's cohort, asked as its rows are,
    each MLP block's `units` scored at the end of each selection question's context in
    `contexts` (`CohortRun.reading_contexts`; else its prompt).
    With an empty failure set nothing can be repaired and no block chosen, so the panel
    is not swept either (its damage alone chooses nothing; on a null organism this was
    most of the run's time): the table keeps its rows, with no rates."""
    panel = c.cohort.panel if c.cohort.failure else []
    return silencing_sweep(c.lm, c.task, c.cohort.failure, panel, decoding=c.decoding, layers=layers,
                           components=components, split=c.cohort.split, run=c.run, batch_size=c.batch_size,
                           progress=c.progress, circular=c.cohort.circular, ablation=ablation, units=units,
                           contexts=contexts)


def heldout_rates(table: pd.DataFrame, layer: int, component: str) -> dict[str, Any] | None:
    """Held-out repair and damage of one block, each a rate with its Wilson interval on
    its own denominator, its `power` (the probability, at this n, that the findings'
    rule detects the paper's effect: `metrics.wilson_power`, the test in `power_test`),
    and beside it, labelled, the same rate on the selection part (which chose the block:
    optimistic) and on every question; None when the block was not swept."""
    row = table[(table["layer"] == layer) & (table["component"] == component)]
    if row.empty:
        return None
    r = row.iloc[0]
    entry = {"layer": int(layer), "component": component}
    for what, part, effect in (("repair", "failure", REPAIR_EFFECT), ("damage", "panel", DAMAGE_EFFECT)):
        n = int(r[f"n_{part}_heldout"])
        power = power_entry(effect, n)
        entry[what] = {"rate": float(r[f"{what}_rate_heldout"]), "ci": [float(r[f"{what}_rate_heldout_lo"]), float(r[f"{what}_rate_heldout_hi"])],
                       "k": int(round(float(r[f"{what}_rate_heldout"]) * n)) if n else 0, "n": n,
                       "power": power.pop("power"), "power_test": power,
                       "selection": {"rate": float(r[f"{what}_rate_selection"]), "n": int(r[f"n_{part}_selection"]),
                                     "label": "selection part (chose the block)"},
                       "all": {"rate": float(r[f"{what}_rate"]), "n": int(r[f"n_{part}"]),
                               "label": "all questions (selection + held out)"}}
    return entry


def localisation_summary(table: pd.DataFrame, ties: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The paper's row for one case: the MLP block chosen on the selection part, and
    at that SAME layer the held-out repair/damage of silencing the MLP, the attention
    and the whole layer; separately, each component's own best layer (also chosen on
    the selection part, scored held out), for the components swept at every layer the
    MLP was. Rates are NaN where a part is empty. `ties`: broken ties (`break_tie`)."""
    own = best_blocks(table, on="selection", ties=ties)
    chosen = own.get("mlp")
    out: dict[str, Any] = {"choice_rule": CHOICE_RULE, "chosen": None, "at_chosen_layer": None, "own_best": {}}
    if chosen is not None:
        out["chosen"] = {"component": "mlp", "layer": chosen["layer"], "selection": chosen}
        out["at_chosen_layer"] = {c: heldout_rates(table, chosen["layer"], c) for c in COMPONENTS}
    swept = table.groupby("component")["layer"].apply(set)
    widest = max(swept.index, key=lambda c: len(swept[c]))
    for c, best in own.items():
        if not swept[widest] <= swept[c]:
            continue  # swept at the chosen layer only: it has no "own best" layer
        out["own_best"][c] = None if best is None else {"selection": best, "heldout": heldout_rates(table, best["layer"], c)}
    return out


def controls_table(summary: dict[str, Any]) -> pd.DataFrame:
    """One labelled row per reported block: the chosen MLP, same-layer attention and
    whole layer, then each component's own best; held-out rates with Wilson bounds."""
    rows = []
    at = summary.get("at_chosen_layer") or {}
    own = summary.get("own_best") or {}
    labels = {"mlp": "MLP", "attn": "attention", "layer": "whole layer"}
    entries = [(f"chosen MLP (layer {e['layer']})" if c == "mlp" else f"{labels[c]} at the chosen layer {e['layer']}", e)
               for c, e in at.items() if e is not None]
    entries += [(f"{labels[c]}'s own best (layer {b['heldout']['layer']})", b["heldout"])
                for c, b in own.items() if b is not None and c != "mlp" and b["heldout"] is not None]
    for label, e in entries:
        rows.append({"block": label, "layer": e["layer"], "component": e["component"],
                     "repair_heldout": e["repair"]["rate"], "repair_lo": e["repair"]["ci"][0], "repair_hi": e["repair"]["ci"][1],
                     "n_failure_heldout": e["repair"]["n"], "repair_power": e["repair"].get("power", float("nan")),
                     "damage_heldout": e["damage"]["rate"], "damage_lo": e["damage"]["ci"][0], "damage_hi": e["damage"]["ci"][1],
                     "n_panel_heldout": e["damage"]["n"], "damage_power": e["damage"].get("power", float("nan"))})
    return pd.DataFrame(rows, columns=["block", "layer", "component", "repair_heldout", "repair_lo", "repair_hi",
                                       "n_failure_heldout", "repair_power", "damage_heldout", "damage_lo", "damage_hi",
                                       "n_panel_heldout", "damage_power"])


# -- run folders ---------------------------------------------------------------------


def run_failures(lm: LoadedModel, task: Task, out: str | Path, *, readout: str = "option:mean",
                 panel: int | None = PANEL_CAP, decoding: Decoding | None = None,
                 criterion: FailureCriterion = FailureCriterion(), batch_size: int = 32,
                 progress: bool = True, circular: bool = False, grading: str | None = None) -> FailuresSummary:
    """Recognition, deployed baseline and the cohort, into a run folder (kind "failures"),
    with the cell's line of the failure screen (`recognition.screen_cell`). With
    `circular`, generation is read under every cyclic shift of the options."""
    decoding = decoding or deployed_decoding(task)
    run = RunDir.create(out, localisation_config(FAILURES, lm, task, decoding, readout, panel, batch_size,
                                                 circular=circular, grading=grading))
    c = open_cohort(lm, task, run, readout=readout, panel=panel, decoding=decoding, batch_size=batch_size,
                    progress=progress, circular=circular)
    return run.write_summary({**c.summary(FAILURES, run.read_table("recognition"), readout=readout,
                                          screen=cell_screen(run, readout, criterion)), **c.readings()})


def cell_screen(run: RunDir, readout: str, criterion: FailureCriterion = FailureCriterion()) -> dict[str, Any]:
    """The failure screen of a failures/repair run folder: its recognition score (gold
    first under `readout`) against chance (one over each question's option count, read
    off the recognition table) and against its generation score (the cohort's
    `generation` table: greedy deployed right, under every cyclic shift when the run is
    circular)."""
    recognition = run.read_table("recognition")
    mine = recognition[recognition["readout"] == readout].set_index("question_id")
    ids = list(mine.index)
    try:
        generation = run.read_table("generation").set_index("question_id")["correct"].astype(bool)
    except FileNotFoundError:
        raise RunFolderError(f"{run.path}: no generation table (a run not finished, or written before runs stored it: "
                             "an earlier rnr_interp 0.1); rerun it") from None
    chance = recognition_chance([len(scores) for scores in mine.loc[ids, "scores"]])
    return {**screen_cell(mine.loc[ids, "gold_first"].to_numpy(bool), generation.loc[ids].to_numpy(bool), chance, criterion),
            "readout": readout, "criterion": criterion.describe(), "circular": bool(run.config.get("circular"))}


#: what a repair run silences: every component at every layer, or one component ("mlp",
#: "layer") at every layer and then the others at its chosen layer only (the paper's
#: same-layer controls, a third of the cost; no own-best layer for them)
SWEEPS = ("all", "mlp", "layer")


def screen_table(runs: Sequence[RunDir], criterion: FailureCriterion = FailureCriterion()) -> pd.DataFrame:
    """The cell-level failure screen (the paper's Figure 4a): one row per cell (a
    failures or repair run: one model on one task) with its recognition score, its
    generation score, their difference and paired interval, and whether `criterion`
    calls it a failure cell. Cells of one task decoded differently are refused."""
    rows, decoding = [], {}
    for run in runs:
        cfg = run.config
        # the task's name and its data file: ARC-Easy and ARC-Challenge are both "arc"
        task = f"{cfg['task']['name']} ({Path(str(cfg['task'].get('source', ''))).name})"
        if decoding.setdefault(task, (cfg["deployed"], run.path))[0] != cfg["deployed"]:
            first, where = decoding[task]
            raise ValueError(f"cells of task {task!r} were decoded differently: {first} ({where}) != "
                             f"{cfg['deployed']} ({run.path}); rerun them with one decoding")
        cell = cell_screen(run, cfg["readout"], criterion)
        rows.append({"model": cfg["model"], "task": task, "readout": cfg["readout"], "path": str(run.path),
                     **{k: cell[k] for k in ("n_questions", "recognition_score", "recognition_chance",
                                             "recognition_excess", "lucky_share_of_recognised", "generation_score",
                                             "difference", "n_recognised_not_generated", "failure", "circular")},
                     "recognition_excess_lo": cell["recognition_excess_ci"][0],
                     "recognition_excess_hi": cell["recognition_excess_ci"][1],
                     "difference_lo": cell["difference_ci"][0], "difference_hi": cell["difference_ci"][1],
                     "letter_warning": _letter_warning(run)})
    return pd.DataFrame(rows)


def _letter_warning(run: RunDir) -> str | None:
    """The cell's letter-bias warning (`circular.letter_bias`), from its failure set."""
    try:
        return (run.read_json("failure_set").get("letter_bias") or {}).get("message")
    except FileNotFoundError:
        return None


def write_screen(out: str | Path, runs: Sequence[RunDir], criterion: FailureCriterion = FailureCriterion()) -> ScreenSummary:
    """The screen of `runs` into a run folder (kind "screen"): table `screen` and a
    summary stating the criterion and which cells it keeps."""
    table = screen_table(runs, criterion)
    run = RunDir.create(out, {"kind": SCREEN, "cells": [{"path": str(r.path), "config_hash": r.config_hash} for r in runs],
                              "criterion": asdict(criterion)})
    run.write_table("screen", table)
    summary = {"kind": SCREEN, "criterion": criterion.describe(), "margin": criterion.margin, "level": criterion.level,
               "n_cells": len(table), "n_failure_cells": int(table["failure"].sum()) if len(table) else 0,
               "cells": table.to_dict(orient="records")}
    return run.write_summary(summary)


def run_repair(lm: LoadedModel, task: Task, out: str | Path, *, readout: str = "option:mean",
               panel: int | None = PANEL_CAP, split: Split = Split(), decoding: Decoding | None = None,
               layers: Sequence[int] | None = None, components: Sequence[str] = COMPONENTS, sweep: str = "all",
               permutation_control: bool = False, batch_size: int = 32, progress: bool = True,
               circular: bool = False, ablation: str = "zero", grading: str | None = None,
               units: int | None = None, read_at: str = "prompt") -> RepairSummary:
    """Cohort + silencing sweep into a run folder (kind "repair"): the `repair` table,
    the `controls` table and a summary: the MLP block chosen on the selection part,
    same-layer attention and whole-layer controls, and each component's own best, all
    scored on the held-out part. `sweep` is one of `SWEEPS`. `permutation_control`
    re-scores the chosen block on the held-out failures with options rotated
    (`readings.run_permutation_control`; twice that part's rows again, so off by default).
    `circular`: the cohort and every sweep row read under every cyclic shift of the
    options (as many rows again as the options, per row). `ablation`: how a block is
    silenced, "zero" (the paper's) or "mean" (`silencers`). `units`: each MLP block is
    silenced in its `units` units most along its own failure direction alone, scored on
    the selection parts (`mlp_unit_sets`; attention and whole layers as `ablation` says),
    where the paper silences the whole block. `read_at`: where the sweep reads each
    block's failure direction, to score its units and to break a tie between MLP blocks
    (`choice.break_tie`): `positions.READ_AT`, the prompt's end or where each deployed
    reply's answer starts, as `run_units` and `run_steer` read the chosen block.
    `grading`: what "right" is (`cohort.localisation_config`)."""
    if sweep not in SWEEPS:
        raise ValueError(f"sweep must be one of {SWEEPS}, got {sweep!r}")
    check_ablation(ablation)
    check_units(units)
    check_read_at(read_at)
    if permutation_control:
        check_permutation_control(task)
    decoding = decoding or deployed_decoding(task)
    layers = list(range(lm.n_layers)) if layers is None else list(layers)
    # only when on, so a default run's config (and run_id) is what it always was
    control = {"permutation_control": {"shift": ROTATION}} if permutation_control else {}
    if ablation != "zero":
        control["ablation"] = ablation
    if units is not None:
        control["units"] = units
    control.update(read_setting(read_at))
    run = RunDir.create(out, localisation_config(REPAIR, lm, task, decoding, readout, panel, batch_size, split,
                                                 circular=circular, grading=grading, layers=layers, components=list(components),
                                                 sweep=sweep, **control))
    c = open_cohort(lm, task, run, readout=readout, panel=panel, split=split, decoding=decoding, batch_size=batch_size,
                    progress=progress, circular=circular)
    selection = (c.cohort.parts("failure")[0], c.cohort.parts("panel")[0])
    contexts = c.reading_contexts([*selection[0], *selection[1]], read_at)
    table = sweep_cohort(c, layers, components if sweep == "all" else (sweep,), ablation, units, contexts)
    ties = break_tie(c.lm, c.task, table, selection, ablation, c.batch_size, contexts=contexts,
                     replies=c.deployed_replies())
    if sweep != "all":
        chosen = best_blocks(table, on="selection", ties=ties).get(sweep)
        if chosen is not None:
            others = [component for component in components if component != sweep]
            table = pd.concat([table, sweep_cohort(c, [chosen["layer"]], others, ablation, units, contexts)],
                              ignore_index=True)
    run.write_table("repair", table)
    localisation = localisation_summary(table, ties)
    controls = controls_table(localisation)
    run.write_table("controls", controls)
    # each component's own best block (chosen on the selection part): how its answers moved (issue 17)
    best = best_blocks(table, on="selection", ties=ties)
    best_probes = [ablation_probe(c, b["layer"]) for c, b in best.items() if b is not None]
    summary = {**c.summary(REPAIR, run.read_table("recognition"), readout=readout, sweep=sweep, ablation=ablation,
                           screen=cell_screen(run, readout), **({} if units is None else {"units": units}),
                           **read_setting(read_at)),
               **localisation, "best": best, "best_all_questions": best_blocks(table, on="all"),
               "table": table.to_dict(orient="records"), **c.readings(best_probes)}
    if permutation_control:
        summary["permutation_control"] = chosen_block_rotated(c, summary["chosen"], table, ablation)
    return run.write_summary(summary)


def chosen_block_rotated(c: CohortRun, chosen: dict[str, Any] | None, table: pd.DataFrame,
                         ablation: str = "zero") -> dict[str, Any]:
    """The permutation control of the chosen MLP block on the held-out failures,
    silenced as the sweep (`table`) silenced it; says why there is none when no block
    was chosen or nothing is held out."""
    if chosen is None or not c.cohort.parts("failure")[1]:
        why = "no MLP block repaired any selection-part failure" if chosen is None else "no failure is held out"
        return {"skipped": why}
    probe = ablation_probe("mlp", chosen["layer"])
    silence = as_swept(c.lm, c.task, table, [(chosen["layer"], "mlp")], ablation, c.batch_size)
    return {"block": probe, **c.permutation_control({probe: (silence[chosen["layer"], "mlp"],)})}
