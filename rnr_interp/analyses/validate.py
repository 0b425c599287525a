"""End-to-end validation: plant known effects in the user's model (`organisms`), run the
analyses on each organism exactly as a user would (the commands' own analysis functions,
their defaults, the task's deployed decoding), and score what they found against what
was planted.

A validation run folder holds ``organisms/`` (one checkpoint folder per cell),
``runs/`` (the analyses' own run folders, one per cell and analysis) and two tables:

- ``recovery``: one row per (kind, strength, seed, analysis) with ``planted`` (the
  location the analysis should name, as text: "15" or "15|16" where two are the same
  block, "15:576|577" for units of block 15; "" for a null), ``found`` (what the
  analysis named, "" when nothing), ``recovered`` (found is one of the planted; for a
  null, whether it stayed silent about the planted location, see below) and ``score``
  (the recall of the planted units, the cosine of a direction, a rescue or induction
  rate; NaN where the finding is a location alone);
- ``detection``: per kind, analysis and strength, the share recovered with its Wilson
  interval: the detection curve, the end-to-end power at this n.

Two seeds can draw the same organism (the layer kinds' seed only draws the layer, from
the middle half of the model: ten seeds on a 30-layer model gave five distinct layers).
Its weights and ``planted.json`` (but the seed) are then the same bit for bit and every
analysis reads them with the same settings, so the second is one trial counted twice:
``organism`` (a hash of that ground truth, weights' sha256 included) names it, its
analyses run once (a later seed reads the first seed's findings) and every rate and
interval counts distinct organisms (``n``), with the seeds beside (``n_seeds``). With a
`layer` given (`rnr validate --layer`) the kinds planted at a layer are planted there
whatever the seed, so their seeds plant one organism.

Nulls are the strength-0 cells of each kind: the planted layer writes exactly zero (the
planted bias is zero), so the organism computes what the base computes. A null's false
positive is an analysis naming the planted location anyway; a null cell's ``recovered``
is True when it does not.

A planted organism that leaves no failure to localise (no question it makes the model
answer wrong while recognition still ranks the gold first) leaves the localisation
analyses nothing to find: for the kinds with a repair sweep the summary counts the
planted organisms whose repair run found an empty failure set
(``recovery[kind]["n_without_failure"]``), so a miss there reads as the plant's, not
the analyses' (e.g. a model that opens its reply with a formatting token when its first
answer token is pushed down, and then writes the same answer: it breaks no answer).
A cell whose organism the model cannot take (`organisms.NotPlantable`: e.g. no block's
write behind its norm can turn an answer) is no trial: it is left out of the rates and
listed with the reason (``recovery[kind]["not_planted"]``), and the run goes on.

Analyses per kind (`ANALYSES`):

- layer -> ``repair:layer``: `rnr repair --sweep layer` on the organism; found = the
  whole layer its sweep chooses on the selection part (`choice.best_blocks`).
- layer -> ``route:skiponly``: `rnr route --space skiponly` at a small budget
  (`ROUTE_CHECK`: K = 8 routes of random and hill climbing, the blind searches every
  route run has, 8 temperature samples); found = the top of its layer attribution when
  that is a skip above chance (`route_layer_found`, ``layers["skiponly"]["top"]``).
- gap -> ``audit``: `rnr audit` on the organism (K = 32 at T = 1, the task's deployed
  decoding); found = the question groups of ``planted.json`` ("affected", "unaffected")
  on which O_K - D is above its derangement null (`gap_groups_found`), "affected|unaffected"
  when both. The audit runs on every question; only its reading splits them.
- sharpen, new -> ``compare``: `rnr audit` on the pair's ``base/`` and ``trained/`` as
  above, then `rnr compare`; found = the dominant source of the gained answers
  (``gained_from``: "base_reachable" or "base_unreachable", "" with no gains or a tie).
- units -> ``repair:mlp``: `rnr repair --sweep mlp` (with `rnr validate --units K`,
  `--units K`: each MLP block silenced in its top K units alone; each block's
  failure direction, for its units and the tie rule, read where `--read-at` says);
  found = the MLP block
  it chooses on the selection part. ``units:top-k``: `rnr units --repair-run` that repair run
  (the block it chose); score = recall at k of the planted units among the k best
  scored, recovered when at least `RECALL_RECOVERED`. `rnr steer --repair-run` the same
  run gives three rows: ``steer:direction`` (score = cosine of the estimated v with
  the planted direction, recovered when at least `COSINE_RECOVERED`),
  ``steer:rescue`` and ``steer:induction`` (the run steers a random direction of the
  same length beside v, `--random-control`; score = the held-out rate at the alpha where
  it most exceeds the random direction's; recovered when its Wilson interval lies above
  the random direction's rate there; induction's rate counts the panel answers turned to
  an answer the failure set gave, ``as_failure_rate``, not any wrong answer, so a push
  that breaks answers into something else induces nothing; the vector added where `rnr validate --steer-at`
  says, at every position by default, on the grid `--alphas` and `--alpha-unit` give).
  Units and steer read the block where `--read-at` says (the prompt's end by default).
  With `rnr validate --clamp-control` the steer run also clamps the block's write within
  the span of the failures' writes (`rnr steer --clamp-control`), a fourth row:
  ``steer:clamp`` (score = the held-out rescue with the span clamped; recovered when its
  Wilson interval lies above the rescue of a random span of the same rank).
  An analysis of another block than the planted one scores 0.

A null of these kinds names its location when the analysis says what it says of the
effect: "affected" alone (a gap on every question is the base model's own, not the
plant's), or the pair kind's source of gains (a pair at strength 0 is one model twice,
audited with the same seeds: it has no gains at all).
Profile strengths are multiples of each kind's default (layer: 1; gap and sharpen: t's
lead over each affected gold, 2 nats times the validation's probe temperature, for which
they are planted; new: 30 nats; units: the new first token's lead of 1 nat), and the tables carry the
profile's strength.

Golds (``gold``): "base" (the default) anchors the task to the base model, its own
deployed answers as the golds (`analyses.anchor`), so every failure of an organism is
the plant's; "task" keeps the task's golds, where the organism's failures mix the
plant's with the base's own (the user's question, not a test of the instrument).

Every cell resumes: an organism folder with its ``planted.json`` is reused, an analysis
run with its summary is read back, and the tables are rewritten after each cell.

An organism's checkpoint (0.54 GB for the demo model in float32) is dropped once its
cell's analyses are done, ``planted.json`` kept (`rnr validate --keep-organisms` keeps
them all): an analysis that needs it again (a resumed cell whose run folder was deleted)
rebuilds it from its seed and checks it is the same bit for bit (`Organism.checkpoint`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from rnr_interp.analyses.audit import run_audit
from rnr_interp.analyses.checkpoints import compare_runs
from rnr_interp.analyses.anchor import anchor_task
from rnr_interp.analyses.localise.recognition import default_readout
from rnr_interp.analyses.localise.directions import check_units
from rnr_interp.analyses.localise.repair import run_repair
from rnr_interp.analyses.localise.positions import check_read_at
from rnr_interp.analyses.localise.steering import check_alpha_unit, run_steer, run_units, steering_beside_control
from rnr_interp.analyses.routing.config import RouteConfig
from rnr_interp.analyses.routing.run import run_route_audit
from rnr_interp.analyses.routing.spaces import make_space, space_size
from rnr_interp.analyses.organisms import (
    EXPECTED, KINDS, PLANTED_FILE, WEIGHTS_FILE, NotPlantable, Planted, plant, read_planted, seeds_drawing_each_layer,
)
from rnr_interp.engine.decoding import SAMPLING_TEMPERATURE
from rnr_interp.engine.sampling import Probe, deployed_decoding
from rnr_interp.interventions import check_ablation, check_steer_at
from rnr_interp.grading import check_grading, graded, null_summary, question_null
from rnr_interp.metrics import proportion, question_scores
from rnr_interp.models import load_model
from rnr_interp.records import DEFAULT_GRADING, VALIDATE, RepairSummary, RunDir, ValidateSummary
from rnr_interp.tasks.base import Task

RECOVERY_COLUMNS = ("kind", "strength", "seed", "analysis", "planted", "found", "recovered", "score", "organism")
#: the share of the planted units among the top k that counts as recovering them
RECALL_RECOVERED = 0.5
#: the cosine of the estimated and planted directions that counts as recovering it
COSINE_RECOVERED = 0.5


@dataclass(frozen=True)
class Profile:
    """The cells of a validation: every kind at every strength (0: its null) and seed."""

    strengths: tuple[float, ...]
    seeds: tuple[int, ...]
    #: questions per cell when --n is not given
    n: int
    why: str
    #: analyses of `ANALYSES` this profile does not run
    left_out: tuple[str, ...] = ()


PROFILES = {
    # two cells per seed on the demo model: one organism at the default strength, one null
    # without the route check, which costs 8 to 10 minutes an organism on the demo model here
    "quick": Profile(strengths=(0.0, 1.0), seeds=(0, 1, 2), n=24, left_out=("route:skiponly",),
                     why="the default strength and its null at three seeds, without the route check: a first look at recovery"),
    "full": Profile(strengths=(0.0, 0.25, 0.5, 1.0, 2.0), seeds=tuple(range(10)), n=40,
                    why="the detection curve over strengths at ten seeds: rates with intervals narrow enough to read"),
}


def repair_layer_found(summary: RepairSummary) -> int | None:
    """The whole layer a repair run's sweep chose (None: no layer repaired anything)."""
    best = (summary.best or {}).get("layer")
    return None if best is None else int(best["layer"])


