"""--log-to wandb|mlflow: a finished run's config, summary and tables, read back from the
trackers' own offline stores (wandb's offline run file, an MLflow file store)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rnr_interp.analyses.audit import run_audit
from rnr_interp.cli import app
from rnr_interp.engine.decoding import Decoding
from rnr_interp.engine.sampling import Probe
from rnr_interp.models import load_model
from rnr_interp.records import RunDir
from rnr_interp.report import trackers
from rnr_interp.report.trackers import log_run
from rnr_interp.tasks import load_task


@pytest.fixture(scope="module")
def run_path(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tracked") / "run"
    run_audit(load_model("tiny-llama"), load_task("arithmetic", n=3), out, probe=Probe(k=2, temperature=1.0, seed=5),
              deployed=Decoding(max_new_tokens=4), batch_size=3, progress=False, save_logprobs=True)
    return out


def numbers(summary: dict) -> dict[str, float]:
    """The summary's numbers; an undefined one (NaN: a gap recovery with no gap) is no metric."""
    return {k: float(v) for k, v in trackers.flat(summary).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)}


def test_mlflow_file_store_holds_config_summary_and_tables(run_path, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason="mlflow-skinny is not installed (the optional loggers extra)")
    store = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    where = log_run(run_path, "mlflow")
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # the opt-in is scoped to the call
    run = RunDir(run_path)
    client = mlflow.MlflowClient(tracking_uri=store)
    logged = client.get_run(where.rsplit("run ", 1)[1].rstrip(")"))
    assert logged.info.status == "FINISHED" and logged.info.run_name == "run"
    assert logged.data.params["probe.k"] == "2" and logged.data.params["run_id"] == run.run_id
    assert logged.data.params["save_logprobs"] == "true"
    summary = run.read_summary().to_json()
    assert logged.data.metrics == pytest.approx(numbers(summary))
    assert logged.data.metrics["D"] == summary["D"] and logged.data.metrics["null.O_K"] == summary["null"]["O_K"]
    artifacts = Path(logged.info.artifact_uri.removeprefix("file://"))
    assert json.loads((artifacts / "summary.json").read_text()) == summary
    table = json.loads((artifacts / "tables" / "records.json").read_text())
    records = run.read_records()
    assert table["columns"] == list(records.columns) and len(table["data"]) == len(records)
    row = dict(zip(table["columns"], table["data"][0]))
    assert row["token_ids"] == records["token_ids"][0].tolist()


def wandb_records(path: Path):
    """The protobuf records of wandb's offline run file (a LevelDB-style log of 32 KiB
    blocks after a 7-byte header), parsed with wandb's own message class."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending, pos = pending + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def undefined_as_null(value) -> str:
    """A value as JSON with each undefined number as null: wandb stores a NaN summary
    value as null (and one inside a list as NaN)."""
    return json.dumps(value, sort_keys=True).replace("NaN", "null")


def test_wandb_offline_run_holds_config_summary_and_tables(run_path, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (the optional loggers extra)")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    where = Path(tmp_path) / log_run(run_path, "wandb")
    [log] = where.glob("run-*.wandb")
    config, summary = {}, {}
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):  # the config comes with the run record or in one of its own
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({u.key: json.loads(u.value_json) for u in updates})
        elif kind == "summary":
            summary.update({u.key: json.loads(u.value_json) for u in record.summary.update if u.key})
    run = RunDir(run_path)
    assert config["probe"]["k"] == 2 and config["run_id"] == run.run_id and config["save_logprobs"] is True
    want = run.read_summary().to_json()
    assert undefined_as_null({k: summary[k] for k in want}) == undefined_as_null(want)
    [table] = (where / "files" / "media" / "table" / "tables").glob("records_*.table.json")
    logged = json.loads(table.read_text())
    records = run.read_records()
    assert logged["columns"] == list(records.columns) and len(logged["data"]) == len(records)


def test_bad_or_missing_tracker_is_refused_before_the_run(tmp_path, monkeypatch):
    args = ["audit", "--model", "tiny-llama", "--task", "arithmetic", "--n", "2", "--k", "1", "--quiet",
            "--out", str(tmp_path / "run")]
    runner = CliRunner()
    unknown = runner.invoke(app, [*args, "--log-to", "tensorboard"])
    assert unknown.exit_code == 2 and "error: --log-to: unknown tracker 'tensorboard'; known: wandb, mlflow" in unknown.output
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    missing = runner.invoke(app, [*args, "--log-to", "mlflow"])
    assert missing.exit_code == 2
    assert "error: --log-to: logging to mlflow needs the mlflow-skinny package (pip install mlflow-skinny)" in missing.output
    assert not (tmp_path / "run").exists()
    assert trackers.TRACKERS["mlflow"] == "mlflow-skinny"


def test_cli_audit_logs_to_mlflow(tmp_path):
    pytest.importorskip("mlflow", reason="mlflow-skinny is not installed (the optional loggers extra)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri()}
    proc = subprocess.run([sys.executable, "-m", "rnr_interp.cli", "audit", "--model", "tiny-llama", "--task", "arithmetic",
                           "--n", "2", "--k", "1", "--max-new-tokens", "3", "--quiet", "--log-to", "mlflow",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "logged to mlflow: file://" in proc.stdout
    assert len(list((tmp_path / "mlruns").glob("*/*/metrics/D"))) == 1


@pytest.mark.parametrize("command", ["route", "repair", "steer", "units"])
def test_every_run_command_refuses_a_bad_tracker_before_it_runs(command, tmp_path):
    result = CliRunner().invoke(app, [command, "--model", "tiny-llama", "--task", "arithmetic_mc", "--n", "2",
                                      "--log-to", "nope", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "error: --log-to: unknown tracker 'nope'" in result.output
    assert not (tmp_path / "run").exists()


def test_cli_repair_logs_its_named_tables_to_mlflow(tmp_path):
    pytest.importorskip("mlflow", reason="mlflow-skinny is not installed (the optional loggers extra)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri()}
    proc = subprocess.run([sys.executable, "-m", "rnr_interp.cli", "repair", "--model", "tiny-llama", "--task", "arithmetic_mc",
                           "--n", "6", "--panel", "3", "--layers", "0-1", "--max-new-tokens", "4", "--quiet",
                           "--log-to", "mlflow", "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    named = {p.stem for p in (tmp_path / "run" / "artefacts").glob("*.parquet")}
    logged = {p.stem for p in (tmp_path / "mlruns").glob("*/*/artifacts/tables/*.json")}
    assert named and logged == named | {"records"}
