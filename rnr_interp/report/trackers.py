"""A finished run logged to an experiment tracker (`--log-to`): its config, its summary
and its tables (the records and every named table), offline. wandb writes an offline
run (`wandb sync` uploads it later) under WANDB_DIR, else the working folder; MLflow
logs to MLFLOW_TRACKING_URI, else a file store `./mlruns`. Each tracker's package is
optional: one that is missing is refused in one line naming the package to install."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from rnr_interp.records import RunDir

#: tracker name -> the package that provides it (mlflow-skinny: the client and file store
#: without the server, whose pins would move packages this project already pins)
TRACKERS: dict[str, str] = {"wandb": "wandb", "mlflow": "mlflow-skinny"}
#: the project a run is logged under, where the tracker's own variable does not say
PROJECT = "rnr"
#: MLflow refuses longer parameter values; the full config is logged as config.json too
MLFLOW_PARAM_CHARS = 6000


class TrackerError(ValueError):
    """An unknown tracker, or one whose package is not installed."""


def check_tracker(name: str) -> None:
    """Refuse an unknown tracker or one that is not installed, before any run starts."""
    if name not in TRACKERS:
        raise TrackerError(f"unknown tracker {name!r}; known: {', '.join(TRACKERS)}")
    if importlib.util.find_spec(name) is None:
        raise TrackerError(f"logging to {name} needs the {TRACKERS[name]} package (pip install {TRACKERS[name]})")


def log_run(path: str | os.PathLike[str], tracker: str) -> str:
    """Log the run folder at `path` to `tracker`; returns where it went."""
    check_tracker(tracker)
    run = RunDir(path)
    config = {"run_id": run.run_id, **run.config}
    summary = run.read_summary().to_json() if run.has_summary() else {}
    tables = dict(run_tables(run))
    return (_log_wandb if tracker == "wandb" else _log_mlflow)(run.path.name, config, summary, tables)


def run_tables(run: RunDir) -> Iterator[tuple[str, pd.DataFrame]]:
    """The records, then every named table, with list cells (token columns) as lists."""
    yield "records", _plain(run.read_records())
    if run.artefacts_dir.is_dir():
        for table in sorted(run.artefacts_dir.glob("*.parquet")):
            yield table.stem, _plain(run.read_table(table.stem))


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for column in df.columns[df.dtypes == object]:
        df[column] = [v.tolist() if isinstance(v, np.ndarray) else v for v in df[column]]
    return df


def flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted keys."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def _log_wandb(name: str, config: dict[str, Any], summary: dict[str, Any], tables: dict[str, pd.DataFrame]) -> str:
    import wandb

    run = wandb.init(mode="offline", dir=os.environ.get("WANDB_DIR", "."), project=os.environ.get("WANDB_PROJECT", PROJECT),
                     name=name, config=config, settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    try:
        run.summary.update(summary)
        run.log({f"tables/{key}": wandb.Table(dataframe=df) for key, df in tables.items()})
    finally:
        run.finish()
        # finish() can return before wandb's service has written the run file out; its
        # teardown waits for that, so the offline run is complete when this returns
        wandb.teardown()
    return str(Path(run.dir).parent)


#: characters MLflow allows in a parameter or metric name
_MLFLOW_KEY = re.compile(r"[^\w\-. /:]")


def _log_mlflow(name: str, config: dict[str, Any], summary: dict[str, Any], tables: dict[str, pd.DataFrame]) -> str:
    import mlflow

    uri = os.environ.get("MLFLOW_TRACKING_URI") or Path("mlruns").resolve().as_uri()
    # MLflow 3 refuses a file store unless this is set: the file store is what logs offline
    allowed = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        return _log_mlflow_to(mlflow, mlflow.MlflowClient(tracking_uri=uri), uri, name, config, summary, tables)
    finally:
        if allowed is None:
            del os.environ["MLFLOW_ALLOW_FILE_STORE"]
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = allowed


def _log_mlflow_to(mlflow, client, uri: str, name: str, config: dict[str, Any], summary: dict[str, Any],
                   tables: dict[str, pd.DataFrame]) -> str:
    experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    run_id = client.create_run(experiment_id, run_name=name).info.run_id
    status = "FAILED"
    try:
        params = [mlflow.entities.Param(_MLFLOW_KEY.sub("_", k), json.dumps(v) if not isinstance(v, str) else v)
                  for k, v in flat(config).items()]
        params = [mlflow.entities.Param(p.key, p.value[:MLFLOW_PARAM_CHARS]) for p in params]
        metrics = [mlflow.entities.Metric(_MLFLOW_KEY.sub("_", k), float(v), 0, 0) for k, v in flat(summary).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
        for start in range(0, max(len(params), len(metrics)), 100):  # MLflow takes 100 params (and 1000 metrics) a batch
            client.log_batch(run_id, params=params[start:start + 100], metrics=metrics[start:start + 100])
        client.log_dict(run_id, config, "config.json")
        client.log_dict(run_id, summary, "summary.json")
        for key, df in tables.items():
            client.log_table(run_id, df, f"tables/{key}.json")
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status)
    return f"{uri} (experiment {experiment}, run {run_id})"
