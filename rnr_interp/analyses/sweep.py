"""Sweeps: a grid of audit cells (model x task x probe x interventions), run locally or on Ray.

A `Cell` is one audit run: its config hashes to a stable `cell_id`, and it owns one run
folder, ``OUT/<cell.folder>``. Cells are independent, so they run in any order, on any
machine that sees OUT: a cell whose ``summary.json`` exists is finished and skipped, and
a cell cut short resumes from its last records part (`RunDir` resume). The same records
come out whichever runner ran a cell, so a sweep killed midway and run again loses
nothing finished and redoes only what was not.

``OUT/sweep.json`` indexes the cells and their statuses (pending, done, skipped,
failed); the run folders are the truth and the index is rebuilt from them on each run.
`records.load_runs(OUT)` reads every cell and `rnr report OUT` draws the index page.

A grid spec is JSON (see `Grid.from_dict`)::

    {"models": ["tiny-llama", "tiny-qwen2"],
     "tasks": ["arithmetic", {"name": "gsm8k", "n": 1000, "data": "gsm8k/test.jsonl"}],
     "probes": [{"k": 200, "temperature": 1.0}],
     "interventions": [[], [{"kind": "Ablate", "component": "mlp", "layer": 3}]],
     "n": 100, "deployed_temperature": 0.0, "max_new_tokens": null, "batch_size": 8}
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import traceback
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from rnr_interp.interventions import dumps, loads, set_id
from rnr_interp.records import SUMMARY, TEMPERATURE_SWEEP, AuditSummary, RunDir, read_json_file, write_json_atomic
from rnr_interp.engine.decoding import BACKENDS, check_hooks
from rnr_interp.engine.sampling import Probe

if TYPE_CHECKING:
    import pandas as pd

    from rnr_interp.models import LoadedModel
    from rnr_interp.tasks.base import Task

INDEX = "sweep.json"


@dataclass(frozen=True)
class Cell:
    """One audit: everything that decides its records. `interventions` is the set as
    `interventions.dumps` JSON; `max_new_tokens` None means the task's own."""

    model: str
    task: str
    data: str | None = None
    n: int | None = None
    probe: Probe = Probe()
    interventions: str = "[]"
    deployed_temperature: float = 0.0
    max_new_tokens: int | None = None
    batch_size: int = 8
    backend: str = "tl"

    def __post_init__(self):
        # JSON's 1 and 1.0 must name one cell.
        object.__setattr__(self, "deployed_temperature", float(self.deployed_temperature))
        object.__setattr__(self, "probe", replace(self.probe, temperature=float(self.probe.temperature), top_p=float(self.probe.top_p)))
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; known: {', '.join(BACKENDS)}")
        check_hooks(self.backend, loads(self.interventions))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> "Cell":
        obj = dict(obj)
        obj["probe"] = Probe(**obj.get("probe", {}))
        return cls(**obj)

    @property
    def cell_id(self) -> str:
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    @property
    def folder(self) -> str:
        """Readable and unique (the id decides): model__task__probe__interventions__id."""
        p = self.probe
        parts = [self.model, self.task, f"{p.name}-k{p.k}-t{p.temperature:g}", set_id(loads(self.interventions)) or "none"]
        if self.backend != "tl":
            parts.append(self.backend)
        return "__".join(_slug(s) for s in parts) + f"__{self.cell_id}"

    def describe(self) -> str:
        return f"{self.model} {self.task} K={self.probe.k} T={self.probe.temperature:g} {set_id(loads(self.interventions)) or '-'} [{self.backend}]"


def _slug(text: str, width: int = 40) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", text).strip("-")[:width] or "x"


@dataclass(frozen=True)
class TaskSpec:
    name: str
    data: str | None = None
    n: int | None = None


