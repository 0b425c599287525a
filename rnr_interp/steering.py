"""Reciprocal steering and unit-level repair for one block found by the silencing sweep.

Direction. For block (layer l, component c), v is the mean of the block's output at the
last prompt position over the failure set minus its mean over the healthy panel. The
block's output is read at its site in the site table (`interventions.COMPONENT_SITE`:
``hook_mlp_out`` for c = mlp, ``hook_attn_out`` for attn), or is ``hook_resid_post -
hook_resid_pre`` (the whole layer's write). v points from "answers right" towards
"recognises but answers wrong".

Steering adds ``alpha * v`` to that same output at every position (`Steer` at the
block's site). Rescue: ``-alpha * v`` on the failure set, rate = fraction now right.
Induction: ``+alpha * v`` on the healthy panel, rate = fraction now wrong.

Units. Each MLP unit i of the block writes ``act_i * W_out[i]`` into the residual
stream; its directional contribution is ``mean_failure(act_i) * (W_out[i] . v)``
(act at ``mlp.hook_post``, last prompt position). Silencing the top-k units
(`AblateUnits`) is compared with silencing the whole MLP output: recovered fraction =
repair(top-k) / repair(whole MLP); k random units (seeded) are the control.

Rows, the cohort and run configs come from `cohort.py`; tables go to the run folder and
the report draws them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from rnr_interp.cohort import (
    Cohort, Row, build_cohort, cohort_summary, deployed_decoding, localisation_config, multiple_choice_readings, rates,
    run_rows,
)
from rnr_interp.generate import Decoding, forward, left_pad
from rnr_interp.interventions import COMPONENT_SITE, Ablate, AblateUnits, Steer, capturing, set_id, site_hook
from rnr_interp.models import LoadedModel
from rnr_interp.records import ProbeLabel, RunDir
from rnr_interp.repair import ablation_probe, best_blocks, silencing_sweep
from rnr_interp.sampling import chunks, prompt_ids
from rnr_interp.tasks.base import Question, Task

DEFAULT_ALPHAS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)
DEFAULT_KS = (1, 4, 8, 16, 32, 64, 128)


# -- activations -----------------------------------------------------------------------


@torch.inference_mode()
def last_position(lm: LoadedModel, prompts: Sequence[Sequence[int]], sites: Sequence[tuple[str, int]],
                  batch_size: int = 16) -> dict[tuple[str, int], Float[Tensor, "n d"]]:
    """Activations at the last prompt position (left padding puts it at -1) of each
    (site, layer), read through the registry's capture context."""
    names = {key: site_hook(lm, *key) for key in sites}
    got: dict[tuple[str, int], list[Tensor]] = {key: [] for key in sites}
    for batch in chunks(list(prompts), batch_size):
        ids, mask = left_pad(batch, lm.pad_id, lm.device)
        with capturing(lm, list(names.values()), keep=lambda act: act[:, -1].detach().float().cpu()) as acts:
            forward(lm, ids, mask, last_only=True)  # only the captured activations are kept
        for key, name in names.items():
            got[key] += acts[name]
    return {key: torch.cat(v) if v else torch.zeros(0) for key, v in got.items()}


def block_output(lm: LoadedModel, prompts: Sequence[Sequence[int]], layer: int, component: str,
                 batch_size: int = 16) -> Float[Tensor, "n d"]:
    """What block (layer, component) writes into the residual stream, last position."""
    if component == "layer":
        acts = last_position(lm, prompts, [("hook_resid_pre", layer), ("hook_resid_post", layer)], batch_size)
        return acts[("hook_resid_post", layer)] - acts[("hook_resid_pre", layer)]
    key = (COMPONENT_SITE[component], layer)
    return last_position(lm, prompts, [key], batch_size)[key]