def route_layer_found(layers: Mapping[str, Any] | None, space: str = "skiponly") -> int | None:
    """The layer a route run names behind its gains (`layers`: its summary's ``layers``):
    the top of ``layers[space]`` when it skips that layer and is above chance (None
    otherwise, or when the run has no layer attribution)."""
    top = ((layers or {}).get(space) or {}).get("top") or {}
    if top.get("action") != "skip" or not top.get("above_chance"):
        return None
    return int(top["layer"])


@dataclass(frozen=True)
class UnitsFound:
    """What a units run named: its block and every unit of it, best scored first."""

    layer: int
    ranking: tuple[int, ...]


@dataclass(frozen=True)
class DirectionFound:
    """What a steer run estimated: its block and v."""

    layer: int
    vector: tuple[float, ...]


@dataclass(frozen=True)
class RateFound:
    """A steer run's held-out rate (rescue or induction) at the alpha where it most
    exceeds a random direction's of the same length (`run_steer(random_control=True)`),
    with its Wilson interval's lower bound and that random direction's rate."""

    layer: int
    rate: float
    lo: float
    control: float = 0.0


Found = Union[int, str, UnitsFound, DirectionFound, RateFound, None]


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) or 1.0))


def expected_names(expected: Mapping[str, Any], analysis: str) -> list[str]:
    """What `analysis` should name on an organism with these expectations (empty for a
    null): layers for repair and route, the planted units ("15:576|577") for units, the
    block for steer, the question group for the audit, the source of gains for compare."""
    if not expected.get("effect"):
        return []
    if analysis.startswith("repair"):
        return [str(x) for x in expected["repair"]["layers"]]
    if analysis.startswith("route"):
        return [str(x) for x in expected["route"]["skip"]]
    if analysis.startswith("units"):
        return [units_name(expected["units"]["layer"], expected["units"]["units"])]
    if analysis.startswith("steer"):
        return [str(expected["steering"]["layer"])]
    if analysis == "audit":
        return [expected["audit"]["gap_above_null_on"]]
    return [expected[analysis]["gained_from"]]