@dataclass(frozen=True)
class Grid:
    """Lists whose product is the cells. `interventions` holds sets as `dumps` JSON."""

    models: tuple[str, ...]
    tasks: tuple[TaskSpec, ...]
    probes: tuple[Probe, ...] = (Probe(),)
    interventions: tuple[str, ...] = ("[]",)
    deployed_temperature: float = 0.0
    max_new_tokens: int | None = None
    batch_size: int = 8

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> "Grid":
        """`models`, `tasks` (a name or {name, data, n}) required; `probes` (Probe
        fields), `interventions` (lists of {"kind": ..., ...}), `n` (default question
        count of every task), and the scalar fields of `Grid` optional."""
        known = {f.name for f in fields(cls)} | {"n"}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"unknown grid keys {unknown}; known: {sorted(known)}")
        for key in ("models", "tasks"):
            if not spec.get(key):
                raise ValueError(f"a grid needs a non-empty {key!r} list")
        default_n = spec.get("n")
        tasks = []
        for t in spec["tasks"]:
            t = {"name": t} if isinstance(t, str) else dict(t)
            t.setdefault("n", default_n)
            tasks.append(TaskSpec(**t))
        interventions = [dumps(loads(json.dumps(s))) for s in spec.get("interventions", [[]])]
        scalars = {k: spec[k] for k in ("deployed_temperature", "max_new_tokens", "batch_size") if k in spec}
        return cls(models=tuple(spec["models"]), tasks=tuple(tasks),
                   probes=tuple(Probe(**p) for p in spec.get("probes", [{}])),
                   interventions=tuple(interventions), **scalars)

    @classmethod
    def load(cls, path: str | Path) -> "Grid":
        return cls.from_dict(read_json_file(Path(path)))  # bounded; a bad file is a one-line RunFolderError

    def cells(self, backend: str = "tl") -> list[Cell]:
        """Every combination, in grid order. Cells with interventions stay on "tl"
        whatever `backend` says (`fallbacks` counts them)."""
        return [
            Cell(model=m, task=t.name, data=t.data, n=t.n, probe=p, interventions=iv,
                 deployed_temperature=self.deployed_temperature, max_new_tokens=self.max_new_tokens,
                 batch_size=self.batch_size, backend=backend if iv == "[]" else "tl")
            for m in self.models for t in self.tasks for p in self.probes for iv in self.interventions
        ]

    def fallbacks(self, backend: str) -> int:
        """How many cells asked for `backend` run on "tl" because they need hooks."""
        return 0 if backend == "tl" else sum(c.backend != backend for c in self.cells(backend))


# -- one cell ------------------------------------------------------------------------

_loaded: dict[tuple[str, str], Any] = {}


def _model(spec: str, backend: str):
    """The last model loaded in this process, reused by consecutive cells (a Ray worker
    runs many cells); one at a time, so memory holds one model."""
    key = (spec, backend)
    if key not in _loaded:
        _loaded.clear()
        if backend == "vllm":
            from rnr_interp.engine.vllm_backend import load_vllm

            _loaded[key] = load_vllm(spec)
        else:
            from rnr_interp.models import load_model

            _loaded[key] = load_model(spec, device="auto")
    return _loaded[key]


def is_finished(cell: Cell, out_root: str | Path) -> bool:
    return (Path(out_root) / cell.folder / SUMMARY).is_file()


def run_cell(cell: Cell, out_root: str | Path, progress: bool = False) -> dict[str, Any]:
    """Audit `cell` into ``out_root/<cell.folder>`` (resuming a partial run), unless it
    is finished. Returns its status entry for the index; errors propagate."""
    from rnr_interp.analyses.audit import run_audit
    from rnr_interp.engine.sampling import deployed_decoding
    from rnr_interp.tasks import load_task

    folder = Path(out_root) / cell.folder
    if is_finished(cell, out_root):
        return _status(cell, "skipped")
    start = time.monotonic()
    task = load_task(cell.task, data=cell.data, n=cell.n)
    lm = _model(cell.model, cell.backend)
    deployed = deployed_decoding(task, cell.max_new_tokens, temperature=cell.deployed_temperature)
    summary = run_audit(lm, task, folder, probe=cell.probe, deployed=deployed, interventions=loads(cell.interventions),
                        batch_size=cell.batch_size, progress=progress)
    return _status(cell, "done", seconds=round(time.monotonic() - start, 2),
                   D=summary.D, O_K=summary.O_K, gap=summary.gap)


