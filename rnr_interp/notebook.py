"""The notebook API: one call per analysis, on a model and a task given as objects or
spec strings, returning a `Result` with the analysis's summary and its records as a
DataFrame.

    import rnr_interp as rnr
    res = rnr.audit(model, "arithmetic", k=32)
    res.summary.O_K, res.records

Each call writes the analysis's run folder as the command line does: at `out=` when
given (kept, resumable, readable by `rnr report`), else in a temporary folder that is
read into the `Result` and removed before the call returns, so nothing is left on disk.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import pandas as pd

    from rnr_interp.models import LoadedModel
    from rnr_interp.records import Summary
    from rnr_interp.tasks.base import Task

@dataclass(frozen=True)
class Result:
    """What an analysis returns: its typed summary (what `summary.json` holds, as its
    kind's class in `records.summaries`: `res.summary.O_K`), its records
    (one row per candidate; where the run writes none, its kind's per-row table:
    `report.kinds.Analysis.rows_table`),
    its named tables, and the run folder when one was kept (`out=`), else None."""

    kind: str
    summary: Summary
    records: pd.DataFrame
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    out: Path | None = None

    def __repr__(self) -> str:
        where = f", out={str(self.out)!r}" if self.out is not None else ""
        return f"Result(kind={self.kind!r}, {len(self.records)} records, tables={sorted(self.tables)}{where})"


def read_result(folder: Path, summary: Summary, kept: bool) -> Result:
    """A finished run folder read into memory."""
    from rnr_interp.records import RunDir
    from rnr_interp.report.kinds import analysis_of

    run = RunDir(folder)
    tables = {path.stem: run.read_table(path.stem) for path in sorted(run.artefacts_dir.glob("*.parquet"))}
    records, rows = run.read_records(), analysis_of(summary.kind).rows_table
    if records.empty and rows in tables:
        records = tables[rows]
    return Result(summary.kind, summary, records, tables, folder if kept else None)


@contextmanager
def run_folder(out: str | Path | None) -> Iterator[tuple[Path, bool]]:
    """The folder a run writes: `out` (checked as `--out` is, kept), else a temporary
    one removed on exit. Yields the folder and whether it is kept."""
    if out is not None:
        from rnr_interp.records import check_out_folder

        check_out_folder(out, "out")
        yield Path(out), True
        return
    with tempfile.TemporaryDirectory(prefix="rnr-") as tmp:
        yield Path(tmp) / "run", False


def as_model(model: Any) -> LoadedModel:
    """A model given as a spec string, a path or an object (`models.load_model`)."""
    from rnr_interp import models

    return models.load_model(model)


def as_task(task: Task | str, n: int | None = None, data: str | Path | None = None, **task_options: Any) -> Task:
    """A task given as an object or a spec string (`tasks.load_task`); `n`, `data` and
    `task_options` go with a spec string only."""
    from rnr_interp.tasks import load_task

    if not isinstance(task, str):
        if n is not None or data is not None or task_options:
            raise ValueError("n, data and task options go with a task spec string; a Task object is used as it is")
        return task
    return load_task(task, data=data, n=n, **task_options)


def inputs(model: Any, task: Task | str, n: int | None, data: str | Path | None,
           max_new_tokens: int | None = None) -> tuple[LoadedModel, Task]:
    """The model and task of a call, after the command line's checks: a task with
    questions (loaded first: quicker to find wrong than the model), every prompt plus
    its generation (`max_new_tokens`, default the task's) inside the model's context."""
    from rnr_interp.engine.sampling import ask_as_the_task_says, check_prompts_fit

    t = as_task(task, n, data)
    if len(t) == 0:
        raise ValueError(f"task {t.name!r} has no questions")
    lm = as_model(model)
    ask_as_the_task_says(lm, t)
    check_prompts_fit(lm, t, max_new_tokens or t.max_new_tokens)
    return lm, t


def audit(model: Any, task: Task | str, *, k: int = 32, temperature: float | None = None, seed: int = 0,
          max_new_tokens: int | None = None, n: int | None = None, data: str | Path | None = None,
          out: str | Path | None = None, progress: bool = True, **options: Any) -> Result:
    """The realization/reachability audit (`rnr audit`): D, O_K and the gap, K = `k`
    samples at `temperature` (default: the probe's). `options` go to
    `analyses.audit.run_audit` (batch_size, ci, grading, circular, interventions)."""
    from rnr_interp.analyses.audit import run_audit
    from rnr_interp.engine.sampling import Probe, deployed_decoding

    probe = Probe(k=k, seed=seed) if temperature is None else Probe(k=k, seed=seed, temperature=temperature)
    lm, t = inputs(model, task, n, data, max_new_tokens)
    with run_folder(out) as (folder, kept):
        summary = run_audit(lm, t, folder, probe=probe, deployed=deployed_decoding(t, max_new_tokens), progress=progress,
                            **options)
        return read_result(folder, summary, kept)


def route(model: Any, task: Task | str, *, k: int = 32, n: int | None = None, data: str | Path | None = None,
          out: str | Path | None = None, progress: bool = True, grading: str | None = None, **config: Any) -> Result:
    """The routing audit (`rnr route`): K = `k` temperature samples and `k` route
    evaluations per search and question. `config` sets `RouteConfig` fields (spaces,
    methods, samples, budget, seed, ...; `samples`/`budget` override `k`)."""
    from rnr_interp.analyses.routing.config import RouteConfig
    from rnr_interp.analyses.routing.run import run_route_audit

    cfg = RouteConfig(**{"samples": k, "budget": k, **config})
    lm, t = inputs(model, task, n, data)  # routes decode to the task's length
    with run_folder(out) as (folder, kept):
        return read_result(folder, run_route_audit(lm, t, folder, cfg, progress=progress, grading=grading), kept)


def repair(model: Any, task: Task | str, *, n: int | None = None, data: str | Path | None = None,
           out: str | Path | None = None, progress: bool = True, **options: Any) -> Result:
    """The silencing sweep (`rnr repair`) on a multiple-choice task: repair and damage
    by layer and the chosen block. `options` go to `analyses.localise.repair.run_repair`
    (readout, panel, split, layers, components, sweep, permutation_control, circular)."""
    from rnr_interp.analyses.localise.repair import run_repair

    lm, t = inputs(model, task, n, data)
    with run_folder(out) as (folder, kept):
        return read_result(folder, run_repair(lm, t, folder, progress=progress, **options), kept)


def steer(model: Any, task: Task | str, *, repair_run: Result | str | Path | None = None, n: int | None = None,
          data: str | Path | None = None, out: str | Path | None = None, progress: bool = True, **options: Any) -> Result:
    """Reciprocal steering (`rnr steer`) along the failure direction of a block: the
    one `repair_run` chose (a `Result` of `repair(..., out=...)` or its folder), else
    `layer=`/`component=`. `options` go to `analyses.localise.steering.run_steer`
    (alphas, alpha_unit, readout, panel, split, permutation_control, circular, read_at, steer_at,
    random_control, clamp_control)."""
    from rnr_interp.analyses.localise.steering import run_steer

    lm, t = inputs(model, task, n, data)
    with run_folder(out) as (folder, kept):
        summary = run_steer(lm, t, folder, repair_run=kept_folder(repair_run, "repair_run"), progress=progress, **options)
        return read_result(folder, summary, kept)


def kept_folder(run: Result | str | Path | None, name: str) -> Path | None:
    """A run folder given as a path or as a `Result` whose folder was kept."""
    if isinstance(run, Result):
        if run.out is None:
            raise ValueError(f"{name}: this {run.kind} result was kept in memory only; run it with out=FOLDER to use it here")
        return run.out
    return None if run is None else Path(run)


def compare(base: Any, trained: Any, task: Task | str | None = None, *, k: int = 32, n: int | None = None,
            data: str | Path | None = None, out: str | Path | None = None, progress: bool = True,
            audit_options: dict[str, Any] | None = None, **options: Any) -> Result:
    """The checkpoint audit (`rnr compare`), base vs trained, question by question.
    Each side is an audit kept on disk (a `Result` of `audit(..., out=...)` or its run
    folder), or, with `task`, a model (object or spec) audited here first at K = `k`
    (`audit_options` go to both audits, in temporary folders unless `out` is given, then
    under it as base/ and trained/). `options` go to `analyses.checkpoints.compare_runs`
    (edges, level, grading, shared_prompt)."""
    from rnr_interp.analyses.checkpoints import compare_runs
    from rnr_interp.records import RunDir

    t = None if task is None else as_task(task, n, data)
    with run_folder(out) as (folder, kept):
        sides = {role: audited(side, role, t, folder.parent if not kept else folder, k=k, progress=progress,
                               **(audit_options or {})) for role, side in (("base", base), ("trained", trained))}
        target = folder / "compare" if kept else folder
        summary = compare_runs(RunDir(sides["base"]), RunDir(sides["trained"]), target, **options)
        return read_result(target, summary, kept)


def audited(side: Any, role: str, task: Task | None, root: Path, **audit_options: Any) -> Path:
    """One side of a comparison as an audit run folder: a kept `Result` or a folder with
    a manifest as it is, else a model audited on `task` into `root/role`."""
    from rnr_interp.records import MANIFEST

    if isinstance(side, Result):
        return kept_folder(side, role)
    if isinstance(side, (str, Path)) and (Path(side) / MANIFEST).is_file():
        return Path(side)
    if task is None:
        raise ValueError(f"{role}: not an audit run folder; to audit a model here, pass the task too")
    return audit(side, task, out=root / role, **audit_options).out