def units_name(layer: int, units: Sequence[int]) -> str:
    return f"{layer}:{'|'.join(map(str, units))}"


def null_names(planted: Planted, analysis: str) -> list[str]:
    """What `analysis` would name on a null if it named the planted location: the
    units or block planted at strength 0, or for an answer-bias null what the effect is
    named at strength > 0."""
    location = planted.location
    if "units" in location and analysis.startswith("units"):
        return [units_name(location["layer"], location["units"])]
    if "layer" in location:
        return [str(location["layer"])]
    return expected_names({"effect": True, **EXPECTED[planted.kind]}, analysis)


def finding(planted: Planted, analysis: str, found: Found, names: Sequence[str]) -> tuple[str, float, bool]:
    """What `analysis` named (as text), its score (NaN where the finding is a location
    alone) and whether it named one of `names` (the planted, or for a null the planted
    location)."""
    if isinstance(found, UnitsFound):
        units = list(planted.location["units"])
        top = found.ranking[:len(units)]
        recall = len(set(top) & set(units)) / len(units) if found.layer == planted.location["layer"] else 0.0
        return units_name(found.layer, top), recall, recall >= RECALL_RECOVERED
    if isinstance(found, DirectionFound):
        same = found.layer == planted.location["layer"]
        cosine = _cosine(found.vector, planted.detail["direction"]) if same else 0.0
        return str(found.layer), cosine, cosine >= COSINE_RECOVERED
    if isinstance(found, RateFound):
        return str(found.layer), found.rate, str(found.layer) in names and found.lo > found.control
    named = "" if found is None else str(found)
    return named, float("nan"), named in names


def recovery_row(planted: Planted, analysis: str, found: Found) -> dict[str, Any]:
    """One row of the recovery table (module docstring)."""
    should = expected_names(planted.expected, analysis)
    named, score, names_planted = finding(planted, analysis, found, should or null_names(planted, analysis))
    return {"kind": planted.kind, "strength": planted.strength, "seed": planted.seed, "analysis": analysis,
            "planted": "|".join(should), "found": named, "recovered": bool(names_planted if should else not names_planted),
            "score": score, "organism": organism_id(planted)}


def organism_id(planted: Planted) -> str:
    """What makes two organisms one: the same ground truth apart from the seed that drew
    it (and how the draw went) and the thread count it was planted under (the weights'
    sha256, both checkpoints' for a pair, and what the analyses read as the truth, e.g.
    the gap kind's affected questions)."""
    truth = {k: v for k, v in asdict(planted).items() if k not in ("seed", "drawn", "torch_threads")}
    return hashlib.sha256(json.dumps(truth, sort_keys=True, default=str).encode()).hexdigest()[:16]


def names_organisms(recovery: pd.DataFrame) -> bool:
    """Whether a recovery table names its organisms (tables from before the ``organism``
    column do not: each seed is then its own)."""
    return "organism" in recovery.columns and not recovery["organism"].isna().all()


def distinct_organisms(recovery: pd.DataFrame) -> pd.DataFrame:
    """One row per organism and analysis (the first seed's; tables from before the
    ``organism`` column count every seed)."""
    if not names_organisms(recovery):
        return recovery
    return recovery.drop_duplicates(["kind", "analysis", "strength", "organism"], keep="first")


