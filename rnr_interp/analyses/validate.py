"""End-to-end validation: plant known effects in the user's model (`plant.py`), run the
analyses on each organism exactly as a user would (the commands' own analysis functions,
their defaults, the task's deployed decoding), and score what they found against what
was planted.

A validation run folder holds ``organisms/`` (one checkpoint folder per cell),
``runs/`` (the analyses' own run folders, one per cell and analysis) and two tables:

- ``recovery``: one row per (kind, strength, seed, analysis) with ``planted`` (the
  location the analysis should name, as text: "15" or "15|16" where two are the same
  block; "" for a null), ``found`` (what the analysis named, "" when nothing) and
  ``recovered`` (found is one of the planted; for a null, whether it stayed silent
  about the planted location, see below);
- ``detection``: per kind, analysis and strength, the share recovered with its Wilson
  interval: the detection curve, the end-to-end power at this n.

Nulls are the strength-0 cells of each kind: the planted layer writes exactly zero, so
the organism computes what the base computes. A null's false positive is an analysis
naming the planted location anyway; a null cell's ``recovered`` is True when it does not.

Analyses per kind (`ANALYSES`):

- layer -> ``repair:layer``: `rnr repair --sweep layer` on the organism; found = the
  whole layer its sweep chooses on the selection part (`repair.best_blocks`).
- layer -> ``route:skiponly`` is read from a route run's summary (`route_layer_found`,
  ``layers["skiponly"]["top"]`` of its summary) when one is given; not run here.

Golds (``gold``): "base" (the default) anchors the task to the base model, its own
deployed answers as the golds (`analyses.anchor`), so every failure of an organism is
the plant's; "task" keeps the task's golds, where the organism's failures mix the
plant's with the base's own (the user's question, not a test of the instrument).

Every cell resumes: an organism folder with its ``planted.json`` is reused, an analysis
run with its summary is read back, and the tables are rewritten after each cell.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd
from tqdm.auto import tqdm

from rnr_interp.analyses.anchor import anchor_task
from rnr_interp.analyses.localise.recognition import default_readout
from rnr_interp.analyses.localise.repair import run_repair
from rnr_interp.analyses.plant import PLANTED_FILE, Planted, plant, read_planted
from rnr_interp.engine.sampling import deployed_decoding
from rnr_interp.metrics import proportion
from rnr_interp.models import load_model
from rnr_interp.records import VALIDATE, RepairSummary, RunDir, ValidateSummary
from rnr_interp.tasks.base import Task

RECOVERY_COLUMNS = ("kind", "strength", "seed", "analysis", "planted", "found", "recovered")


@dataclass(frozen=True)
class Profile:
    """The cells of a validation: every kind at every strength (0: its null) and seed."""

    strengths: tuple[float, ...]
    seeds: tuple[int, ...]
    #: questions per cell when --n is not given
    n: int
    why: str


PROFILES = {
    # two cells per seed on the demo model: one organism at the default strength, one null
    "quick": Profile(strengths=(0.0, 1.0), seeds=(0, 1, 2), n=24,
                     why="the default strength and its null at three seeds: a first look at recovery"),
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


def planted_layers(planted: Planted, analysis: str) -> list[int]:
    """The layers `analysis` should name on `planted` (empty for a null)."""
    expected = planted.expected
    if not expected.get("effect"):
        return []
    return list(expected["repair"]["layers"] if analysis.startswith("repair") else expected["route"]["skip"])


def recovery_row(planted: Planted, analysis: str, found: int | None) -> dict[str, Any]:
    """One row of the recovery table (module docstring)."""
    should = planted_layers(planted, analysis)
    null_location = planted.location["layer"]
    recovered = found in should if should else found != null_location
    return {"kind": planted.kind, "strength": planted.strength, "seed": planted.seed, "analysis": analysis,
            "planted": "|".join(map(str, should)), "found": "" if found is None else str(found), "recovered": bool(recovered)}


#: kind -> {analysis: run it on an organism folder into a run folder, giving what it found}
Runner = Callable[[Path, Task, Path, int, bool], int | None]


def _repair_layer(organism: Path, task: Task, out: Path, batch_size: int, progress: bool) -> int | None:
    if (out / "summary.json").is_file():
        return repair_layer_found(RunDir(out).read_summary())
    summary = run_repair(load_model(str(organism)), task, out, readout=default_readout(task), sweep="layer",
                         decoding=deployed_decoding(task), batch_size=batch_size, progress=progress)
    return repair_layer_found(summary)


ANALYSES: dict[str, dict[str, Runner]] = {"layer": {"repair:layer": _repair_layer}}


def cell_name(kind: str, strength: float, seed: int) -> str:
    return f"{kind}-s{strength:g}-seed{seed}"


def organism(base: str, kind: str, strength: float, seed: int, folder: Path, task: str) -> Planted:
    """The organism of one cell: read back when its folder is complete, else planted
    (at the layer the seed draws, as `rnr plant` does without --layer)."""
    if (folder / PLANTED_FILE).is_file():
        return read_planted(folder)
    return plant(kind, base, folder, strength=strength, seed=seed, task=task)


GOLDS = ("base", "task")


def run_validate(model: str, task: Task, out: str | Path, *, profile: str = "quick", kinds: Sequence[str] = ("layer",),
                 gold: str = "base", batch_size: int = 32, progress: bool = True) -> ValidateSummary:
    """Every cell of `profile` for each of `kinds` (module docstring) into the run folder
    `out` (kind "validate"); returns the summary (`validation_summary`)."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    if gold not in GOLDS:
        raise ValueError(f"gold must be one of {', '.join(GOLDS)}, got {gold!r}")
    unknown = [k for k in kinds if k not in ANALYSES]
    if unknown:
        raise ValueError(f"validate knows the kinds {', '.join(ANALYSES)}, got {', '.join(unknown)}")
    chosen = PROFILES[profile]
    asked = task
    if gold == "base":
        task = anchor_task(load_model(model), task, batch_size)
    run = RunDir.create(out, {"kind": VALIDATE, "model": model, "task": asked.describe(), "profile": asdict(chosen),
                              "kinds": list(kinds), "gold": gold, "batch_size": batch_size})
    root = Path(out)
    cells = [(kind, s, seed) for kind in kinds for s in chosen.strengths for seed in chosen.seeds]
    rows: list[dict[str, Any]] = []
    for kind, strength, seed in tqdm(cells, desc="organisms", unit="organism", disable=not progress):
        name = cell_name(kind, strength, seed)
        planted = organism(model, kind, strength, seed, root / "organisms" / name, task.name)
        for analysis, runner in ANALYSES[kind].items():
            found = runner(root / "organisms" / name, task, root / "runs" / f"{name}__{analysis.replace(':', '-')}",
                           batch_size, False)
            rows.append(recovery_row(planted, analysis, found))
        write_tables(run, rows)
    summary = {"kind": VALIDATE, "model": model, "task": task.name, "n_questions": len(task), "gold": gold,
               "profile": profile, "profile_why": chosen.why, **validation_summary(pd.DataFrame(rows, columns=RECOVERY_COLUMNS))}
    return run.write_summary(summary)