def direction(lm: LoadedModel, task: Task, failure: Sequence[Question], panel: Sequence[Question], layer: int,
              component: str, batch_size: int = 16) -> Float[Tensor, "d"]:
    """v = mean block output over the failure set - mean over the panel."""
    if not failure or not panel:
        raise ValueError(f"the steering direction needs a non-empty failure set and panel (got {len(failure)} and {len(panel)})")
    out = block_output(lm, [prompt_ids(lm, task, q) for q in [*failure, *panel]], layer, component, batch_size)
    return out[:len(failure)].mean(0) - out[len(failure):].mean(0)


# -- steering --------------------------------------------------------------------------


def steer_spec(layer: int, component: str, v: Tensor, alpha: float) -> Steer:
    return Steer(layer=layer, vector=tuple(v.tolist()), alpha=float(alpha), site=COMPONENT_SITE[component])


def steering_sweep(lm: LoadedModel, task: Task, failure: Sequence[Question], panel: Sequence[Question], layer: int,
                   component: str, v: Tensor, *, alphas: Sequence[float] = DEFAULT_ALPHAS, decoding: Decoding,
                   run: RunDir | None = None, batch_size: int = 32, progress: bool = False) -> pd.DataFrame:
    """Table (alpha, direction, rate, n): rescue = -alpha v on the failure set (rate:
    now right), induction = +alpha v on the panel (rate: now wrong)."""
    rows = []
    for alpha in alphas:
        rows += [Row(q, (steer_spec(layer, component, v, -alpha),), str(ProbeLabel.steer("rescue", alpha))) for q in failure]
        rows += [Row(q, (steer_spec(layer, component, v, alpha),), str(ProbeLabel.steer("induction", alpha))) for q in panel]
    records = run_rows(lm, task, rows, decoding, run, batch_size=batch_size, desc="steer", progress=progress)
    table = []
    for alpha in alphas:
        rescue, _ = rates(records, failure, (), str(ProbeLabel.steer("rescue", alpha)))
        _, induction = rates(records, (), panel, str(ProbeLabel.steer("induction", alpha)))
        table.append({"alpha": float(alpha), "direction": "rescue", "rate": rescue, "n": len(failure)})
        table.append({"alpha": float(alpha), "direction": "induction", "rate": induction, "n": len(panel)})
    return pd.DataFrame(table)


# -- units -----------------------------------------------------------------------------


def unit_scores(lm: LoadedModel, task: Task, failure: Sequence[Question], layer: int, v: Tensor, batch_size: int = 16) -> Float[Tensor, "d_mlp"]:
    """Directional contribution of each MLP unit of `layer` along v, averaged over the
    failure set at the last prompt position."""
    key = ("mlp.hook_post", layer)
    acts = last_position(lm, [prompt_ids(lm, task, q) for q in failure], [key], batch_size)[key]
    w_out = lm.bridge.blocks[layer].mlp.W_out.detach().float().cpu()  # (d_mlp, d_model)
    return acts.mean(0) * (w_out @ v.float().cpu())


def top_units(scores: Tensor, k: int) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.argsort(scores, descending=True, stable=True)[:k])


def random_units(d_mlp: int, k: int, seed: int) -> tuple[int, ...]:
    return tuple(int(i) for i in np.random.default_rng([seed, k]).choice(d_mlp, size=k, replace=False))