@dataclass(frozen=True)
class Organism:
    """One cell's organism folder: its ground truth (``planted.json``, always there) and
    its checkpoint, which may have been dropped after the cell's analyses (`drop`)."""

    folder: Path
    #: plants this organism into an empty folder (`plant` with the cell's arguments)
    build: Callable[[Path], Planted]

    def checkpoint(self, role: str | None = None) -> str:
        """The checkpoint to load (`role`: "base" or "trained" of a pair), rebuilt from
        its seed first when it was dropped."""
        folder = self.folder / role if role else self.folder
        if not (folder / WEIGHTS_FILE).is_file():
            self.rebuild()
        return str(folder)

    def rebuild(self) -> None:
        """Plant the organism again beside its folder and put it in place when its ground
        truth, weights' sha256 included, is the one recorded; refuse when it is not."""
        recorded = read_planted(self.folder)
        again = self.folder.with_name(self.folder.name + ".rebuild")
        shutil.rmtree(again, ignore_errors=True)
        threads = torch.get_num_threads()
        torch.set_num_threads(recorded.torch_threads or threads)  # the fits' sums in the order they were planted in
        try:
            rebuilt = self.build(again)
        finally:
            torch.set_num_threads(threads)
        if organism_id(rebuilt) != organism_id(recorded):
            shutil.rmtree(again, ignore_errors=True)
            counts = (f"planted under {recorded.torch_threads} torch threads, rebuilt under as many"
                      if recorded.torch_threads else
                      f"rebuilt under {threads} torch threads; its {PLANTED_FILE} does not record the count it was "
                      "planted under, and another count gives weights that differ in their last bits")
            raise RuntimeError(f"{str(self.folder)!r}: planting seed {recorded.seed} again gave other weights than its "
                               f"{PLANTED_FILE} records (sha256 {rebuilt.weights_sha256[:12]} against "
                               f"{recorded.weights_sha256[:12]}; {counts}); the organism is not reproducible here, so "
                               f"its checkpoint cannot be rebuilt: plant the cell again in a new run folder")
        shutil.rmtree(self.folder)
        os.replace(again, self.folder)

    def drop(self) -> None:
        """Delete the checkpoint, keeping ``planted.json`` (what every reading needs)."""
        for entry in self.folder.iterdir():
            if entry.name != PLANTED_FILE:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


#: kind -> {analysis: run it on an organism into a run folder, giving what it found, or
#: {analysis: found} for a run that several rows read}
Runner = Callable[[Organism, Task, Path, "Cell"], Union[Found, dict[str, Found]]]


@dataclass(frozen=True)
class Cell:
    """How every analysis of a validation runs: its batch size, its progress bar, the
    temperature probe of the audits (the gap and pair kinds), the repair sweeps'
    ablation and the grading, where the units and steer runs read and how the steer runs
    step: the commands' defaults unless `rnr validate --temperature`, `--ablation`,
    `--grading`, `--read-at`, `--alphas` or `--alpha-unit` say otherwise."""

    batch_size: int = 32
    progress: bool = False
    probe: Probe = Probe()
    #: how the repair sweeps silence a block (`rnr repair --ablation`)
    ablation: str = "zero"
    #: what "right" is for every analysis (`rnr repair --grading`): None, the default (strict)
    grading: str | None = None
    #: where the steer runs add the vector (`rnr steer --steer-at`)
    steer_at: str = "every"
    #: the MLP sweep silences each block's top units alone (`rnr repair --units`); None: whole blocks
    units: int | None = None
    #: where the units and steer runs read the block (`rnr units --read-at`, `rnr steer --read-at`),
    #: and where the MLP sweep reads each block's failure direction (`rnr repair --read-at`)
    read_at: str = "prompt"
    #: the steer runs' alpha grid (`rnr steer --alphas`); None: the grid of `alpha_unit`
    alphas: tuple[float, ...] | None = None
    #: what one alpha is (`rnr steer --alpha-unit`)
    alpha_unit: str = "rms"
    #: the steer runs also clamp the failures' span (`rnr steer --clamp-control`), scored as ``steer:clamp``
    clamp_control: bool = False


def _repair_layer(organism: Organism, task: Task, out: Path, cell: Cell) -> int | None:
    if (out / "summary.json").is_file():
        return repair_layer_found(RunDir(out).read_summary())
    summary = run_repair(load_model(organism.checkpoint()), task, out, readout=default_readout(task), sweep="layer",
                         decoding=deployed_decoding(task), batch_size=cell.batch_size, progress=cell.progress,
                         ablation=cell.ablation, grading=cell.grading)
    return repair_layer_found(summary)


#: the route check: skip-only routes at a small budget (random and hill climbing, with the
#: blind searches every route run has), K temperature samples as the route run's own
ROUTE_CHECK = RouteConfig(samples=8, budget=8, spaces=("skiponly",), methods=("random", "hill_climb"))


def _route_skiponly(organism: Organism, task: Task, out: Path, cell: Cell) -> int | None:
    if not (out / "summary.json").is_file():
        lm = load_model(organism.checkpoint())
        # a small model's skip-only space may hold fewer routes than the budget: all of them, then
        budget = min(ROUTE_CHECK.budget, space_size(make_space("skiponly", lm.n_layers)))
        run_route_audit(lm, task, out, dataclasses.replace(ROUTE_CHECK, budget=budget), progress=cell.progress)
    return route_layer_found(RunDir(out).read_summary().layers)


