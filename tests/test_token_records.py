"""--save-logprobs: each candidate's token ids and per-token log-probs in the records, the
log-probs those of the model's own forward pass over prompt + tokens; off by default,
leaving the records and run id as they were."""

import json
import math
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from rnr_interp.analyses.audit import run_audit
from rnr_interp.engine.decoding import Decoding
from rnr_interp.engine.generate import forward
from rnr_interp.engine.sampling import Probe, prompt_ids
from rnr_interp.models import load_model
from rnr_interp.records import RECORD_COLUMNS, RunDir
from rnr_interp.records.reference import records_reference
from rnr_interp.records.schema import MANIFEST, RECORDS_VERSION, RECORDS_VERSION_KEY, TOKEN_COLUMNS, RunFolderError
from rnr_interp.tasks import load_task

PROBE = Probe(k=2, temperature=1.0, seed=3)
DEPLOYED = Decoding(max_new_tokens=5)


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama")


@pytest.fixture(scope="module")
def task():
    return load_task("arithmetic", n=3)


def audited(lm, task, folder, **kw) -> RunDir:
    run_audit(lm, task, folder, probe=PROBE, deployed=DEPLOYED, batch_size=2, progress=False, **kw)
    return RunDir(folder)


def test_token_columns_hold_the_model_s_own_log_probs(lm, task, tmp_path):
    run = audited(lm, task, tmp_path / "run", save_logprobs=True)
    records = run.read_records()
    assert list(records.columns) == [*RECORD_COLUMNS, *TOKEN_COLUMNS]
    assert run.manifest["record_columns"] == [*RECORD_COLUMNS, *TOKEN_COLUMNS]
    by_id = {q.id: q for q in task.questions}
    for row in records.itertuples():
        ids, logps = list(row.token_ids), list(row.token_logprobs)
        assert len(ids) == len(logps) == row.n_tokens
        assert math.fsum(logps) == pytest.approx(row.logprob, abs=1e-9)
        # teacher-forced: the log-softmax at each generated position picks the same log-prob
        prompt = prompt_ids(lm, task, by_id[row.question_id])
        seq = torch.tensor([prompt + ids], device=lm.device)
        with torch.inference_mode():
            logits, _ = forward(lm, seq, torch.ones_like(seq))
        logp = torch.log_softmax(logits[0].float(), -1)
        want = [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(ids)]
        assert logps == pytest.approx(want, abs=1e-4), (row.question_id, row.probe, row.candidate)


def test_without_the_flag_records_and_run_id_are_unchanged(lm, task, tmp_path):
    plain, tokens = audited(lm, task, tmp_path / "plain"), audited(lm, task, tmp_path / "tokens", save_logprobs=True)
    assert "save_logprobs" not in plain.config and plain.manifest["record_columns"] == list(RECORD_COLUMNS)
    for part in plain.parts():
        assert pq.read_schema(part).names == list(RECORD_COLUMNS)
    assert tokens.run_id != plain.run_id  # a different config, so never resumed as the other
    same = [c for c in RECORD_COLUMNS if c != "run_id"]
    assert plain.read_records()[same].equals(tokens.read_records()[same])


def test_a_token_run_resumes_compacts_and_snapshots_with_its_columns(lm, task, tmp_path):
    run = audited(lm, task, tmp_path / "run", save_logprobs=True)
    before = run.read_records()
    run.release()
    again = audited(lm, task, tmp_path / "run", save_logprobs=True)  # resumes: nothing left to do
    assert again.read_records().equals(before)
    again.compact()
    assert again.read_records().equals(before) and len(again.parts()) == 1
    snap = again.snapshot(tmp_path / "snap")
    assert list(snap.read_records().columns) == [*RECORD_COLUMNS, *TOKEN_COLUMNS]


def test_rows_without_tokens_in_a_token_run_hold_nulls(lm, task, tmp_path):
    """A row that generates nothing (self-verification) carries no token columns."""
    run = audited(lm, task, tmp_path / "run", save_logprobs=True)
    row = run.read_records().iloc[0].to_dict()
    row = {k: v for k, v in row.items() if k not in TOKEN_COLUMNS} | {"probe": "verify:temperature"}
    run.write_question_batch([row])
    verify = run.read_records().query("probe == 'verify:temperature'")
    assert verify["token_ids"].isna().all() and verify["token_logprobs"].isna().all()


def test_cli_save_logprobs(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rnr_interp.cli", "audit", "--model", "tiny-llama", "--task", "arithmetic",
                           "--n", "2", "--k", "2", "--max-new-tokens", "4", "--quiet", "--save-logprobs", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    records = RunDir(out).read_records()
    assert (records["token_ids"].map(len) == records["n_tokens"]).all()


def test_a_new_run_records_its_records_version_and_a_newer_one_is_refused(lm, task, tmp_path):
    run = audited(lm, task, tmp_path / "run")
    assert run.manifest[RECORDS_VERSION_KEY] == RECORDS_VERSION
    run.release()
    manifest = json.loads((run.path / MANIFEST).read_text())
    (run.path / MANIFEST).write_text(json.dumps({**manifest, RECORDS_VERSION_KEY: RECORDS_VERSION + 1}))
    with pytest.raises(RunFolderError, match=f"records version {RECORDS_VERSION + 1}; this rnr_interp reads versions up to"):
        RunDir(run.path)
    proc = subprocess.run([sys.executable, "-m", "rnr_interp.cli", "report", str(run.path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "records version" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    del manifest[RECORDS_VERSION_KEY]  # a run from before the version was recorded still reads
    (run.path / MANIFEST).write_text(json.dumps(manifest))
    assert len(RunDir(run.path).read_records()) == len(task.questions) * (1 + PROBE.k)


def test_the_records_reference_lists_the_token_columns():
    doc = records_reference()
    for name in TOKEN_COLUMNS:
        assert f"| `{name}` |" in doc
    assert f"`{RECORDS_VERSION_KEY}`" in doc