def _status(cell: Cell, status: str, **extra: Any) -> dict[str, Any]:
    return {"cell_id": cell.cell_id, "folder": cell.folder, "status": status, **extra}


def _safe_run_cell(cell: Cell, out_root: str, progress: bool = False) -> dict[str, Any]:
    """`run_cell`, with an error turned into a "failed" status: one bad cell (a layer
    the model lacks, a missing file) does not stop the sweep."""
    try:
        return run_cell(cell, out_root, progress=progress)
    except Exception as exc:  # noqa: BLE001 - reported in the index, the sweep goes on
        return _status(cell, "failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=5))


# -- the index -------------------------------------------------------------------------


@dataclass
class Index:
    """``sweep.json``: every cell, its config and its latest status; rewritten
    atomically after each cell so a reader never sees half a file."""

    out: Path
    cells: list[Cell]
    runner: str
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self):
        for c in self.cells:
            self.entries[c.cell_id] = _status(c, "skipped" if is_finished(c, self.out) else "pending")
        self.write()

    def update(self, entry: dict[str, Any]) -> None:
        self.entries[entry["cell_id"]] = entry
        self.write()

    def write(self) -> None:
        write_json_atomic(self.out / INDEX, {
            "runner": self.runner,
            "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "counts": status_counts(self.entries.values()),
            "cells": [{**self.entries[c.cell_id], "cell": c.to_dict()} for c in self.cells],
        })