def gap_groups_found(run: RunDir, task: Task, groups: Mapping[str, Sequence[str]]) -> str:
    """The groups of questions (name -> question ids) on which an audit run's O_K - D
    is above its null: the interval of ``gap_above_null`` (`grading.null_summary`, the
    group's own derangement null) above 0. Names joined by "|" in `groups` order; ""
    when none is."""
    probe, grading = run.config["probe"]["name"], run.grading
    records = graded(run.read_records(), grading)
    above = []
    for name, ids in groups.items():
        part = records[records["question_id"].isin(list(ids))]
        null = question_null(part, task, probe, grading, int(run.config["probe"]["k"])) if len(part) else None
        if null is None:  # under 2 questions: no null to be above
            continue
        scores = question_scores(part, probe)
        if null_summary(scores["d"].to_numpy(), scores["o"].to_numpy(), *null)["gap_above_null_ci"][0] > 0:
            above.append(name)
    return "|".join(above)


def _audit(checkpoint: Callable[[], str], task: Task, out: Path, cell: Cell) -> RunDir:
    """An audit as `rnr audit` runs it (by default K = 32 at T = 1: `Cell.probe`) of the
    model `checkpoint` gives, resumed when begun."""
    if not (out / "summary.json").is_file():
        run_audit(load_model(checkpoint()), task, out, probe=cell.probe, deployed=deployed_decoding(task),
                  batch_size=cell.batch_size, progress=cell.progress, grading=cell.grading)
    return RunDir(out)


def _audit_gap(organism: Organism, task: Task, out: Path, cell: Cell) -> str:
    detail = read_planted(organism.folder).detail  # the groups only: the audit itself reads no ground truth
    groups = {"affected": detail["affected_question_ids"], "unaffected": detail["unaffected_question_ids"]}
    return gap_groups_found(_audit(organism.checkpoint, task, out, cell), task, groups)


def dominant_source(gained_from: Mapping[str, int]) -> str:
    """The source of most gained answers (a `compare` summary's ``gained_from``), "" when
    there are none or the sources tie."""
    reachable, unreachable = gained_from["base_reachable"], gained_from["base_unreachable"]
    return "base_reachable" if reachable > unreachable else "base_unreachable" if unreachable > reachable else ""


def _compare_pair(pair: Organism, task: Task, out: Path, cell: Cell) -> str:
    if not (out / "compare" / "summary.json").is_file():
        runs = [_audit(partial(pair.checkpoint, role), task, out / role, cell) for role in ("base", "trained")]
        compare_runs(*runs, out / "compare")
    return dominant_source(RunDir(out / "compare").read_summary().gained_from)


def _repair_mlp(organism: Organism, task: Task, out: Path, cell: Cell) -> int | None:
    if not (out / "summary.json").is_file():
        run_repair(load_model(organism.checkpoint()), task, out, readout=default_readout(task), sweep="mlp",
                   decoding=deployed_decoding(task), batch_size=cell.batch_size, progress=cell.progress,
                   ablation=cell.ablation, grading=cell.grading, units=cell.units, read_at=cell.read_at)
    chosen = RunDir(out).read_summary().chosen
    return None if chosen is None else int(chosen["layer"])


def _cell_repair(out: Path) -> Path | None:
    """The ``repair:mlp`` run of the same cell (units and steer analyse the block it
    chose, as `rnr units --repair-run` does); None when it chose no block."""
    repair = out.with_name(out.name.split("__")[0] + "__repair-mlp")
    return repair if RunDir(repair).read_summary().chosen is not None else None


def _on_chosen_block(analyse: Callable[..., Any], organism: Organism, task: Task, out: Path, cell: Cell,
                     **options: Any) -> RunDir | None:
    """`analyse` (`run_units`, `run_steer`) on the block the cell's repair run chose,
    with the command's defaults but `options`, or its run read back; None when repair
    chose no block or the analysis was skipped (a part of its cohort empty)."""
    repair = _cell_repair(out)
    if repair is None:
        return None
    if not (out / "summary.json").is_file():
        analyse(load_model(organism.checkpoint()), task, out, repair_run=repair, readout=default_readout(task),
                decoding=deployed_decoding(task), batch_size=cell.batch_size, progress=cell.progress, grading=cell.grading,
                **options)
    run = RunDir(out)
    return run if run.read_summary().layer is not None else None


def _units_top(organism: Organism, task: Task, out: Path, cell: Cell) -> UnitsFound | None:
    run = _on_chosen_block(run_units, organism, task, out, cell, read_at=cell.read_at)
    if run is None:
        return None
    scores = run.read_table("unit_scores").sort_values(["score", "unit"], ascending=[False, True], kind="stable")
    return UnitsFound(int(run.read_summary().layer), tuple(int(u) for u in scores["unit"]))


def _steer(organism: Organism, task: Task, out: Path, cell: Cell) -> dict[str, Found]:
    """The steer run on the chosen block, with its random-direction control: a rescue or
    an induction any push of that length gives is not the direction's (on the units
    organism a random direction induces as much as v from alpha 0.25: docs/findings.md)."""
    run = _on_chosen_block(run_steer, organism, task, out, cell, random_control=True, steer_at=cell.steer_at,
                           read_at=cell.read_at, alphas=cell.alphas, alpha_unit=cell.alpha_unit,
                           clamp_control=cell.clamp_control)
    if run is None:
        return dict.fromkeys(("steer:direction", "steer:rescue", "steer:induction",
                              *(("steer:clamp",) if cell.clamp_control else ())))
    return steering_found(run)


