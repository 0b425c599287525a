"""Reciprocal steering and unit-level repair for one block found by the silencing sweep.

Direction. For block (layer l, component c), v is the mean of the block's output at the
last prompt position over the failure set minus its mean over the healthy panel. The
block's output is read at its site in the site table (`interventions.COMPONENT_SITE`:
``hook_mlp_out`` for c = mlp, ``hook_attn_out`` for attn), or is ``hook_resid_post -
hook_resid_pre`` (the whole layer's write). v points from "answers right" towards
"recognises but answers wrong".

Steering adds ``alpha * u`` to that same output at every position (`Steer` at the
block's site). Rescue: ``-alpha * u`` on the failure set, rate = fraction now right.
Induction: ``+alpha * u`` on the healthy panel, rate = fraction now wrong, and beside it
the fraction now wrong with an answer the failure set's selection part gave
(``as_failure_rate``): the failure induced, told apart from a push that breaks the
answer into something else (the paper's "+alpha v induces the failure"). The scale of
u is stated (`AlphaUnit`): by default ("rms") u = s * v / |v|, v normalised to unit
length and s the residual stream's RMS norm at that layer (``hook_resid_post``, last
prompt position, over the selection questions), so alpha = 1 adds a vector as long as a
typical residual vector there, whatever |v| and the model's activation scale; with
"raw", u = v (the unnormalised difference of means, alpha a multiple of it), kept for
comparison and labelled; with "write", u = w * v / |v| and w the RMS norm of the block's
own write where v is read (`read_block`), for a model whose residual stream is far longer
than what one block writes (Gemma 3 at block 16: 11.5 times v's norm), where the RMS
unit's smallest step is already a push larger than the block's whole effect. The paper
gives its alphas (-8v, +4v) without a scale.

Held out. The block, v and the unit scores come from the selection parts of the failure
set and panel (`cohort.Split`); rescue, induction and unit repair are measured on the
held-out parts, each rate with a Wilson interval on its own denominator.

Units. Each MLP unit i of the block writes ``act_i * W_out[i]`` into the MLP output;
its directional contribution is that write, as it reaches the residual stream, dotted
with v and averaged over the failure set (act at ``mlp.hook_post``, last prompt
position). Where the site table has a post-MLP norm (Gemma-2/3) the write passes
through it first (`unit_contributions`). Silencing the top-k units
(`AblateUnits`) is compared with silencing the whole MLP output: recovered fraction =
repair(top-k) / repair(whole MLP); `DEFAULT_DRAWS` (20) seeded draws of k random units
are the control, reported with their spread (`units_spread`).

Permutation control (opt-in): the rescue at every non-zero alpha, and the whole block
and top-k unit sets, re-scored on the held-out failures with each question's options
rotated by one (`readings.run_permutation_control`). With a circular cohort every row is
asked under every cyclic shift of its options, and a flip counts only when it holds
under all of them.

Rows, the cohort and run configs come from `cohort.py`; tables go to the run folder and
the report draws them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Collection, Mapping, NamedTuple, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from rnr_interp.analyses.localise.circular import ROTATION, circular_rows
from rnr_interp.analyses.localise.cohort import (
    PANEL_CAP, Cohort, CohortRun, Split, check_localisation_options, localisation_config, open_cohort,
)
from rnr_interp.analyses.localise.defaults import ALPHA_UNITS, DEFAULT_DRAWS, DEFAULT_KS
from rnr_interp.analyses.localise.directions import (
    block_writes, direction, last_position, mean_difference, read_ids, top_units, unit_scores, write_sites,
)
from rnr_interp.analyses.localise.positions import check_read_at, read_setting
from rnr_interp.analyses.localise.readings import as_failure_count, check_permutation_control, outcome_counts, rates
from rnr_interp.engine.rows import run_rows
from rnr_interp.engine.rows import Row
from rnr_interp.engine.decoding import Decoding
from rnr_interp.interventions import (
    COMPONENT_SITE, Ablate, AblateUnits, Clamp, Steer, check_steer_at, set_id, site_hook, split_hook_name,
)
from rnr_interp.metrics import INDUCTION_EFFECT, RESCUE_EFFECT, proportion, wilson_power
from rnr_interp.models import LoadedModel
from rnr_interp.records import REPAIR, STEER, UNITS, ProbeLabel, RunDir, SteerSummary, UnitsSummary
from rnr_interp.analyses.localise.choice import best_blocks, break_tie
from rnr_interp.analyses.localise.repair import ablation_probe, sweep_cohort
from rnr_interp.engine.sampling import deployed_decoding
from rnr_interp.tasks.base import Question, Task

ALPHA_UNIT_WORDS = {
    "rms": "multiples of the residual stream's RMS norm at the block's layer (hook_resid_post, last prompt position, "
           "selection questions), along v normalised to unit length",
    "raw": "multiples of the unnormalised v (difference of mean block outputs): its length varies by model, task and "
           "block, so raw alphas do not compare across cells",
    "write": "multiples of the RMS norm of the block's own write (its output where v is read, selection questions), "
             "along v normalised to unit length: a model whose residual stream is much longer than what one block "
             "writes (Gemma 3) is steered on the scale the block acts on",
}
#: the default grid per unit: rms alphas are fractions of a typical residual vector's
#: length, write alphas of a typical write of the block
DEFAULT_ALPHAS_BY_UNIT = {"rms": (0.0, 0.125, 0.25, 0.5, 1.0, 2.0), "raw": (0.0, 0.5, 1.0, 2.0, 4.0, 8.0),
                          "write": (0.0, 0.125, 0.25, 0.5, 1.0, 2.0)}
DEFAULT_ALPHAS = DEFAULT_ALPHAS_BY_UNIT["rms"]


# -- activations -----------------------------------------------------------------------


class BlockReading(NamedTuple):
    """What steering reads of the chosen block on the selection parts (`read_block`)."""

    v: Float[Tensor, "d"] | None  # mean write over the failures - over the panel (None without both)
    residual_rms: float  # the residual stream's RMS norm after the block: the "rms" alpha unit
    write_rms: float  # of what the block writes, or of the activation at a given vector's site: the "write" unit
    panel_mean: Float[Tensor, "d"] | None  # the panel's mean write (what the clamp control clamps to)
    deviations: Float[Tensor, "n_failure d"] | None  # each failure's write minus the panel's mean (the clamp's span)


def read_block(lm: LoadedModel, task: Task, failure: Sequence[Question], panel: Sequence[Question], layer: int,
               component: str, site: str | None = None, batch_size: int = 16,
               contexts: Mapping[str, Sequence[int]] | None = None) -> BlockReading:
    """What steering reads of block (`layer`, `component`) at the last position of each
    question's context (`read_ids`), failures then panel, in one forward pass: v (as
    `directions.direction`), the RMS norms of the residual stream after the block
    (``hook_resid_post``) and of what the block writes, or of the activation at `site`
    of that block where a given vector is added there, the panel's mean write and each
    failure's write minus it; an RMS norm is sqrt(mean of |x|^2)."""
    ids = read_ids(lm, task, [*failure, *panel], contexts)
    if not ids:
        raise ValueError("steering's scales need at least one question")
    resid = ("hook_resid_post", layer)
    at_site = [] if site is None else [(site, layer)]
    acts = last_position(lm, ids, [*write_sites([layer], component), resid, *at_site], batch_size)
    write = block_writes(acts, [layer], component)[layer]
    v = mean_difference(write, len(failure)) if failure and panel else None
    panel_mean = write[len(failure):].mean(0) if panel else None
    return BlockReading(v, rms_norm(acts[resid]), rms_norm(write if site is None else acts[site, layer]), panel_mean,
                        write[:len(failure)] - panel_mean if panel_mean is not None and failure else None)