def units_sweep(lm: LoadedModel, task: Task, failure: Sequence[Question], layer: int, scores: Tensor, *,
                ks: Sequence[int] = DEFAULT_KS, seed: int = 0, decoding: Decoding, run: RunDir | None = None,
                batch_size: int = 32, progress: bool = False) -> tuple[pd.DataFrame, float]:
    """Table (k, selection, units_hash, repair_rate, recovered_fraction, n) and the
    whole-MLP repair rate it is a fraction of (NaN fractions when that is 0)."""
    d_mlp = scores.shape[0]
    ks = [k for k in ks if 0 < k <= d_mlp]
    block = (Ablate("mlp", layer),)
    sets = {("block", 0): block}
    for k in ks:
        sets[("top", k)] = (AblateUnits(layer, top_units(scores, k)),)
        sets[("random", k)] = (AblateUnits(layer, random_units(d_mlp, k, seed)),)
    probe = {key: (ablation_probe("mlp", layer) if key[0] == "block" else str(ProbeLabel.units(*key))) for key in sets}
    rows = [Row(q, specs, probe[key]) for key, specs in sets.items() for q in failure]
    records = run_rows(lm, task, rows, decoding, run, batch_size=batch_size, desc="units", progress=progress)
    whole, _ = rates(records, failure, (), probe[("block", 0)])
    table = []
    for (selection, k), specs in sets.items():
        if selection == "block":
            continue
        repair, _ = rates(records, failure, (), probe[(selection, k)])
        table.append({"k": k, "selection": selection, "units": set_id(specs), "repair_rate": repair,
                      "recovered_fraction": repair / whole if whole > 0 else float("nan"), "n": len(failure)})
    return pd.DataFrame(table), whole


# -- run folders -------------------------------------------------------------------------


def choose_block(lm: LoadedModel, task: Task, cohort: Cohort, run: RunDir, *, layer: int | None, component: str,
                 repair_run: Path | None, decoding: Decoding, batch_size: int, progress: bool) -> tuple[int, str]:
    """The block to steer: given, else the best of a repair run, else found by sweeping
    this component (written as this run's `repair` table)."""
    if layer is not None:
        return layer, f"given (--layer {layer})"
    if repair_run is not None:
        best = RunDir(repair_run).read_summary().get("best", {}).get(component)
        if best is None:
            raise ValueError(f"repair run {repair_run} found no {component} block that repairs anything")
        return int(best["layer"]), f"best {component} block of repair run {repair_run}"
    table = silencing_sweep(lm, task, cohort.failure, cohort.panel, decoding=decoding, components=(component,),
                            run=run, batch_size=batch_size, progress=progress)
    run.write_table("repair", table)
    best = best_blocks(table).get(component)
    if best is None:
        raise ValueError(f"no {component} block repairs any of the {len(cohort.failure)} failures; pass --layer")
    return int(best["layer"]), f"best {component} block of this run's sweep (selectivity {best['selectivity']:.3f})"


def _cohort_from(run: RunDir, repair_run: Path | None, task: Task, lm: LoadedModel, **kw) -> Cohort:
    """This run's cohort, or the one stored in `repair_run` (same questions) so steering
    and units act on exactly the sets the sweep used."""
    cohort = build_cohort(lm, task, run, **kw)
    if repair_run is None:
        return cohort
    src = RunDir(repair_run)
    by_id = {q.id: q for q in task.questions}
    f_ids, p_ids = src.read_json("failure_set"), src.read_json("healthy_panel")
    missing = [i for i in f_ids["question_ids"] + p_ids["question_ids"] if i not in by_id]
    if missing:
        raise ValueError(f"repair run {repair_run} names questions not in this task (e.g. {missing[0]}): use the same --task/--n")
    cohort.failure = [by_id[i] for i in f_ids["question_ids"]]
    cohort.panel = [by_id[i] for i in p_ids["question_ids"]]
    cohort.failure_criterion, cohort.panel_criterion = f_ids["criterion"], p_ids["criterion"]
    run.write_json("failure_set", cohort.failure_json())
    run.write_json("healthy_panel", cohort.panel_json())
    return cohort