def steering_found(run: RunDir) -> dict[str, Found]:
    """What a finished steer run (made with the random-direction control) found: its v,
    and the rescue and the induced failure at the alpha where each most exceeds the
    random direction's; with the clamp control, the rescue of the failures' span
    clamped beside a random span's (``steer:clamp``)."""
    table = steering_beside_control(run)
    if table is None or "as_failure_rate" not in table.columns:
        raise ValueError(f"{str(run.path)!r} is a steer run made by an older validation (without the random-direction "
                         "control or the induced failure's form): delete that folder and run the validation again to redo it")
    summary = run.read_summary()
    layer = int(summary.layer)
    # induction counts the failure induced (an answer the failure set gave), not any wrong answer
    induced = table["direction"] == "induction"
    table.loc[induced, ["rate", "lo", "random_rate"]] = (
        table.loc[induced, ["as_failure_rate", "as_failure_lo", "random_as_failure_rate"]].to_numpy())
    table["above"] = table["rate"] - table["random_rate"]
    best = {d: table[table["direction"] == d].sort_values(["above", "alpha"], ascending=[False, True]).iloc[0]
            for d in ("rescue", "induction")}
    clamp = summary.clamp_control
    if clamp is not None:
        rescue = pd.DataFrame(clamp["table"]).query("way == 'rescue'").set_index("clamped")
        clamped = {"steer:clamp": RateFound(layer, float(rescue.at["span", "rate"]), float(rescue.at["span", "lo"]),
                                            float(rescue.at["random", "rate"]))}
    return {"steer:direction": DirectionFound(layer, tuple(run.read_json("direction")["vector"])),
            **{f"steer:{d}": RateFound(layer, float(r["rate"]), float(r["lo"]), float(r["random_rate"]))
               for d, r in best.items()}, **(clamped if clamp is not None else {})}


ANALYSES: dict[str, dict[str, Runner]] = {
    "layer": {"repair:layer": _repair_layer, "route:skiponly": _route_skiponly}, "gap": {"audit": _audit_gap},
    "sharpen": {"compare": _compare_pair}, "new": {"compare": _compare_pair},
    "units": {"repair:mlp": _repair_mlp, "units:top-k": _units_top, "steer": _steer},
}


def cell_name(kind: str, strength: float, seed: int) -> str:
    return f"{kind}-s{strength:g}-seed{seed}"


def organism(base: str, kind: str, strength: float, seed: int, folder: Path, task: Task,
             temperature: float = SAMPLING_TEMPERATURE, layer: int | None = None,
             units: int | None = None) -> tuple[Organism, Planted]:
    """The organism of one cell and its ground truth: read back when its folder has its
    ``planted.json``, else planted (at `layer` for a kind planted at a layer, else at the
    layer the seed draws, as `rnr plant` does without --layer) at `strength` times the
    kind's default, made for `task`'s questions (a kind sized for a probe, for one at
    `temperature`; the units kind with `units` units, else its default)."""
    spec = KINDS[kind]
    sized = {**({"temperature": temperature} if spec.takes_temperature else {}),
             **({"layer": layer} if spec.takes_layer and layer is not None else {}),
             **({"units": units} if spec.takes_units and units is not None else {})}
    found = Organism(folder, partial(plant, kind, base, seed=seed, task=task, scale=strength, **sized))
    if (folder / PLANTED_FILE).is_file():
        return found, read_planted(folder)
    return found, found.build(folder)


GOLDS = ("base", "task")
#: `run_validate(seeds=EVERY_LAYER)`: one organism per layer a seed can draw
EVERY_LAYER = "layers"


