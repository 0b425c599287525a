"""The realization/reachability audit: one run folder per (model, task, decoding, budget).

`run_audit` samples the deployed candidate and K probe samples per question into a
`RunDir` (resuming one that was interrupted), then scores it: per question `d_i`,
`c_i` of `n`, `o_i(K)`; aggregates D, O_K and the gap with intervals, and the pass@k
curve, in ``summary.json``; for multiple choice also what guessing reaches (`chance`:
uniform and from the model's own deployed answer distribution, with a warning when one
option dominates).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from rnr_interp.engine.decoding import Decoding
from rnr_interp.interventions import Intervention, dumps
from rnr_interp.metrics import audit_summary, mean_pass_at_k, question_scores, selection_summary, unparsed_rate, vote_matrix
from rnr_interp.models import LoadedModel
from rnr_interp.records import RunDir
from rnr_interp.engine.sampling import Probe, chance_summary, deployed_decoding, run_config, sample_task
from rnr_interp.tasks.base import Task

if TYPE_CHECKING:  # vLLM loads on first use
    from rnr_interp.engine.vllm_backend import VLLMModel


def audit_config(lm: LoadedModel | VLLMModel, task: Task, probe: Probe, deployed: Decoding, interventions: Sequence[Intervention], batch_size: int) -> dict[str, Any]:
    """Everything that decides the records: two runs are comparable only when these
    agree (the checkpoint audit checks them)."""
    # the prompt the questions were asked in (chat template or not): `compare` warns
    # when two runs differ here, and a shared-prompt run controls for it
    return run_config("audit", lm, task, prompt_format=lm.prompt_format.describe(), probe=asdict(probe),
                      deployed=asdict(deployed), interventions=dumps(interventions), batch_size=batch_size)


def run_audit(
    lm: LoadedModel | VLLMModel,
    task: Task,
    out: str | Path,
    *,
    probe: Probe = Probe(),
    deployed: Decoding | None = None,
    interventions: Sequence[Intervention] = (),
    batch_size: int = 8,
    ci: str = "wilson",
    progress: bool = True,
) -> dict[str, Any]:
    """Sample (or resume) and score; returns the summary written to ``summary.json``."""
    deployed = deployed or deployed_decoding(task)
    run = RunDir.create(out, audit_config(lm, task, probe, deployed, interventions, batch_size))
    sample_task(lm, task, probe=probe, deployed=deployed, run=run, interventions=interventions,
                batch_size=batch_size, run_id=run.run_id, progress=progress)
    summary = summarize(run, probe.name, ci=ci)
    chance = chance_summary(task, run.read_records(), summary["k"])
    if chance is not None:
        summary["chance"] = chance
    run.write_summary(summary)
    return summary


def summarize(run: RunDir, probe: str = "temperature", ci: str = "wilson") -> dict[str, Any]:
    records = run.read_records()
    scores = question_scores(records, probe)
    summary = audit_summary(records, probe, ci=ci)
    ks = list(range(1, int(scores["n"].min()) + 1)) if len(scores) and scores["n"].min() > 0 else []
    config = run.config
    summary.update({
        "model": config.get("model"),
        "task": (config.get("task") or {}).get("name"),
        "temperature": (config.get("probe") or {}).get("temperature"),
        "pass_at_k": {"k": ks, "pass": mean_pass_at_k(scores["n"].to_numpy(), scores["c"].to_numpy(), ks).tolist() if ks else []},
        "unparsed_rate": unparsed_rate(records) if len(records) else 0.0,
    })
    summary.update(deployable_votes(records, probe, scores))
    return summary


def deployable_votes(records: pd.DataFrame, probe: str, scores: pd.DataFrame, seed: int = 0) -> dict[str, Any]:
    """The answer-blind vote over the probe's samples, beside O_K: majority@K (ties to
    the answer sampled first) and the confidence-weighted vote, each with the selection
    gap O_K - vote, vote - D and gap recovery (paired intervals), and both along k
    (expected vote over random k-subsets of the K samples, `metrics.vote_curve`)."""
    rows = records[records["probe"] == probe].sort_values("candidate", kind="stable")
    by_q = dict(tuple(rows.groupby("question_id", sort=False)))
    cands = [by_q[q] for q in scores.index]
    k = int(scores["n"].min()) if len(scores) else 0
    if k == 0:
        return {}
    if scores["n"].max() != k:
        # At k = min n a question with more samples gets an expected vote over k-subsets,
        # a fraction, not the vote over its K samples that O_K is taken over.
        many = scores.index[scores["n"] > k][0]
        raise ValueError(f"majority@K needs the same K samples for every question: {many!r} has "
                         f"{int(scores.loc[many, 'n'])} {probe} samples, others {k}")
    ks = np.arange(1, k + 1)
    d, o = scores["d"].to_numpy(), scores["o"].to_numpy()
    out: dict[str, Any] = {"vote_at_k": {"k": ks.tolist()}}
    for name, weighted in (("majority", False), ("weighted_majority", True)):
        curve = vote_matrix(cands, ks, weighted, seed=seed)
        out["vote_at_k"][name] = curve.mean(0).tolist()
        out[name] = {"k": k, **selection_summary(d, o, curve[:, -1].astype(bool))}
    return out