def write_tables(run: RunDir, rows: list[dict[str, Any]]) -> None:
    recovery = pd.DataFrame(rows, columns=RECOVERY_COLUMNS)
    run.write_table("recovery", recovery)
    run.write_table("detection", detection_table(recovery))


def detection_table(recovery: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Share recovered per kind, analysis and strength, with its Wilson interval (at
    strength 0: the share of nulls that stayed silent)."""
    out = []
    for (kind, analysis, strength), sub in recovery.groupby(["kind", "analysis", "strength"], sort=True):
        p = proportion(int(sub["recovered"].sum()), len(sub), level)
        out.append({"kind": kind, "analysis": analysis, "strength": float(strength), "n": len(sub),
                    "rate": p["rate"], "lo": p["ci"][0], "hi": p["ci"][1]})
    return pd.DataFrame(out, columns=["kind", "analysis", "strength", "n", "rate", "lo", "hi"])


def validation_summary(recovery: pd.DataFrame, level: float = 0.95) -> dict[str, Any]:
    """The one summary of a validation: per kind, the share of planted cells (strength
    > 0) recovered, with its Wilson interval, and the share of its nulls (strength 0)
    where an analysis named the planted location (`null_false_positive_rate`, with
    `null_ci`); the same per analysis under `by_analysis`. NaN where a kind has no such
    cells."""
    out: dict[str, Any] = {"recovery": {}, "by_analysis": {}}
    for key, column in (("recovery", "kind"), ("by_analysis", "analysis")):
        for name, sub in recovery.groupby(column, sort=True):
            planted, nulls = sub[sub["strength"] > 0], sub[sub["strength"] == 0]
            hit = proportion(int(planted["recovered"].sum()), len(planted), level)
            false = proportion(int((~nulls["recovered"].astype(bool)).sum()), len(nulls), level)
            out[key][str(name)] = {"rate": hit["rate"], "ci": hit["ci"], "n": len(planted),
                                   "null_false_positive_rate": false["rate"], "null_ci": false["ci"], "n_null": len(nulls)}
    return out

