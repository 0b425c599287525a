"""The realization/reachability audit: one run folder per (model, task, decoding, budget).

`run_audit` samples the deployed candidate and K probe samples per question into a
`RunDir` (resuming one that was interrupted), then scores it: per question `d_i`,
`c_i` of `n`, `o_i(K)`; aggregates D, O_K and the gap with intervals, and the pass@k
curve, in ``summary.json``; for multiple choice also what guessing reaches (`chance`:
uniform and from the model's own deployed answer distribution, with a warning when one
option dominates).

Every number is under the run's headline grading (`grading`, strict unless the run says
otherwise), with both gradings' D, O_K, gap and pass@k beside (`strict`, `flexible`),
the chance null (`null`, `grading.null_summary`) and the share of candidates the token
limit stopped (`unfinished_rate`, per probe). With `circular`, multiple-choice
questions are also asked under every cyclic shift of their options (`circular`).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from rnr_interp.engine.decoding import Decoding
from rnr_interp.grading import (circular_null, circular_scores, circular_shifts, graded, null_summary, question_null,
                                regrade, rotated_task, unfinished_rate, unfinished_warning)
from rnr_interp.interventions import Intervention, dumps
from rnr_interp.metrics import (audit_summary, mean_pass_at_k, paired_diff_ci, question_scores, selection_summary,
                                unparsed_rate, vote_matrix, wilson_interval)
from rnr_interp.models import LoadedModel
from rnr_interp.records import AUDIT, DEPLOYED, GRADINGS, AuditSummary, ProbeLabel, RunDir
from rnr_interp.engine.sampling import Probe, chance_summary, deployed_decoding, run_config, sample_task
from rnr_interp.tasks.base import Task

if TYPE_CHECKING:  # vLLM loads on first use
    from rnr_interp.engine.vllm_backend import VLLMModel


def audit_config(lm: LoadedModel | VLLMModel, task: Task, probe: Probe, deployed: Decoding, interventions: Sequence[Intervention], batch_size: int,
                 grading: str | None = None, circular: bool = False, save_logprobs: bool = False) -> dict[str, Any]:
    """Everything that decides the records: two runs are comparable only when these
    agree (the checkpoint audit checks them). `circular` is recorded only when on, so a
    run without it keeps the config (and id) it had before circular evaluation came."""
    # the prompt the questions were asked in (chat template or not): `compare` warns
    # when two runs differ here, and a shared-prompt run controls for it
    return run_config(AUDIT, lm, task, grading=grading, save_logprobs=save_logprobs, prompt_format=lm.prompt_format.describe(), probe=asdict(probe),
                      deployed=asdict(deployed), interventions=dumps(interventions), batch_size=batch_size,
                      **({"circular": True} if circular else {}))


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
    grading: str | None = None,
    circular: bool = False,
    save_logprobs: bool = False,
) -> AuditSummary:
    """Sample (or resume) and score; returns the summary written to ``summary.json``.
    `grading`: the headline grading (None: the folder's own, strict for a new run);
    `circular`: ask multiple-choice questions under every cyclic shift of their options;
    `save_logprobs`: the records hold each candidate's token ids and log-probs."""
    deployed = deployed or deployed_decoding(task)
    shifts = circular_shifts(task) if circular else [0]  # refuses a task without letter options first
    run = RunDir.create(out, audit_config(lm, task, probe, deployed, interventions, batch_size, grading, circular,
                                              save_logprobs))
    for shift in shifts:
        # shift 0: the questions as loaded, under the plain labels; else rotated ones under rotated:SHIFT:...
        asked = task if shift == 0 else rotated_task(task, shift)
        label = (lambda name: name) if shift == 0 else \
            (lambda name: str(ProbeLabel.rotated(ProbeLabel.parse(name), shift)))
        sample_task(lm, asked, probe=replace(probe, name=label(probe.name)), deployed=deployed, run=run,
                    interventions=interventions, batch_size=batch_size, run_id=run.run_id, progress=progress,
                    deployed_label=label(DEPLOYED))
    return run.write_summary(summarize(run, probe.name, ci=ci, task=task))


def summarize(run: RunDir, probe: str = "temperature", ci: str = "wilson", task: Task | None = None,
              grading: str | None = None) -> AuditSummary:
    """The audit summary of a run folder's records under `grading` (default: the run's),
    the other grading beside. `task` (the run's) reads strict grades missing from old
    records and builds the chance null; without it the summary has no null."""
    grading = grading or run.grading
    records = run.read_records()
    if task is not None:
        records = regrade(records, task)
    plain = records[~records["probe"].map(_is_rotated)]
    summary = _graded_summary(plain, probe, ci, grading, task)
    rates = {p: unfinished_rate(records, p) for p in dict.fromkeys(records["probe"])}
    summary["unfinished_rate"] = rates
    summary["warnings"] = [w for p, r in rates.items() if (w := unfinished_warning(r, p))]
    config = run.config
    summary.update({
        "model": config.get("model"),
        "task": (config.get("task") or {}).get("name"),
        "temperature": (config.get("probe") or {}).get("temperature"),
    })
    if task is not None:
        chance = chance_summary(task, plain, summary["k"], grading)
        if chance is not None:
            summary["chance"] = chance
    if config.get("circular"):
        summary["circular"] = circular_summary(records, probe, grading, task)
    return AuditSummary.of(summary, f"{run.path} audit summary")


def _is_rotated(label: str) -> bool:
    return ProbeLabel.parse(label).kind == "rotated"


def _graded_summary(records: pd.DataFrame, probe: str, ci: str, grading: str, task: Task | None) -> dict[str, Any]:
    """The summary's numbers under the headline `grading`, both gradings' D, O_K, gap and
    pass@k beside, the null and the votes."""
    by_grading = {g: graded(records, g) for g in GRADINGS} if records["correct_strict"].notna().all() \
        else {"flexible": graded(records, "flexible")}
    if grading not in by_grading:
        graded(records, grading)  # raises, saying to regrade
    headline = by_grading[grading]
    scores = question_scores(headline, probe)
    summary = {"grading": grading, **audit_summary(headline, probe, ci=ci)}
    ks = list(range(1, int(scores["n"].min()) + 1)) if len(scores) and scores["n"].min() > 0 else []
    summary["pass_at_k"] = {"k": ks}
    for g, recs in by_grading.items():
        s = audit_summary(recs, probe, ci=ci)
        g_scores = question_scores(recs, probe)
        block = {key: s[key] for key in ("D", "O_K", "gap", "D_ci", "O_K_ci", "gap_ci")}
        null = question_null(recs, task, probe, g, summary["k"] or 0)
        if null is not None:
            block["null"] = null_summary(g_scores["d"], g_scores["o"], *null)
        summary[g] = block
        curve = mean_pass_at_k(g_scores["n"].to_numpy(), g_scores["c"].to_numpy(), ks).tolist() if ks else []
        summary["pass_at_k"][g] = curve
        if g == grading:
            summary["pass_at_k"]["pass"] = curve
    if "null" in summary[grading]:
        summary["null"] = summary[grading]["null"]
    summary["unparsed_rate"] = unparsed_rate(records) if len(records) else 0.0
    summary.update(deployable_votes(headline, probe, scores))
    return summary


def circular_summary(records: pd.DataFrame, probe: str, grading: str, task: Task | None = None) -> dict[str, Any]:
    """D, O_K and gap under circular evaluation, per grading (`grading.circular_scores`),
    with Wilson intervals and the paired gap interval, and (given the task) the guessing
    null read the same way (`grading.circular_null`)."""
    shifts = sorted({int(ProbeLabel.parse(p).parts[0]) for p in records["probe"] if _is_rotated(p)} | {0})
    out: dict[str, Any] = {"shifts": shifts}
    for g in GRADINGS:
        if records[f"correct_{g}"].isna().any():
            continue
        s = circular_scores(graded(records, g), probe, shifts)
        d, o = s["d"].to_numpy(float), s["o"].to_numpy(float)
        out[g] = {"D": float(d.mean()), "O_K": float(o.mean()), "gap": float((o - d).mean()),
                  "D_ci": list(wilson_interval(d.sum(), len(d))), "O_K_ci": list(wilson_interval(o.sum(), len(o))),
                  "gap_ci": [float(x) for x in paired_diff_ci(d, o)]}
        if task is not None:
            k = int(s["n"].min()) if len(s) else 0
            d_null, o_null = circular_null(graded(records, g), task, probe, shifts, k, g)
            out[g]["null"] = null_summary(d, o, d_null, o_null, "guessing from the model's own answers under each shift")
    if grading in out:
        out.update({key: out[grading][key] for key in ("D", "O_K", "gap")})
        if "null" in out[grading]:
            out["null"] = out[grading]["null"]
    return out


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