def rms_norm(acts: Float[Tensor, "n d"]) -> float:
    return float(acts.pow(2).sum(-1).mean().sqrt())


def steering_vector(v: Tensor, unit: str, scale: float) -> Tensor:
    """u, the vector alpha multiplies: scale * v / |v| ("rms": the residual's RMS norm;
    "write": the block's write's, `write_rms`) or v itself ("raw")."""
    check_alpha_unit(unit)
    if unit == "raw":
        return v
    norm = float(v.norm())
    if norm == 0:
        raise ValueError("v is zero (the failure set and panel have the same mean block output): no direction to steer")
    return v / norm * scale


# -- steering --------------------------------------------------------------------------


def steer_spec(layer: int, component: str, v: Tensor, alpha: float, site: str | None = None, at: str = "every") -> Steer:
    """Steering along v at block `layer`: at `site` if given, else where `component`
    writes; at every position, the prompt's last one, or that and every generated one
    (`at`, `STEER_AT`)."""
    return Steer(layer=layer, vector=tuple(v.tolist()), alpha=float(alpha), site=site or COMPONENT_SITE[component], at=at)


def given_vector(lm: LoadedModel, vector: Tensor, site: str | None, layer: int | None, component: str) -> tuple[int, str]:
    """The block and site a given steering vector is added at (the site's own block when
    it is a full ``blocks.N.`` name), after checking the vector fits that point."""
    named, within = split_hook_name(site or COMPONENT_SITE[component])
    if named is not None and layer is not None and named != layer:
        raise ValueError(f"site {site!r} is in block {named}, but --layer is {layer}")
    layer, site = (named, within) if named is not None else (layer, within)
    if layer is None:
        raise ValueError(f"a given vector needs its block: pass --layer, or a full site name such as blocks.3.{site}")
    check_localisation_options(lm, layer=layer)
    name = site_hook(lm, site, layer)
    v = torch.as_tensor(vector)
    if v.ndim != 1 or not torch.is_floating_point(v) or not bool(torch.isfinite(v).all()):
        raise ValueError(f"the steering vector must be one finite row of numbers, got a tensor of shape {tuple(v.shape)} ({v.dtype})")
    width = last_position(lm, [[lm.pad_id]], [(site, layer)])[(site, layer)].shape[-1]
    if v.shape[0] != width:
        raise ValueError(f"the steering vector has {v.shape[0]} numbers but {name} has {width}")
    return layer, site