def run_validate(model: str, task: Task, out: str | Path, *, profile: str = "quick", kinds: Sequence[str] = ("layer",),
                 gold: str = "base", batch_size: int = 32, temperature: float = SAMPLING_TEMPERATURE,
                 ablation: str = "zero", grading: str | None = None, steer_at: str = "every", units: int | None = None,
                 seeds: Sequence[int] | str | None = None, strengths: Sequence[float] | None = None,
                 layer: int | None = None, plant_units: int | None = None, read_at: str = "prompt",
                 alphas: Sequence[float] | None = None, alpha_unit: str = "rms", clamp_control: bool = False,
                 keep_organisms: bool = False, progress: bool = True) -> ValidateSummary:
    """Every cell of `profile` for each of `kinds` (module docstring) into the run folder
    `out` (kind "validate"); returns the summary (`validation_summary`). `seeds` replaces
    the profile's (`EVERY_LAYER`: one seed per layer the layer kinds can draw,
    `seeds_drawing_each_layer`), and `strengths` the profile's strengths (multiples of
    each kind's default; 0 is the null). `layer` plants the kinds planted at a layer
    (layer, units) there instead of at the layer each seed draws, and `plant_units` is how
    many units the units kind plants (`rnr plant --layer`, `--units`); `read_at`,
    `alphas` and `alpha_unit` are the units and steer runs' (`rnr steer`'s options);
    `clamp_control` has each steer run clamp the failures' span too, scored as the row
    ``steer:clamp``, which "every analysis" then includes.
    `keep_organisms`: keep every organism's checkpoint (by default each is dropped once
    its cell's analyses are done)."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    if gold not in GOLDS:
        raise ValueError(f"gold must be one of {', '.join(GOLDS)}, got {gold!r}")
    unknown = [k for k in kinds if k not in ANALYSES]
    if unknown:
        raise ValueError(f"validate knows the kinds {', '.join(ANALYSES)}, got {', '.join(unknown)}")
    chosen = PROFILES[profile]
    if isinstance(seeds, str) and seeds != EVERY_LAYER:
        raise ValueError(f"seeds must be integers or {EVERY_LAYER!r}, got {seeds!r}")
    if seeds is not None and not isinstance(seeds, str):
        if not seeds or any(int(x) < 0 for x in seeds):
            raise ValueError(f"seeds must be one or more non-negative integers, got {list(seeds)}")
        chosen = dataclasses.replace(chosen, seeds=tuple(dict.fromkeys(int(x) for x in seeds)))
    if strengths is not None:
        if not strengths or not all(math.isfinite(float(x)) and float(x) >= 0 for x in strengths):
            raise ValueError(f"strengths must be one or more finite non-negative numbers, got {list(strengths)}")
        chosen = dataclasses.replace(chosen, strengths=tuple(dict.fromkeys(float(x) for x in strengths)))
    check_ablation(ablation)
    if grading is not None:
        check_grading(grading)
    check_steer_at(steer_at)
    check_units(units)
    check_read_at(read_at)
    check_alpha_unit(alpha_unit)
    if alphas is not None:
        if not alphas or not all(math.isfinite(float(a)) for a in alphas):
            raise ValueError(f"alphas must be one or more finite numbers, got {list(alphas)}")
        alphas = tuple(float(a) for a in alphas)
    if layer is not None:
        if not any(KINDS[k].takes_layer for k in kinds):
            raise ValueError(f"layer: none of the kinds {', '.join(kinds)} is planted at a layer "
                             f"({', '.join(k for k in ANALYSES if KINDS[k].takes_layer)} are)")
        if seeds == EVERY_LAYER:
            raise ValueError(f"layer plants every organism at layer {layer}: seeds {EVERY_LAYER!r} (one per layer) "
                             "asks for every layer")
    if plant_units is not None:
        if "units" not in kinds:
            raise ValueError("plant_units is how many units the units kind plants: add 'units' to the kinds")
        check_units(plant_units)
    # a bad temperature refused before any work
    cell = Cell(batch_size, False, Probe(temperature=temperature), ablation, grading, steer_at, units, read_at, alphas,
                alpha_unit, clamp_control)
    asked = task
    lm = load_model(model) if gold == "base" or seeds == EVERY_LAYER or layer is not None else None
    if layer is not None and not 0 <= layer < lm.n_layers:
        raise ValueError(f"layer {layer}: {model} has layers 0..{lm.n_layers - 1}")
    if seeds == EVERY_LAYER:
        chosen = dataclasses.replace(chosen, seeds=seeds_drawing_each_layer(lm.n_layers))
    if gold == "base":
        task = anchor_task(lm, task, batch_size, grading or DEFAULT_GRADING)
    del lm  # each analysis loads its organism; the base need not stay beside it
    # the settings a run departs from the commands' defaults in: its config (a resume with
    # others is refused) and its summary say them; a default run's are what they always were
    departs = {name: value for name, value, default in (
        ("steer_at", steer_at, "every"), ("units", units, None), ("layer", layer, None), ("plant_units", plant_units, None),
        ("read_at", read_at, "prompt"), ("alphas", None if alphas is None else list(alphas), None),
        ("alpha_unit", alpha_unit, "rms"), ("clamp_control", clamp_control, False)) if value != default}
    run = RunDir.create(out, {"kind": VALIDATE, "model": model, "task": asked.describe(), "profile": asdict(chosen),
                              "kinds": list(kinds), "gold": gold, "batch_size": batch_size,
                              **({} if temperature == SAMPLING_TEMPERATURE else {"temperature": temperature}),
                              **({} if ablation == "zero" else {"ablation": ablation}),
                              **({} if grading is None else {"grading": grading}), **departs})
    root = Path(out)
    cells = [(kind, s, seed) for kind in kinds for s in chosen.strengths for seed in chosen.seeds]
    rows: list[dict[str, Any]] = []
    # (organism, analysis) -> what it found: a seed that drew an organism already analysed
    # reads those findings instead of running the same analysis on the same weights again
    seen: dict[tuple[str, str], Any] = {}
    # kind -> organism -> its repair run (planted cells of the kinds that have one)
    repaired: dict[str, dict[str, Path]] = {}
    # kind -> the cells whose organism this model refused, and why (`NotPlantable`)
    refused: dict[str, list[dict[str, Any]]] = {}
    for kind, strength, seed in tqdm(cells, desc="organisms", unit="organism", disable=not progress):
        name = cell_name(kind, strength, seed)
        try:
            found_in, planted = organism(model, kind, strength, seed, root / "organisms" / name, task, temperature,
                                         layer, plant_units)
        except NotPlantable as why:
            refused.setdefault(kind, []).append({"strength": strength, "seed": seed, "why": str(why)})
            continue
        for analysis, runner in ANALYSES[kind].items():
            if analysis in chosen.left_out:
                continue
            key = (organism_id(planted), analysis)
            folder = root / "runs" / f"{name}__{analysis.replace(':', '-')}"
            if key not in seen:
                seen[key] = runner(found_in, task, folder, cell)
                if analysis.startswith("repair:") and strength > 0:
                    repaired.setdefault(kind, {})[key[0]] = folder  # first seen: `seen` runs it once
            found = seen[key]
            for named, one in (found.items() if isinstance(found, dict) else [(analysis, found)]):
                rows.append({**recovery_row(planted, named, one), "strength": strength})
        write_tables(run, rows)
        if not keep_organisms:
            found_in.drop()
    summary = {"kind": VALIDATE, "model": model, "task": task.name, "n_questions": len(task), "gold": gold,
               "temperature": temperature, "ablation": ablation, "grading": grading or DEFAULT_GRADING,
               **departs,
               "profile": profile, "profile_why": chosen.why, **validation_summary(pd.DataFrame(rows, columns=RECOVERY_COLUMNS))}
    for kind, runs in repaired.items():
        summary["recovery"][kind]["n_without_failure"] = without_failure(runs.values())
    for kind, cells_refused in refused.items():  # no organism, so no trial: beside the rates, not in them
        no_rows = pd.DataFrame(columns=["strength", "recovered"])
        summary["recovery"].setdefault(kind, _rates(no_rows, no_rows, 0.95))["not_planted"] = cells_refused
    return run.write_summary(summary)


def without_failure(repair_runs: Iterable[Path]) -> int:
    """How many of these repair runs found an empty failure set: organisms whose plant
    left no recognised question answered wrong (at that strength, on that task), so a
    miss there is not the analyses' (nothing was there to find)."""
    return sum(RunDir(folder).read_summary().n_failure == 0 for folder in repair_runs)