def run_steer(lm: LoadedModel, task: Task, out: str | Path, *, layer: int | None = None, component: str = "mlp",
              repair_run: Path | None = None, alphas: Sequence[float] = DEFAULT_ALPHAS, readout: str = "option:mean",
              panel: int | None = 8, decoding: Decoding | None = None, batch_size: int = 32,
              progress: bool = True) -> dict[str, Any]:
    """Direction for the chosen block, rescue and induction curves (kind "steer")."""
    decoding = decoding or deployed_decoding(task)
    run = RunDir.create(out, localisation_config("steer", lm, task, decoding, readout, panel, batch_size, layer=layer,
                                           component=component, repair_run=str(repair_run) if repair_run else None,
                                           alphas=[float(a) for a in alphas]))
    cohort = _cohort_from(run, repair_run, task, lm, readout=readout, panel=panel, decoding=decoding,
                          batch_size=batch_size, progress=progress)
    summary = {"kind": "steer", "model": lm.spec, "task": task.name, **cohort_summary(cohort),
               **multiple_choice_readings(task, run.read_records(), cohort.failure)}
    if not cohort.failure or not cohort.panel:
        summary["skipped"] = cohort.why_empty() or "the healthy panel is empty (no question answered right)"
        run.write_table("steering", pd.DataFrame(columns=["alpha", "direction", "rate", "n"]))
        run.write_summary(summary)
        return summary
    chosen, why = choose_block(lm, task, cohort, run, layer=layer, component=component, repair_run=repair_run,
                               decoding=decoding, batch_size=batch_size, progress=progress)
    v = direction(lm, task, cohort.failure, cohort.panel, chosen, component)
    run.write_json("direction", {"layer": chosen, "component": component, "site": COMPONENT_SITE[component],
                                 "norm": float(v.norm()), "vector": v.tolist(), "why": why})
    table = steering_sweep(lm, task, cohort.failure, cohort.panel, chosen, component, v, alphas=alphas,
                           decoding=decoding, run=run, batch_size=batch_size, progress=progress)
    run.write_table("steering", table)
    summary.update({"layer": chosen, "component": component, "block_choice": why, "v_norm": float(v.norm()),
                    "table": table.to_dict(orient="records")})
    rescues = [str(ProbeLabel.steer("rescue", alpha)) for alpha in alphas]
    summary.update(multiple_choice_readings(task, run.read_records(), cohort.failure, rescues))
    run.write_summary(summary)
    return summary


def run_units(lm: LoadedModel, task: Task, out: str | Path, *, layer: int | None = None, repair_run: Path | None = None,
              ks: Sequence[int] = DEFAULT_KS, seed: int = 0, readout: str = "option:mean", panel: int | None = 8,
              decoding: Decoding | None = None, batch_size: int = 32, progress: bool = True) -> dict[str, Any]:
    """Top-k units by directional contribution vs k random units (kind "units")."""
    decoding = decoding or deployed_decoding(task)
    run = RunDir.create(out, localisation_config("units", lm, task, decoding, readout, panel, batch_size, layer=layer,
                                           repair_run=str(repair_run) if repair_run else None,
                                           ks=[int(k) for k in ks], seed=seed))
    cohort = _cohort_from(run, repair_run, task, lm, readout=readout, panel=panel, decoding=decoding,
                          batch_size=batch_size, progress=progress)
    summary = {"kind": "units", "model": lm.spec, "task": task.name, **cohort_summary(cohort),
               **multiple_choice_readings(task, run.read_records(), cohort.failure)}
    if not cohort.failure or not cohort.panel:
        summary["skipped"] = cohort.why_empty() or "the healthy panel is empty (no question answered right)"
        run.write_table("units", pd.DataFrame(columns=["k", "selection", "recovered_fraction"]))
        run.write_summary(summary)
        return summary
    chosen, why = choose_block(lm, task, cohort, run, layer=layer, component="mlp", repair_run=repair_run,
                               decoding=decoding, batch_size=batch_size, progress=progress)
    v = direction(lm, task, cohort.failure, cohort.panel, chosen, "mlp")
    scores = unit_scores(lm, task, cohort.failure, chosen, v)
    table, whole = units_sweep(lm, task, cohort.failure, chosen, scores, ks=ks, seed=seed, decoding=decoding,
                               run=run, batch_size=batch_size, progress=progress)
    run.write_table("units", table)
    run.write_table("unit_scores", pd.DataFrame({"unit": range(len(scores)), "score": scores.numpy()}))
    summary.update({"layer": chosen, "block_choice": why, "whole_block_repair": whole,
                    "table": table.to_dict(orient="records")})
    run.write_summary(summary)
    return summary