#: an induction row's count, rate and Wilson interval of answers that take the failure set's form
AS_FAILURE_COLUMNS = ("as_failure_k", "as_failure_rate", "as_failure_lo", "as_failure_hi")

#: the seed of the random direction a steering run's control steers along (`random_direction`)
RANDOM_DIRECTION_SEED = 0


def random_direction(like: Float[Tensor, " d"], seed: int = RANDOM_DIRECTION_SEED) -> Float[Tensor, " d"]:
    """A direction drawn uniformly from the sphere (a seeded Gaussian, normalised), as
    long as `like`: what steering along v is compared with, so a rescue or an induction
    that any push of that size gives is not read as the direction's."""
    r = torch.randn(like.shape[0], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (r / r.norm() * like.double().norm()).to(like.dtype)


def steering_sweep(lm: LoadedModel, task: Task, failure: Sequence[Question], panel: Sequence[Question], layer: int,
                   component: str, v: Tensor, *, alphas: Sequence[float] = DEFAULT_ALPHAS, decoding: Decoding,
                   run: RunDir | None = None, batch_size: int = 32, progress: bool = False,
                   level: float = 0.95, circular: bool = False, site: str | None = None, at: str = "every",
                   control: str = "", failure_answers: Collection[str] | None = None) -> pd.DataFrame:
    """Table (alpha, direction, rate, lo, hi, k, n): rescue = -alpha v on `failure`
    (rate: now right), induction = +alpha v on `panel` (rate: now wrong); Wilson
    interval on each rate's own denominator. Pass the held-out parts: v is chosen on
    the selection parts. `v` is the vector alpha multiplies (`steering_vector`).
    `circular`: right means right under every cyclic shift of the options. `at`: where
    the vector is added (`STEER_AT`). `control`: a suffix of the probes' directions
    ("-random": ``steer:rescue-random:A``), for a control vector's sweep beside v's.
    `failure_answers`: the failure set's own answers; induction rows then also count
    the panel answers now wrong *with one of them* (``as_failure_k``, ``as_failure_rate``
    with ``as_failure_lo``/``as_failure_hi``: the failure induced, not any breakage;
    `readings.as_failure_count`), NaN on rescue rows and without it."""
    rescue, induction = f"rescue{control}", f"induction{control}"
    rows = []
    for alpha in alphas:
        rows += [Row(q, (steer_spec(layer, component, v, -alpha, site, at),), str(ProbeLabel.steer(rescue, alpha))) for q in failure]
        rows += [Row(q, (steer_spec(layer, component, v, alpha, site, at),), str(ProbeLabel.steer(induction, alpha))) for q in panel]
    records = run_rows(lm, task, circular_rows(rows) if circular else rows, decoding, run, batch_size=batch_size,
                       desc=f"steer{control}", progress=progress)
    table = []
    for alpha in alphas:
        induced = str(ProbeLabel.steer(induction, alpha))
        fixed, n_f = outcome_counts(records, failure, str(ProbeLabel.steer(rescue, alpha)), circular)
        right, n_p = outcome_counts(records, panel, induced, circular)
        for way, p in (("rescue", proportion(fixed, n_f, level)), ("induction", proportion(n_p - right, n_p, level))):
            form = dict.fromkeys(AS_FAILURE_COLUMNS, float("nan"))
            if way == "induction" and failure_answers is not None:
                f = proportion(as_failure_count(records, panel, induced, failure_answers), n_p, level)
                form = dict(zip(AS_FAILURE_COLUMNS, (f["k"], f["rate"], f["ci"][0], f["ci"][1])))
            table.append({"alpha": float(alpha), "direction": way, "rate": p["rate"], "lo": p["ci"][0],
                          "hi": p["ci"][1], "k": p["k"], "n": p["n"], **form})
    return pd.DataFrame(table)


#: the clamp control's span: the fewest top singular directions of the selection failures'
#: writes minus the panel's mean that hold this share of their squared length
CLAMP_ENERGY = 0.99


def failure_span(deviations: Float[Tensor, "n d"], energy: float = CLAMP_ENERGY) -> tuple[Float[Tensor, "k d"], list[float]]:
    """The orthonormal directions (rows) of the fewest top singular directions of
    `deviations` that hold `energy` of their squared length, and every direction's share
    of it (the spectrum, largest first)."""
    _, s, vt = torch.linalg.svd(deviations.double(), full_matrices=False)
    if not float((s ** 2).sum()) > 0:
        raise ValueError("the failures' writes equal the panel's mean: no span to clamp")
    shares = (s ** 2 / (s ** 2).sum()).tolist()
    k = next(i + 1 for i, total in enumerate(np.cumsum(shares)) if total >= energy - 1e-12)
    return vt[:k], shares


def random_span(k: int, d: int, seed: int = RANDOM_DIRECTION_SEED) -> Float[Tensor, "k d"]:
    """k orthonormal directions drawn uniformly (a seeded Gaussian matrix, QR)."""
    g = torch.randn(d, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.linalg.qr(g)[0].T


def check_clampable(component: str) -> None:
    if component not in ("mlp", "attn"):
        raise ValueError(f"the clamp control clamps an MLP or attention block's write, not a {component!r}'s")


def clamp_sweep(lm: LoadedModel, task: Task, failure: Sequence[Question], panel: Sequence[Question], layer: int,
                component: str, spans: Mapping[str, tuple[Tensor, Tensor]], *, decoding: Decoding,
                run: RunDir | None = None, batch_size: int = 32, progress: bool = False, level: float = 0.95,
                circular: bool = False, at: str = "every") -> pd.DataFrame:
    """Table (clamped, rank, way, rate, lo, hi, k, n): for each `spans` entry (name ->
    (orthonormal rows, the values along them)), the block's write clamped to those values
    within their span (`Clamp`, at the positions `at` names) on `failure` (way "rescue",
    rate: now right) and on `panel` (way "damage", rate: now wrong), each with its Wilson
    interval. Probes ``steer:clamp-rescue-NAME:1`` / ``steer:clamp-damage-NAME:1``."""
    check_clampable(component)
    site = COMPONENT_SITE[component]
    probes, rows = {}, []
    for name, (basis, values) in spans.items():
        spec = Clamp(layer=layer, basis=tuple(map(tuple, basis.tolist())), values=tuple(values.tolist()), site=site, at=at)
        for way, questions in (("rescue", failure), ("damage", panel)):
            probes[name, way] = str(ProbeLabel.steer(f"clamp-{way}-{name}", 1))
            rows += [Row(q, (spec,), probes[name, way]) for q in questions]
    records = run_rows(lm, task, circular_rows(rows) if circular else rows, decoding, run, batch_size=batch_size,
                       desc="clamp", progress=progress)
    table = []
    for (name, way), probe in probes.items():
        right, n = outcome_counts(records, failure if way == "rescue" else panel, probe, circular)
        p = proportion(right if way == "rescue" else n - right, n, level)
        table.append({"clamped": name, "rank": int(spans[name][0].shape[0]), "way": way, "rate": p["rate"],
                      "lo": p["ci"][0], "hi": p["ci"][1], "k": p["k"], "n": p["n"]})
    return pd.DataFrame(table)


# -- units -----------------------------------------------------------------------------


def random_units(d_mlp: int, k: int, seed: int, draw: int = 0) -> tuple[int, ...]:
    return tuple(int(i) for i in np.random.default_rng([seed, k, draw]).choice(d_mlp, size=k, replace=False))




def units_sweep(lm: LoadedModel, task: Task, failure: Sequence[Question], layer: int, scores: Tensor, *,
                ks: Sequence[int] = DEFAULT_KS, seed: int = 0, draws: int = DEFAULT_DRAWS, decoding: Decoding,
                run: RunDir | None = None, batch_size: int = 32, progress: bool = False,
                circular: bool = False) -> tuple[pd.DataFrame, float]:
    """Table (k, selection, draw, units, repair_rate, recovered_fraction, n): the top-k
    units and `draws` sets of k random units (seeded) silenced on `failure` (the
    held-out part), and the whole-MLP repair rate there that the fractions divide (NaN
    fractions when it is 0)."""
    if draws < 1:
        raise ValueError(f"the random-k control needs at least one draw, got {draws}")
    d_mlp = scores.shape[0]
    ks = [k for k in ks if 0 < k <= d_mlp]
    sets: dict[tuple[str, int, int], tuple] = {("block", 0, 0): (Ablate("mlp", layer),)}
    for k in ks:
        sets[("top", k, 0)] = (AblateUnits(layer, top_units(scores, k)),)
        for draw in range(draws):
            sets[("random", k, draw)] = (AblateUnits(layer, random_units(d_mlp, k, seed, draw)),)
    probe = {key: ablation_probe("mlp", layer) if key[0] == "block" else
             str(ProbeLabel.units("top", key[1])) if key[0] == "top" else str(ProbeLabel.units("random", key[1], key[2]))
             for key in sets}
    rows = [Row(q, specs, probe[key]) for key, specs in sets.items() for q in failure]
    records = run_rows(lm, task, circular_rows(rows) if circular else rows, decoding, run, batch_size=batch_size,
                       desc="units", progress=progress)
    whole, _ = rates(records, failure, (), probe[("block", 0, 0)], circular)
    table = []
    for (selection, k, draw), specs in sets.items():
        if selection == "block":
            continue
        repair, _ = rates(records, failure, (), probe[(selection, k, draw)], circular)
        table.append({"k": k, "selection": selection, "draw": draw, "units": set_id(specs), "repair_rate": repair,
                      "recovered_fraction": repair / whole if whole > 0 else float("nan"), "n": len(failure)})
    return pd.DataFrame(table), whole


def units_spread(table: pd.DataFrame) -> pd.DataFrame:
    """Per k: the top-k recovered fraction and the random-k draws' mean, sd, min,
    10th/90th percentile and max (the control's spread)."""
    rows = []
    for k, sub in table.groupby("k"):
        top = sub.loc[sub["selection"] == "top", "recovered_fraction"]
        rnd = sub.loc[sub["selection"] == "random", "recovered_fraction"].to_numpy(float)
        spread = ({"random_mean": float(np.mean(rnd)), "random_sd": float(np.std(rnd, ddof=1)) if len(rnd) > 1 else 0.0,
                   "random_min": float(np.min(rnd)), "random_p10": float(np.quantile(rnd, 0.1)),
                   "random_p90": float(np.quantile(rnd, 0.9)), "random_max": float(np.max(rnd))}
                  if len(rnd) and not np.isnan(rnd).all() else
                  dict.fromkeys(("random_mean", "random_sd", "random_min", "random_p10", "random_p90", "random_max"), float("nan")))
        rows.append({"k": int(k), "top": float(top.iloc[0]) if len(top) else float("nan"), "n_draws": int(len(rnd)), **spread})
    return pd.DataFrame(rows)


# -- run folders -------------------------------------------------------------------------


def choose_block(c: CohortRun, *, layer: int | None, component: str, repair_run: Path | None,
                 contexts: Mapping[str, Sequence[int]] | None = None) -> tuple[int, str]:
    """The block to steer: given, else the one a repair run chose (for the MLP its
    chosen block, else the component's own best), else found by sweeping this component
    over this run's cohort `c` (its `repair` table, ties broken as `choice.break_tie`
    breaks them from the cohort's deployed replies, reading each question at the end of
    its context in `contexts`, as v is read); always chosen on the selection part."""
    if layer is not None:
        return layer, f"given (--layer {layer})"
    if repair_run is not None:
        source = RunDir(repair_run)
        source.require_kind(REPAIR, "pass the folder `rnr repair` wrote, or --layer")
        summary = source.read_summary()
        if summary.own_best is None:
            raise ValueError(f"repair run {repair_run} has no chosen blocks in its summary (written by an older "
                             "version): rerun `rnr repair` on it, or pass --layer")
        own_best = summary.own_best
        if component not in own_best:
            raise ValueError(f"repair run {repair_run} swept {component} only at its chosen MLP layer "
                             f"(--sweep {summary.sweep}), so it has no {component} block of its own: "
                             f"pass --layer, or rerun repair with --sweep all")
        best = own_best[component]
        if best is None:
            raise ValueError(f"repair run {repair_run} found no {component} block that repairs any selection-part failure")
        return int(best["selection"]["layer"]), f"{component} block chosen on the selection part by repair run {repair_run}"
    table = sweep_cohort(c, range(c.lm.n_layers), (component,))
    c.run.write_table("repair", table)
    selection = (c.cohort.parts("failure")[0], c.cohort.parts("panel")[0])
    ties = break_tie(c.lm, c.task, table, selection, batch_size=c.batch_size, component=component, contexts=contexts,
                     replies=c.deployed_replies()) if component == "mlp" else {}
    best = best_blocks(table, on="selection", ties=ties).get(component)
    if best is None:
        raise ValueError(f"no {component} block repairs any of the {len(selection[0])} selection-part "
                         "failures; pass --layer")
    return int(best["layer"]), (f"best {component} block of this run's sweep on the selection part "
                                f"(selectivity {best['selectivity']:.3f})")


def check_alpha_unit(alpha_unit: str) -> None:
    if alpha_unit not in ALPHA_UNITS:
        raise ValueError(f"alpha_unit must be one of {', '.join(ALPHA_UNITS)}, got {alpha_unit!r}")


def _cohort_from(run: RunDir, repair_run: Path | None, task: Task, lm: LoadedModel, *, decoding: Decoding,
                 batch_size: int, progress: bool, **settings: Any) -> CohortRun:
    """This run's cohort, or the one stored in `repair_run` (same questions, model,
    prompt, decoding, readout, panel cap and split; read back, nothing recomputed, its
    deployed answers read from there) so steering and units act on exactly the sets the
    sweep used."""
    if repair_run is None:
        return open_cohort(lm, task, run, decoding=decoding, batch_size=batch_size, progress=progress, **settings)
    src = RunDir(repair_run)
    for key in ("model", "question_ids_hash", "deployed", "readout", "panel", "split", "circular"):
        if src.config.get(key) != run.config.get(key):
            raise ValueError(f"repair run {repair_run} differs from this run in {key!r}: "
                             f"{src.config.get(key)!r} != {run.config.get(key)!r} (use the same options)")
    if src.grading != run.grading:  # its failures and panel are right and wrong under its grading
        raise ValueError(f"repair run {repair_run} graded {src.grading}, this run {run.grading}: pass --grading {src.grading}")
    by_id = {q.id: q for q in task.questions}
    f_ids, p_ids, done = src.read_json("failure_set"), src.read_json("healthy_panel"), src.read_summary()
    cohort = Cohort(failure=[by_id[i] for i in f_ids["question_ids"]], panel=[by_id[i] for i in p_ids["question_ids"]],
                    failure_criterion=f_ids["criterion"], panel_criterion=p_ids["criterion"],
                    n_questions=done.n_questions, n_recognised=done.n_recognised,
                    n_deployed_correct=round(done.deployed_accuracy * done.n_questions), split=settings["split"],
                    circular=bool(f_ids.get("circular")), n_letter_locked=int(f_ids.get("n_letter_locked") or 0),
                    letter_bias=f_ids.get("letter_bias"))
    run.write_json("failure_set", cohort.failure_json())
    run.write_json("healthy_panel", cohort.panel_json())
    return CohortRun(lm, task, run, cohort, decoding, batch_size, progress, deployed_from=src)


def _skip(run: RunDir, summary: dict[str, Any], cohort: Cohort, table: str, columns: list[str]) -> dict[str, Any] | None:
    """Write an empty result and say why when a part the analysis needs is empty."""
    f_sel, f_out = cohort.parts("failure")
    p_sel, p_out = cohort.parts("panel")
    reason = cohort.why_empty() or next((f"the {name} is empty" for name, part in (
        ("selection part of the failure set", f_sel), ("held-out part of the failure set", f_out),
        ("selection part of the healthy panel", p_sel), ("held-out part of the healthy panel", p_out)) if not part), None)
    if reason is None:
        return None
    summary["skipped"] = reason
    run.write_table(table, pd.DataFrame(columns=columns))
    return run.write_summary(summary)


def steering_beside_control(run: RunDir) -> pd.DataFrame | None:
    """A steer run's table (`steering_sweep`) with the random direction's rate at the same
    alpha and direction beside v's (column ``random_rate``, and ``random_as_failure_rate``
    where the run read the failure's form); None for a run made without the control
    (`run_steer(random_control=False)`)."""
    if run.read_summary().random_control is None:
        return None
    control = run.read_table("steering_random")
    kept = [c for c in ("rate", "as_failure_rate") if c in control.columns]
    control = control[["alpha", "direction", *kept]].rename(columns={c: f"random_{c}" for c in kept})
    return run.read_table("steering").merge(control, on=["alpha", "direction"], how="left")


def run_steer(lm: LoadedModel, task: Task, out: str | Path, *, layer: int | None = None, component: str = "mlp",
              repair_run: Path | None = None, alphas: Sequence[float] | None = None, alpha_unit: str = "rms",
              readout: str = "option:mean", panel: int | None = PANEL_CAP, split: Split = Split(),
              decoding: Decoding | None = None, permutation_control: bool = False, circular: bool = False,
              batch_size: int = 32, progress: bool = True, vector: Tensor | None = None, site: str | None = None,
              grading: str | None = None, read_at: str = "prompt", steer_at: str = "every",
              random_control: bool = False, clamp_control: bool = False) -> SteerSummary:
    """Direction for the chosen block from the selection parts (or `vector`, added at
    `site` of block `layer`: `given_vector`); rescue and induction
    on the held-out parts (kind "steer"), alpha in `alpha_unit` (`ALPHA_UNITS`; the
    grid defaults to that unit's `DEFAULT_ALPHAS_BY_UNIT`). `permutation_control`
    re-scores the rescue at every non-zero alpha on the held-out failures with options
    rotated (`readings.run_permutation_control`; as many rows again as the rescue, so off
    by default). `circular`: the cohort and every row under every cyclic shift.
    `read_at`: where v and the RMS norm are read (`defaults.READ_AT`): at the end of
    the prompt, or where each deployed reply's answer starts. `steer_at`: where the
    vector is added (`STEER_AT`): at every position, the prompt's last one, or that and
    every generated one.
    `random_control`: the same sweep along a random direction as long as the steered
    vector (`random_direction`), table ``steering_random`` and the summary's
    ``random_control`` (as many rows again, so off by default).
    `clamp_control`: the held-out failures and panel with the block's write clamped to
    the selection panel's mean (`Clamp`, where the vector is added) along v, within the
    span of the selection failures' writes, and within a random span of that rank: a
    rescue for a failure whose write differs in size or direction from question to
    question (one unit per wrong answer), which no single alpha along one v undoes (table
    ``steering_clamp``, the summary's ``clamp_control``; an MLP or attention block's own
    v only)."""
    check_read_at(read_at)
    check_steer_at(steer_at)
    check_alpha_unit(alpha_unit)
    alphas = DEFAULT_ALPHAS_BY_UNIT[alpha_unit] if alphas is None else alphas
    if permutation_control:
        check_permutation_control(task)
    decoding = decoding or deployed_decoding(task)
    # only when on, so a default run's config (and run_id) is what it always was
    control = {"permutation_control": {"shift": ROTATION}} if permutation_control else {}
    if vector is not None:
        layer, site = given_vector(lm, vector, site, layer, component)
        digest = hashlib.sha256(torch.as_tensor(vector, dtype=torch.float32).numpy().tobytes()).hexdigest()
        control.update(site=site, vector={"sha256": digest, "size": int(vector.shape[0])})
    elif site is not None:
        raise ValueError("a steering site needs a given vector (--vector); without one v is the block's own output")
    if clamp_control:
        check_clampable(component)
        if vector is not None:
            raise ValueError("the clamp control clamps a block's write within its own failures' span: not with a given vector")
    run = RunDir.create(out, localisation_config(STEER, lm, task, decoding, readout, panel, batch_size, split,
                                                 circular=circular, grading=grading, layer=layer, component=component,
                                                 repair_run=str(repair_run) if repair_run else None,
                                                 alphas=[float(a) for a in alphas], alpha_unit=alpha_unit,
                                                 **read_setting(read_at), **control,
                                                 **({} if steer_at == "every" else {"steer_at": steer_at}),
                                                 **({"random_control": {"seed": RANDOM_DIRECTION_SEED}} if random_control else {}),
                                                 **({"clamp_control": {"seed": RANDOM_DIRECTION_SEED}} if clamp_control else {})))
    c = _cohort_from(run, repair_run, task, lm, readout=readout, panel=panel, split=split, decoding=decoding,
                     batch_size=batch_size, progress=progress, circular=circular)
    cohort, summary = c.cohort, {**c.summary(STEER), **c.readings()}
    if (skipped := _skip(run, summary, cohort, "steering", ["alpha", "direction", "rate", "lo", "hi", "k", "n"])) is not None:
        return skipped
    (f_sel, f_out), (p_sel, p_out) = cohort.parts("failure"), cohort.parts("panel")
    contexts = c.reading_contexts([*f_sel, *p_sel], read_at)
    if vector is None:
        chosen, why = choose_block(c, layer=layer, component=component, repair_run=repair_run, contexts=contexts)
    else:
        chosen, why = layer, f"given with the vector (at {site})"
    reading = read_block(lm, task, f_sel, p_sel, chosen, component, site, contexts=contexts)
    rms, write_rms = reading.residual_rms, reading.write_rms
    v = torch.as_tensor(vector, dtype=torch.float32) if vector is not None else reading.v
    if v is None:
        raise ValueError(f"the steering direction needs a non-empty failure set and panel (got {len(f_sel)} and {len(p_sel)})")
    write = write_rms if alpha_unit == "write" else None  # recorded in its own unit only
    u = steering_vector(v, alpha_unit, rms if write is None else write)
    scales = {"residual_rms": rms, **({} if write is None else {"write_rms": write}), "steered_norm_per_alpha": float(u.norm())}
    run.write_json("direction", {"layer": chosen, "component": component, "site": site or COMPONENT_SITE[component],
                                 "norm": float(v.norm()), "vector": v.tolist(), "why": why,
                                 "from": "selection parts of the failure set and panel" if vector is None else "given",
                                 "alpha_unit": alpha_unit, **scales})
    # the failure's form from the selection part, as v is: the held-out failures are what rescue reads
    failure_answers = c.deployed_answers(f_sel)
    table = steering_sweep(lm, task, f_out, p_out, chosen, component, u, alphas=alphas, decoding=decoding, run=run,
                           batch_size=batch_size, progress=progress, circular=cohort.circular, site=site, at=steer_at,
                           failure_answers=failure_answers)
    for effect, direction_name in ((RESCUE_EFFECT, "rescue"), (INDUCTION_EFFECT, "induction")):
        mine = table["direction"] == direction_name
        table.loc[mine, "power"] = [wilson_power(effect, int(n)) for n in table.loc[mine, "n"]]
    run.write_table("steering", table)
    if clamp_control:
        summary["clamp_control"] = _clamp_control(c, reading, chosen, component, steer_at, decoding, run, batch_size, progress)
    if random_control:
        r = random_direction(u)
        random_table = steering_sweep(lm, task, f_out, p_out, chosen, component, r, alphas=alphas, decoding=decoding, run=run,
                                      batch_size=batch_size, progress=progress, circular=cohort.circular, site=site,
                                      at=steer_at, control="-random", failure_answers=failure_answers)
        run.write_table("steering_random", random_table)
        summary["random_control"] = {"seed": RANDOM_DIRECTION_SEED, "norm": float(r.norm()),
                                     "cosine_with_v": float(r.double() @ u.double() / (r.double().norm() * u.double().norm())),
                                     "table": random_table.to_dict(orient="records")}
    summary.update({"layer": chosen, "component": component, "block_choice": why,
                    "alpha_unit": alpha_unit, "alpha_unit_words": ALPHA_UNIT_WORDS[alpha_unit], "steer_at": steer_at,
                    "failure_answers": sorted(failure_answers), "v_norm": float(v.norm()), **scales,
                    "scored_on": "held-out parts (v and the RMS norm from the selection parts)",
                    "table": table.to_dict(orient="records")})
    rescues = [str(ProbeLabel.steer("rescue", alpha)) for alpha in alphas]
    summary.update(c.readings(rescues))
    if permutation_control:
        # every non-zero alpha: the sweep reports them all and chooses none
        steered = {str(ProbeLabel.steer("rescue", a)): (steer_spec(chosen, component, u, -a, site, steer_at),)
                   for a in alphas if a != 0}
        summary["permutation_control"] = c.permutation_control(steered)
    return run.write_summary(summary)


def _clamp_control(c: CohortRun, reading: BlockReading, layer: int, component: str, at: str, decoding: Decoding,
                   run: RunDir, batch_size: int, progress: bool) -> dict[str, Any]:
    """`run_steer`'s clamp control: the held-out parts with the block's write clamped to
    the selection panel's mean along v ("v"), within the span of the selection failures'
    writes (`failure_span`: "span"), and within as many random directions (`random_span`,
    its seed: "random"); written as table ``steering_clamp``."""
    (_, f_out), (_, p_out) = c.cohort.parts("failure"), c.cohort.parts("panel")
    mean = reading.panel_mean.double()
    span, shares = failure_span(reading.deviations)
    bases = {"v": (reading.v.double() / reading.v.double().norm())[None], "span": span,
             "random": random_span(span.shape[0], span.shape[1])}
    spans = {name: (basis, basis @ mean) for name, basis in bases.items()}
    table = clamp_sweep(c.lm, c.task, f_out, p_out, layer, component, spans, decoding=decoding, run=run,
                        batch_size=batch_size, progress=progress, circular=c.cohort.circular, at=at)
    run.write_table("steering_clamp", table)
    return {"seed": RANDOM_DIRECTION_SEED, "at": at, "energy": CLAMP_ENERGY, "rank": int(span.shape[0]),
            "spectrum": shares, "value_along_v": float(spans["v"][1][0]),
            "failure_value_along_v": float(spans["v"][1][0]) + float(reading.v.double().norm()),
            "table": table.to_dict(orient="records")}


def run_units(lm: LoadedModel, task: Task, out: str | Path, *, layer: int | None = None, repair_run: Path | None = None,
              ks: Sequence[int] = DEFAULT_KS, seed: int = 0, draws: int = DEFAULT_DRAWS, readout: str = "option:mean",
              panel: int | None = PANEL_CAP, split: Split = Split(), decoding: Decoding | None = None,
              permutation_control: bool = False, circular: bool = False, batch_size: int = 32,
              progress: bool = True, grading: str | None = None, read_at: str = "prompt") -> UnitsSummary:
    """Top-k units by directional contribution (scored on the selection part) vs
    `draws` sets of k random units, silenced on the held-out failures (kind "units").
    `permutation_control` re-scores the whole block and every top-k set on the held-out
    failures with options rotated (`readings.run_permutation_control`). `circular`: the
    cohort and every row under every cyclic shift. `read_at`: where v and the units'
    contributions are read (`run_steer`)."""
    check_read_at(read_at)
    if permutation_control:
        check_permutation_control(task)
    decoding = decoding or deployed_decoding(task)
    control = {"permutation_control": {"shift": ROTATION}} if permutation_control else {}
    run = RunDir.create(out, localisation_config(UNITS, lm, task, decoding, readout, panel, batch_size, split,
                                                 circular=circular, grading=grading, layer=layer,
                                                 repair_run=str(repair_run) if repair_run else None,
                                                 ks=[int(k) for k in ks], seed=seed, draws=draws, **read_setting(read_at),
                                                 **control))
    c = _cohort_from(run, repair_run, task, lm, readout=readout, panel=panel, split=split, decoding=decoding,
                     batch_size=batch_size, progress=progress, circular=circular)
    cohort, summary = c.cohort, {**c.summary(UNITS), **c.readings()}
    if (skipped := _skip(run, summary, cohort, "units", ["k", "selection", "draw", "recovered_fraction"])) is not None:
        return skipped
    (f_sel, f_out), (p_sel, _) = cohort.parts("failure"), cohort.parts("panel")
    contexts = c.reading_contexts([*f_sel, *p_sel], read_at)
    chosen, why = choose_block(c, layer=layer, component="mlp", repair_run=repair_run, contexts=contexts)
    v = direction(lm, task, f_sel, p_sel, chosen, "mlp", contexts=contexts)
    scores = unit_scores(lm, task, f_sel, chosen, v, contexts=contexts)
    table, whole = units_sweep(lm, task, f_out, chosen, scores, ks=ks, seed=seed, draws=draws, decoding=decoding,
                               run=run, batch_size=batch_size, progress=progress, circular=cohort.circular)
    spread = units_spread(table)
    run.write_table("units", table)
    run.write_table("units_spread", spread)
    run.write_table("unit_scores", pd.DataFrame({"unit": range(len(scores)), "score": scores.numpy()}))
    summary.update({"layer": chosen, "block_choice": why, "whole_block_repair": whole,
                    "scored_on": "held-out failures (v and unit scores from the selection parts)",
                    "random_draws": draws, "spread": spread.replace({np.nan: None}).to_dict(orient="records"),
                    "table": table.to_dict(orient="records")})
    if permutation_control:
        top = table[table["selection"] == "top"]
        sets = {ablation_probe("mlp", chosen): (Ablate("mlp", chosen),),
                **{str(ProbeLabel.units("top", int(k))): (AblateUnits(chosen, top_units(scores, int(k))),) for k in top["k"]}}
        summary["permutation_control"] = c.permutation_control(sets)
    return run.write_summary(summary)