def write_tables(run: RunDir, rows: list[dict[str, Any]]) -> None:
    recovery = pd.DataFrame(rows, columns=RECOVERY_COLUMNS)
    run.write_table("recovery", recovery)
    run.write_table("detection", detection_table(recovery))


def detection_table(recovery: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Share recovered per kind, analysis and strength, with its Wilson interval (at
    strength 0: the share of nulls that stayed silent), over distinct organisms (`n`;
    the seeds behind them: `n_seeds`)."""
    out = []
    seeds = recovery.groupby(["kind", "analysis", "strength"], sort=True).size()
    for (kind, analysis, strength), sub in distinct_organisms(recovery).groupby(["kind", "analysis", "strength"], sort=True):
        p = proportion(int(sub["recovered"].sum()), len(sub), level)
        out.append({"kind": kind, "analysis": analysis, "strength": float(strength), "n": len(sub),
                    "n_seeds": int(seeds[(kind, analysis, strength)]), "rate": p["rate"], "lo": p["ci"][0], "hi": p["ci"][1]})
    return pd.DataFrame(out, columns=["kind", "analysis", "strength", "n", "n_seeds", "rate", "lo", "hi"])


def validation_summary(recovery: pd.DataFrame, level: float = 0.95) -> dict[str, Any]:
    """The one summary of a validation, counted over distinct organisms (`n`, `n_null`;
    the seeds behind them beside: `n_seeds`, `n_null_seeds`):

    - ``recovery``, per kind: the share of planted organisms (strength > 0) that every
      analysis of the kind recovered (found end to end), with its Wilson interval, and the
      share of its nulls (strength 0) where any analysis named the planted location
      (`null_false_positive_rate`, with `null_ci`). An organism is one trial however many
      analyses read it: its analyses' findings are not independent;
    - ``by_analysis``: the same per analysis, one row per organism.

    NaN where a kind has no such cells."""
    out: dict[str, Any] = {"recovery": {}, "by_analysis": {}}
    distinct = distinct_organisms(recovery)
    for name, sub in distinct.groupby("analysis", sort=True):
        out["by_analysis"][str(name)] = _rates(sub, recovery[recovery["analysis"] == name], level)
    cells = ["kind", "strength", "organism" if names_organisms(distinct) else "seed"]
    # one row per organism: recovered when every analysis recovered it (for a null: stayed silent)
    per_organism = distinct.groupby(cells, sort=True, dropna=False)["recovered"].all().reset_index()
    seeds = recovery.drop_duplicates(["kind", "strength", "seed"])
    for name, sub in per_organism.groupby("kind", sort=True):
        out["recovery"][str(name)] = _rates(sub, seeds[seeds["kind"] == name], level)
    return out


def _rates(rows: pd.DataFrame, every: pd.DataFrame, level: float) -> dict[str, Any]:
    """Recovery over the planted rows of `rows` (one per organism) and false positives over
    its nulls, with the seeds of `every` (one row per seed) beside."""
    planted, nulls = rows[rows["strength"] > 0], rows[rows["strength"] == 0]
    hit = proportion(int(planted["recovered"].sum()), len(planted), level)
    false = proportion(int((~nulls["recovered"].astype(bool)).sum()), len(nulls), level)
    return {"rate": hit["rate"], "ci": hit["ci"], "n": len(planted), "n_seeds": int((every["strength"] > 0).sum()),
            "null_false_positive_rate": false["rate"], "null_ci": false["ci"], "n_null": len(nulls),
            "n_null_seeds": int((every["strength"] == 0).sum())}
