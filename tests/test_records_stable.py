"""Records are a published format: restructuring the code must not change one value.

An audit and a repair run on a tiny model are hashed value by value (every column but
`run_id`, every row, in stored order) and compared with hashes taken from the code as it
was before the analysis layers were restructured (commit 15fe5fa; recomputed without
`run_id` at e992296, whose records equal 15fe5fa's). `run_id` derives from the run
config, which gains keys when a run records more about itself (prompt format, split);
the records' values must not move. The repair run is decoded with the 8 new tokens that
were then the multiple-choice default (every command now uses the task's own length), and
without the prefix reuse of `cohort.run_rows` (replayed blocks come from another batch's
prefill, which moves log-probs in their last float32 bits; bounded below like the fused
attention's). A change here means old and new records would disagree.
"""

from __future__ import annotations

import functools
import hashlib

import pandas as pd
import pytest

from rnr_interp import cohort, fast_attention
from rnr_interp.audit import run_audit
from rnr_interp.generate import Decoding
from rnr_interp.models import load_model
from rnr_interp.records import RunDir
from rnr_interp import repair
from rnr_interp.repair import run_repair
from rnr_interp.sampling import Probe
from rnr_interp.tasks import load_task

#: sha256 of the records' values, computed by `content_hash` (without run_id) at e992296.
#: History: main once updated these hashes (with run_id) when the task description
#: gained `answer_kind` (grading by answer kind, issue 17): that changed `run_id` (a
#: hash of the config) and nothing else; without the run_id column the hashes stay
#: those of 15fe5fa / e992296 below.
BEFORE = {
    "audit": "95a12e8c77a86f1f1a211e4fce96460145997a803c7d5ecf380e04d6d95a74c9",
    "repair": "71105c9c440b19dfb2289258bf086f2831b2181a59fe960f7cde68dd953a2673",
}


def content_hash(run: RunDir) -> str:
    records = run.read_records().drop(columns=["run_id"])
    h = hashlib.sha256()
    h.update(repr(list(records.columns)).encode())
    h.update(repr([str(t) for t in records.dtypes]).encode())
    h.update(pd.util.hash_pandas_object(records, index=False).to_numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def lm():
    """tiny-llama on the bridge's eager attention, the path the hashes were taken on. The
    fused attention path (`fast_attention`) moves log-probs in their last float32 bits;
    `test_fused_attention_records_equal_eager_records` bounds that difference."""
    model = load_model("tiny-llama")
    fast_attention.uninstall(model.bridge)
    return model


def audit_records(lm, folder) -> RunDir:
    run_audit(lm, load_task("arithmetic", n=5), folder, probe=Probe(k=3, temperature=1.0, seed=1),
              deployed=Decoding(max_new_tokens=6), batch_size=2, progress=False)
    return RunDir(folder)


def repair_records(lm, folder, reuse_prefix: bool = False) -> RunDir:
    run_rows = functools.partial(cohort.run_rows, reuse_prefix=reuse_prefix)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repair, "run_rows", run_rows)
        return _repair_records(lm, folder)


def _repair_records(lm, folder) -> RunDir:
    run_repair(lm, load_task("arithmetic_mc", n=6), folder, panel=3, layers=[0, 1], batch_size=4, progress=False,
               decoding=Decoding(max_new_tokens=8))
    return RunDir(folder)


def test_audit_records_unchanged(lm, tmp_path):
    assert content_hash(audit_records(lm, tmp_path)) == BEFORE["audit"]


def test_repair_records_unchanged(lm, tmp_path):
    assert content_hash(repair_records(lm, tmp_path)) == BEFORE["repair"]


@pytest.mark.parametrize("records", [audit_records, repair_records])
def test_fused_attention_records_equal_eager_records(lm, records, tmp_path):
    """Every value equal, but log-probs, which agree to float32 rounding."""
    eager = records(lm, tmp_path / "eager").read_records()
    fused = records(load_model("tiny-llama"), tmp_path / "fused").read_records()
    pd.testing.assert_frame_equal(fused.drop(columns=["logprob"]), eager.drop(columns=["logprob"]))
    assert (fused["logprob"] - eager["logprob"]).abs().max() < 1e-4


def test_prefix_reuse_records_equal_full_prefill_records(lm, tmp_path):
    """The repair run as it runs by default (blocks before the silenced one replayed):
    every value equal, but log-probs, which agree to float32 rounding."""
    full = repair_records(lm, tmp_path / "full").read_records()
    reused = repair_records(lm, tmp_path / "reused", reuse_prefix=True).read_records()
    pd.testing.assert_frame_equal(reused.drop(columns=["logprob", "run_id"]), full.drop(columns=["logprob", "run_id"]))
    assert (reused["logprob"] - full["logprob"]).abs().max() < 1e-4
