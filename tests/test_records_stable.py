"""Records are a published format: restructuring the code must not change one value.

An audit and a repair run on a tiny model are hashed value by value (every column,
every row, in stored order) and compared with hashes taken from the code as it was
before the analysis layers were restructured (commit 15fe5fa). A change here means
existing run folders would no longer resume, or old and new records would disagree.
"""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

from rnr_interp.audit import run_audit
from rnr_interp.generate import Decoding
from rnr_interp.models import load_model
from rnr_interp.records import RunDir
from rnr_interp.repair import run_repair
from rnr_interp.sampling import Probe
from rnr_interp.tasks import load_task

#: sha256 of the records' values, computed by `content_hash` at commit 15fe5fa, then
#: once more when the task description gained `answer_kind` (grading by answer kind,
#: issue 17): that changed `run_id` (a hash of the config) and nothing else; without
#: the run_id column the hashes are those of 15fe5fa (95a12e8c... and 71105c9c...).
BEFORE = {
    "audit": "6e31e18951ad5cb0c76a3450970c530fcc16a22fe34a3a6bb97c974ea2a182f2",
    "repair": "4d4d8047ad2026522626442a9a806e96ddbcfba350e415071c6c3f89f13c7e2c",
}


def content_hash(run: RunDir) -> str:
    records = run.read_records()
    h = hashlib.sha256()
    h.update(repr(list(records.columns)).encode())
    h.update(repr([str(t) for t in records.dtypes]).encode())
    h.update(pd.util.hash_pandas_object(records, index=False).to_numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama")


def test_audit_records_unchanged(lm, tmp_path):
    run_audit(lm, load_task("arithmetic", n=5), tmp_path, probe=Probe(k=3, temperature=1.0, seed=1),
              deployed=Decoding(max_new_tokens=6), batch_size=2, progress=False)
    assert content_hash(RunDir(tmp_path)) == BEFORE["audit"]


def test_repair_records_unchanged(lm, tmp_path):
    run_repair(lm, load_task("arithmetic_mc", n=6), tmp_path, panel=3, layers=[0, 1], batch_size=4, progress=False)
    assert content_hash(RunDir(tmp_path)) == BEFORE["repair"]