def status_counts(entries: Iterable[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in entries:
        counts[e["status"]] = counts.get(e["status"], 0) + 1
    return counts


def read_index(out: str | Path) -> dict[str, Any]:
    return read_json_file(Path(out) / INDEX)


def _unique(cells: Iterable[Cell]) -> list[Cell]:
    return list({c.cell_id: c for c in cells}.values())


# -- runners -----------------------------------------------------------------------------


def run_local(cells: Iterable[Cell], out: str | Path, *, progress: bool = False,
              on_status: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run the cells one after another in this process; returns their statuses."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cells = _unique(cells)
    index = Index(out, cells, runner="local")
    statuses = []
    for cell in cells:
        entry = _safe_run_cell(cell, str(out), progress=progress)
        index.update(entry)
        statuses.append(entry)
        if on_status:
            on_status(entry)
    return statuses


def run_ray(cells: Iterable[Cell], out: str | Path, *, address: str | None = None, max_retries: int = 2,
            run: Callable[[Cell, str], dict[str, Any]] = _safe_run_cell,
            on_status: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run the cells as Ray tasks, one GPU each when the cluster has GPUs. Workers write
    straight into OUT, which must be a filesystem every node sees; this driver only
    collects statuses. A worker that dies has its cell retried (`max_retries`), and the
    retry resumes that cell's run folder. Uses the Ray instance this process is already
    connected to, else connects to `address` (None: a local instance or $RAY_ADDRESS)."""
    import ray

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cells = _unique(cells)
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0
    remote = ray.remote(num_gpus=gpus, max_retries=max_retries, retry_exceptions=False)(run)
    index = Index(out, cells, runner=f"ray ({ray.get_runtime_context().gcs_address})")
    statuses: dict[str, dict[str, Any]] = {}
    pending = {}
    for cell in cells:
        if is_finished(cell, out):
            statuses[cell.cell_id] = _status(cell, "skipped")
            if on_status:
                on_status(statuses[cell.cell_id])
        else:
            pending[remote.remote(cell, str(out))] = cell
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        cell = pending.pop(ready[0])
        try:
            entry = ray.get(ready[0])
        except Exception as exc:  # noqa: BLE001 - a worker lost after its retries
            entry = _status(cell, "failed", error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        statuses[cell.cell_id] = entry
        index.update(entry)
        if on_status:
            on_status(entry)
    return [statuses[c.cell_id] for c in cells]


# -- the selection gap against temperature (the paper's Figure 3b) ---------------------
# One plain audit per temperature (same model, task, questions, K and greedy deployed
# decoding; each its own resumable run folder OUT/T=<t>), then one row per temperature:
# O_K - majority@K (the selection gap) and O_K - D, each with its paired Newcombe
# interval, plus the confidence-weighted vote's gap; all under the sweep's headline grading,
# with D, O_K under the other grading, the chance null and the unfinished rate beside.


def temperature_rows(summaries: dict[float, AuditSummary]) -> pd.DataFrame:
    """The sweep table from each temperature's audit summary."""
    import pandas as pd

    rows = []
    for t, s in sorted(summaries.items()):
        row = {"temperature": t, "k": s.k, "n_questions": s.n_questions, "D": s.D, "O_K": s.O_K,
               "oracle_minus_greedy": s.gap, "oracle_minus_greedy_lo": s.gap_ci[0], "oracle_minus_greedy_hi": s.gap_ci[1]}
        if s.grading is not None:
            other = next(g for g in ("strict", "flexible") if g != s.grading)
            beside = s.graded(other) or {}
            row.update({"grading": s.grading, f"D_{other}": beside["D"], f"O_K_{other}": beside["O_K"],
                        "unfinished_rate": (s.unfinished_rate or {}).get(s.probe, float("nan"))})
        if s.null is not None:
            row.update({"O_K_null": s.null["O_K"], "gap_above_null": s.null["gap_above_null"],
                        "gap_above_null_lo": s.null["gap_above_null_ci"][0],
                        "gap_above_null_hi": s.null["gap_above_null_ci"][1]})
        for vote in ("majority", "weighted_majority"):
            v = getattr(s, vote)
            row.update({vote: v["accuracy"], f"oracle_minus_{vote}": v["selection_gap"],
                        f"oracle_minus_{vote}_lo": v["selection_gap_ci"][0], f"oracle_minus_{vote}_hi": v["selection_gap_ci"][1]})
        rows.append(row)
    return pd.DataFrame(rows)


def run_temperature_sweep(lm: LoadedModel, task: Task, out: str | Path, temperatures: Sequence[float], k: int = 32, seed: int = 0,
                          batch_size: int = 8, progress: bool = True, grading: str | None = None) -> pd.DataFrame:
    """Audit at each temperature (resuming finished ones) and write the sweep table
    ``temperature_sweep`` into OUT, under `grading` (None: the sweep folder's own, strict
    for a new one; every temperature's audit takes the sweep's)."""
    from rnr_interp.analyses.audit import run_audit

    if not temperatures or not all(math.isfinite(t) and t > 0 for t in temperatures):
        raise ValueError(f"temperatures must be a non-empty list of finite values > 0, got {list(temperatures)}")
    run = RunDir.create(out, {"kind": TEMPERATURE_SWEEP, "model": lm.spec, "task": task.describe(),
                              "question_ids_hash": task.ids_hash(), "k": k, "seed": seed,
                              "temperatures": sorted(float(t) for t in temperatures), "grading": grading})
    summaries = {float(t): run_audit(lm, task, Path(out) / f"T={float(t):g}", probe=Probe(k=k, temperature=float(t), seed=seed),
                                     batch_size=batch_size, progress=progress, grading=run.grading)
                 for t in sorted(temperatures)}
    table = temperature_rows(summaries)
    run.write_table("temperature_sweep", table)
    run.write_summary({"kind": TEMPERATURE_SWEEP, "model": lm.spec, "task": task.name, "k": k, "grading": run.grading,
                       "rows": table.to_dict("records")})
    return table
