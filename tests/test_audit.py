"""The audit end to end: a real kill and resume, the CLI, and SmolLM2's gap."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rnr_interp.analyses.audit import run_audit
from rnr_interp.metrics import question_scores
from rnr_interp.records import RunDir
from rnr_interp.engine.sampling import Probe
from rnr_interp.tasks import load_task

AUDIT = ["--model", "tiny-llama", "--task", "arithmetic", "--n", "24", "--k", "8", "--batch-size", "3", "--quiet"]
KEY = ["question_id", "probe", "candidate"]


def rnr(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "rnr_interp.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def records(run: Path):
    df = RunDir(run).read_records()
    return df.drop(columns=["run_id"]).sort_values(KEY).reset_index(drop=True)


def test_killed_audit_resumes_to_the_same_records(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert rnr("audit", *AUDIT, "--out", str(whole)).wait(timeout=300) == 0
    proc = rnr("audit", *AUDIT, "--out", str(killed))
    deadline = time.time() + 300
    while not list((killed / "records").glob("part-*.parquet")) and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    parts_before = sorted(p.name for p in (killed / "records").glob("part-*.parquet"))
    assert 0 < len(parts_before) < 8, "the kill should land mid-run (8 chunks of 3 questions)"
    done_before = RunDir(killed).done_question_ids()
    resumed = rnr("audit", *AUDIT, "--out", str(killed))
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert records(killed).equals(records(whole))
    # Finished chunks were not redone: their part files are still the first ones.
    after = records(killed)
    assert len(after) == len(after.drop_duplicates(KEY))
    assert done_before < RunDir(killed).done_question_ids()


def test_audit_cli_writes_summary_and_table(tmp_path):
    proc = rnr("audit", *AUDIT, "--out", str(tmp_path / "run"))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "O_K  (reachable)" in out and "gap  O_K - D" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"n_questions", "k", "D", "O_K", "gap", "D_ci", "O_K_ci", "gap_ci"} <= summary.keys()
    assert summary["n_questions"] == 24 and summary["k"] == 8
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert {"model", "task", "probe", "deployed"} <= manifest["config"].keys()
    assert "torch" in manifest["versions"]


def test_audit_cli_refuses_bad_input_in_one_line(tmp_path):
    proc = rnr("audit", "--model", "tiny-llama", "--task", "nope", "--out", str(tmp_path / "r"))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "unknown task" in err.lower()


@pytest.mark.slow
def test_smollm2_arithmetic_shows_a_real_gap(smollm2, tmp_path):
    """O_K well above D at K=32, measured on the model (no fixture): the demo setting.
    Flexibly graded (the rule before strict grading came): most of the samples that make
    the gap state their sum in prose ("80 + 66 equals 146, which is..."), which the
    strict grade does not read; strictly, the reachable set is still well above what the
    same samples reach against other questions' golds (docs/grading.md)."""
    task = load_task("arithmetic", n=24)
    s = run_audit(smollm2, task, tmp_path, probe=Probe(k=32, temperature=1.0), progress=False)
    assert s.grading == "strict"
    scores = question_scores(RunDir(tmp_path).read_records(), "temperature")  # `correct`: the headline grade
    assert s.D == pytest.approx(scores["d"].mean()) and s.O_K == pytest.approx(scores["o"].mean())
    flexible = s.flexible
    assert 0 < flexible["D"] < 1
    assert flexible["O_K"] >= flexible["D"] + 0.15 and flexible["gap_ci"][0] > 0
    assert s.null["O_K_minus_null_ci"][0] > 0 and not s.null["indistinguishable"]


def test_audit_reports_majority_at_k_from_the_records():
    """majority@K in the summary is the plain vote over each question's K samples (ties
    to the answer sampled first), and its gaps are the paired differences."""
    import pandas as pd

    from rnr_interp.analyses.audit import deployable_votes

    # question: (deployed right?, samples as (answer, right?)); gold is "7" throughout.
    cases = {
        "q1": (False, ["3", "7", "7", "3", None]),  # 2-2 tie, "3" first: majority wrong, reachable
        "q2": (False, ["7", "7", "5", None, None]),  # majority right, deployed wrong
        "q3": (True, ["5", "5", "7", "1", "2"]),  # majority wrong, deployed right
        "q4": (False, ["1", "2", "3", "4", "5"]),  # unreachable
    }
    rows = []
    for qid, (dep, samples) in cases.items():
        rows.append({"question_id": qid, "probe": "deployed", "candidate": 0, "extracted": "7" if dep else "0",
                     "correct": dep, "logprob": -1.0, "n_tokens": 2})
        rows += [{"question_id": qid, "probe": "temperature", "candidate": i, "extracted": a, "correct": a == "7",
                  "logprob": -1.0, "n_tokens": 2} for i, a in enumerate(samples)]
    records = pd.DataFrame(rows)
    out = deployable_votes(records, "temperature", question_scores(records, "temperature"))
    m = out["majority"]
    assert m["k"] == 5 and m["accuracy"] == 0.25  # q2 only
    assert m["selection_gap"] == pytest.approx(0.75 - 0.25)  # O_K: q1, q2, q3
    assert m["minus_deployed"] == 0.0 and m["gap_recovery"] == 0.0  # one gained (q2), one lost (q3)
    assert out["vote_at_k"]["majority"][-1] == 0.25 and len(out["vote_at_k"]["k"]) == 5
    # k = 1: the chance that one random sample is right, averaged over questions.
    assert out["vote_at_k"]["majority"][0] == pytest.approx(np.mean([2 / 5, 2 / 5, 1 / 5, 0]), abs=0.05)
    # a question with more samples than the others has no majority@K beside them
    extra = pd.DataFrame([{**rows[-1], "candidate": 5}])
    uneven = pd.concat([records, extra], ignore_index=True)
    with pytest.raises(ValueError, match="'q4' has 6 temperature samples, others 5"):
        deployable_votes(uneven, "temperature", question_scores(uneven, "temperature"))
