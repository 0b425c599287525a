"""The routing audit: random routes vs structured search at a matched budget, and
answer-blind selectors, on one model and task.

For every question and route space (a *cell* is model x task x space):
- `deployed`: greedy on the full path; `temperature`: K temperature samples (same prefill);
- `random_route`: the full path + K-1 distinct uniform routes (one shared seed, so every
  question gets the same routes and each route is one batch over all questions);
- `mcts`, `hill_climb`, `genetic`: oracle searches with the gold answer as reward, K
  distinct route evaluations each (the full path first, as for random);
- selectors over the random-route candidates: majority vote, majority with confidence
  tie-break, confidence, self-verification, and the three searches re-run with the
  answer-blind reward "agrees with the majority answer" (`*_vote`).
Every evaluated route is a record (probe = method, intervention = the route's id).
A cell whose random routes mostly fail to parse (``unparsed_rate > collapse``,
default 0.5) is flagged as format collapse and excluded from comparisons.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from rnr_interp.generate import Decoding, PromptStates, generate, last_logits, prompt_states
from rnr_interp.interventions import Route, set_id
from rnr_interp.metrics import gap_recovery, question_scores, unparsed_rate
from rnr_interp.models import LoadedModel
from rnr_interp.records import ProbeLabel, RunDir
from rnr_interp.routing.batching import Lockstep
from rnr_interp.routing.search import SEARCHES
from rnr_interp.routing.selectors import majority_agreement_reward, majority_answer, select
from rnr_interp.routing.spaces import SPACES, make_space
from rnr_interp.sampling import Probe, candidate_row, prompt_ids, run_config, sample_questions
from rnr_interp.tasks.base import Question, Task

STRUCTURED = ("mcts", "hill_climb", "genetic")
BLIND_SELECTORS = ("majority", "majority_confidence", "confidence", "self_verification")
VERIFY_PROMPT = "{question}\n\nProposed answer: {answer}\n\nIs the proposed answer correct? Reply with yes or no."


@dataclass(frozen=True)
class RouteConfig:
    #: K temperature samples per question (the `temperature` probe)
    samples: int = 16
    #: route evaluations per search and question (the matched budget of every method)
    budget: int = 16
    spaces: tuple[str, ...] = ("native",)
    methods: tuple[str, ...] = ("random", "mcts", "hill_climb", "genetic")
    temperature: float = 1.0
    seed: int = 0
    collapse: float = 0.5
    batch_size: int = 16
    reuse_prefix: bool = True
    #: route length bounds (None: the space's defaults, L -/+ L//3)
    min_len: int | None = None
    max_len: int | None = None

    def __post_init__(self):
        """Refuse bad settings when the config is made, before any run folder is."""
        for name in ("samples", "budget", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a number > 0, got {self.temperature}")
        if not math.isfinite(self.collapse):  # a threshold on the unparsed rate (< 0: exclude every cell)
            raise ValueError(f"collapse must be a number, got {self.collapse}")
        for name in ("min_len", "max_len"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.min_len is not None and self.max_len is not None and self.min_len > self.max_len:
            raise ValueError(f"min_len {self.min_len} is above max_len {self.max_len}")
        unknown = [s for s in self.spaces if s not in SPACES]
        if unknown or not self.spaces:
            raise ValueError(f"spaces must be some of {', '.join(SPACES)}, got {list(self.spaces)}")
        unknown = [m for m in self.methods if m not in SEARCHES]
        if unknown or not self.methods:
            raise ValueError(f"methods must be some of {', '.join(SEARCHES)}, got {list(self.methods)}")


class RouteEvaluator:
    """Greedy generation of (question, route) pairs, batched by route and cached, so a
    route any method has already tried for a question costs nothing again. With
    `reuse_prefix`, each prompt's full-path prefill is kept and a route that starts
    with blocks 0..p-1 unchanged replays them instead of recomputing its prefill."""

    def __init__(self, lm: LoadedModel, task: Task, decoding: Decoding, batch_size: int = 16, reuse_prefix: bool = True):
        self.lm, self.task, self.decoding, self.batch_size = lm, task, decoding, batch_size
        self.by_id = {q.id: q for q in task.questions}
        self.cache: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
        self.states: dict[str, PromptStates] | None = {} if reuse_prefix else None
        self.n_generated = 0

    def _states(self, questions: list[Question]) -> list[PromptStates] | None:
        if self.states is None:
            return None
        missing = [q for q in questions if q.id not in self.states]
        if missing:
            fresh = prompt_states(self.lm, [prompt_ids(self.lm, self.task, q) for q in missing])
            self.states.update({q.id: st for q, st in zip(missing, fresh)})
        return [self.states[q.id] for q in questions]

    def forget(self, qids) -> None:
        """Drop stored prefills of questions that are done (they are large)."""
        if self.states is not None:
            for q in qids:
                self.states.pop(q, None)

    def __call__(self, requests: list[tuple[str, tuple[int, ...]]]) -> list[dict[str, Any]]:
        todo: dict[tuple[int, ...], list[str]] = {}
        for qid, route in requests:
            if (qid, route) not in self.cache:
                todo.setdefault(route, [])
                if qid not in todo[route]:
                    todo[route].append(qid)
        for route, qids in todo.items():
            for start in range(0, len(qids), self.batch_size):
                chunk = [self.by_id[q] for q in qids[start:start + self.batch_size]]
                gens = generate(self.lm, [prompt_ids(self.lm, self.task, q) for q in chunk], decoding=self.decoding,
                                interventions=[Route(route)], stop_strings=self.task.stop_strings,
                                reuse=self._states(chunk))
                self.n_generated += len(chunk)
                for q, [g] in zip(chunk, gens):
                    self.cache[(q.id, route)] = candidate_row(self.task, q, g, intervention=set_id([Route(route)]))
        return [self.cache[req] for req in requests]


def run_searches(evaluator: RouteEvaluator, questions: Sequence[Question], space, method: str, budget: int,
                 seed: int, reward_of) -> dict[str, list[tuple[tuple[int, ...], dict[str, Any]]]]:
    """One search per question, in lockstep. `reward_of(question, row) -> float`.
    Returns, per question id, the evaluated (route, row) pairs in evaluation order."""
    search = SEARCHES[method]
    lockstep = Lockstep(evaluator)

    def job(q: Question):
        evaluate = lockstep.evaluate_for(q.id)

        def score(routes):
            return [reward_of(q, row) for row in evaluate(routes)]

        # Random search shares one seed across questions (same routes, full batching);
        # adaptive searches get the same seed too, so runs are reproducible.
        return search(space, score, budget, np.random.default_rng(seed))

    results = lockstep.run([lambda q=q: job(q) for q in questions])
    return {q.id: [(route, evaluator.cache[(q.id, route)]) for route, _ in res.evaluated] for q, res in zip(questions, results)}


@torch.inference_mode()
def verify_scores(lm: LoadedModel, task: Task, q: Question, answers: Sequence[str | None]) -> list[float]:
    """Self-verification: log P(yes) - log P(no) for the model's next token after asking
    whether each proposed answer is correct (None answers get -inf)."""
    yes = [lm.tokenizer.encode(w, add_special_tokens=False)[0] for w in ("yes", "Yes")]
    no = [lm.tokenizer.encode(w, add_special_tokens=False)[0] for w in ("no", "No")]
    distinct = sorted({a for a in answers if a is not None})
    if not distinct:
        return [float("-inf")] * len(answers)
    prompts = [lm.encode(lm.render(VERIFY_PROMPT.format(question=task.user_message(q), answer=a))) for a in distinct]
    logp = torch.log_softmax(last_logits(lm, prompts), -1)
    margin = torch.logsumexp(logp[:, yes], -1) - torch.logsumexp(logp[:, no], -1)
    by_answer = dict(zip(distinct, margin.tolist()))
    return [by_answer.get(a, float("-inf")) if a is not None else float("-inf") for a in answers]


def _rows(pairs, probe: str, common: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**row, **common, "probe": probe, "candidate": i, "seed": 0} for i, (_, row) in enumerate(pairs)]


def _oracle_curve(pairs_by_q: dict[str, list], budget: int) -> list[float]:
    hits = np.zeros((len(pairs_by_q), budget))
    for i, pairs in enumerate(pairs_by_q.values()):
        correct = [row["correct"] for _, row in pairs][:budget]
        running = np.maximum.accumulate(np.array(correct, dtype=float)) if correct else np.zeros(0)
        hits[i, :len(running)] = running
        if len(running) < budget and len(running):
            hits[i, len(running):] = running[-1]
    return hits.mean(0).tolist()


def run_route_audit(lm: LoadedModel, task: Task, out: str | Path, cfg: RouteConfig = RouteConfig(), progress: bool = True) -> dict[str, Any]:
    decoding = Decoding(max_new_tokens=task.max_new_tokens)
    run = RunDir.create(out, run_config("route", lm, task, route=asdict(cfg), deployed=asdict(decoding)))
    run_id = run.run_id
    common = {"run_id": run_id, "model": lm.spec, "task": task.name}
    done = run.done_question_ids()
    questions = [q for q in task.questions if q.id not in done]
    evaluator = RouteEvaluator(lm, task, decoding, cfg.batch_size, cfg.reuse_prefix)
    gold = lambda q, row: float(row["correct"])  # noqa: E731 - the oracle reward

    bar = tqdm(total=len(task.questions), initial=len(task.questions) - len(questions), unit="q", desc="route audit", disable=not progress)
    for start in range(0, len(questions), cfg.batch_size):
        chunk = questions[start:start + cfg.batch_size]
        rows = sample_questions(lm, task, chunk, probe=Probe(k=cfg.samples, temperature=cfg.temperature, seed=cfg.seed),
                                deployed=decoding, run_id=run_id)
        for space_name in cfg.spaces:
            space = make_space(space_name, lm.n_layers, min_len=cfg.min_len, max_len=cfg.max_len)
            found = {m: run_searches(evaluator, chunk, space, m, cfg.budget, cfg.seed, gold) for m in cfg.methods}
            for m, by_q in found.items():
                for pairs in by_q.values():
                    rows += _rows(pairs, str(ProbeLabel.route(space_name, m)), common)
            # Answer-blind search: the same searches rewarded by agreement with the
            # majority answer of the random-route candidates.
            random_pairs = found.get("random") or run_searches(evaluator, chunk, space, "random", cfg.budget, cfg.seed, gold)
            for m in STRUCTURED:
                majority = {q.id: majority_agreement_reward(majority_answer([r["extracted"] for _, r in random_pairs[q.id]])) for q in chunk}
                voted = run_searches(evaluator, chunk, space, m, cfg.budget, cfg.seed, lambda q, row: majority[q.id](row["extracted"]))
                for q in chunk:
                    best = max(range(len(voted[q.id])), key=lambda i: (majority[q.id](voted[q.id][i][1]["extracted"]), -i))
                    rows += _rows([voted[q.id][best]], str(ProbeLabel.route(space_name, m, vote=True)), common)
        run.write_question_batch(rows)
        evaluator.forget(q.id for q in chunk)
        bar.update(len(chunk))
    bar.close()
    summary = summarize_routes(run, lm, task, cfg)
    run.write_summary(summary)
    return summary


def summarize_routes(run: RunDir, lm: LoadedModel, task: Task, cfg: RouteConfig) -> dict[str, Any]:
    records = run.read_records()
    scores = question_scores(records, "temperature")
    greedy, t_oracle = float(scores["d"].mean()), float(scores["o"].mean())
    curves, cells, selectors = [], [], []
    summary: dict[str, Any] = {"kind": "route", "model": lm.spec, "task": task.name, "k": cfg.samples, "budget": cfg.budget,
                               "n_questions": len(scores), "deployed": greedy, "cells": {}}
    # The temperature candidates are the same for every cell: pick over them (a model
    # forward per question for self-verification) once.
    temperature_acc = _selector_accuracies(lm, task, records[records.probe == "temperature"], records, None)
    for space_name in cfg.spaces:
        cell = f"{lm.spec}/{task.name}/{space_name}"
        rand = records[records.probe == str(ProbeLabel.route(space_name, "random"))]
        unparsed = unparsed_rate(rand)
        excluded = bool(unparsed > cfg.collapse)
        oracle_at_k = {}
        for m in cfg.methods:
            sub = records[records.probe == str(ProbeLabel.route(space_name, m))]
            pairs = {qid: [(None, r) for r in g.sort_values("candidate").to_dict("records")] for qid, g in sub.groupby("question_id", sort=False)}
            curve = _oracle_curve(pairs, cfg.budget)
            curves += [{"cell": cell, "method": m, "budget": b + 1, "oracle": v} for b, v in enumerate(curve)]
            oracle_at_k[m] = curve[-1] if curve else float("nan")
            cells.append({"cell": cell, "method": m, "oracle": oracle_at_k[m], "excluded": excluded, "unparsed_rate": unparsed})
        oracle = oracle_at_k.get("random", float("nan"))
        cell_sel = {}
        for name, acc in _selector_accuracies(lm, task, rand, records, space_name).items():
            rec = gap_recovery(acc, greedy, oracle)
            selectors.append({"cell": cell, "selector": name, "accuracy": acc, "gap_recovery": rec, "source": "routes"})
            cell_sel[name] = {"accuracy": acc, "gap_recovery": rec}
        for name, acc in temperature_acc.items():
            selectors.append({"cell": cell, "selector": name, "accuracy": acc, "gap_recovery": gap_recovery(acc, greedy, t_oracle), "source": "temperature"})
        summary["cells"][cell] = {
            "space": space_name, "oracle_at_k": oracle_at_k, "excluded": excluded, "unparsed_rate": unparsed,
            "random_minus_structured": {m: oracle_at_k["random"] - oracle_at_k[m] for m in STRUCTURED if m in oracle_at_k and "random" in oracle_at_k},
            "selectors": cell_sel, "temperature_oracle": t_oracle,
        }
    run.write_table("route_curves", pd.DataFrame(curves))
    run.write_table("route_cells", pd.DataFrame(cells))
    sel = pd.DataFrame(selectors)
    run.write_table("selectors", sel)
    kept = [c for c, v in summary["cells"].items() if not v["excluded"]]
    summary["excluded_cells"] = [c for c in summary["cells"] if c not in kept]
    summary["oracle_at_k"] = {m: float(np.nanmean([summary["cells"][c]["oracle_at_k"][m] for c in kept])) if kept else float("nan") for m in cfg.methods}
    routes_sel = sel[(sel.source == "routes") & sel.cell.isin(kept)] if len(sel) else sel
    summary["selectors"] = {name: {"accuracy": float(g.accuracy.mean()), "gap_recovery_median": float(g.gap_recovery.median())}
                            for name, g in routes_sel.groupby("selector")} if len(routes_sel) else {}
    return summary


def _selector_accuracies(lm: LoadedModel, task: Task, cands: pd.DataFrame, records: pd.DataFrame, space_name: str | None) -> dict[str, float]:
    """Accuracy of each answer-blind pick over the candidates of one probe."""
    if cands.empty:
        return {}
    by_id = {q.id: q for q in task.questions}
    picks: dict[str, list[bool]] = {}
    for qid, g in cands.groupby("question_id", sort=False):
        g = g.sort_values("candidate").reset_index(drop=True)
        table = g.assign(verify_yes_logprob=verify_scores(lm, task, by_id[qid], [a if isinstance(a, str) else None for a in g["extracted"]]))
        for name in BLIND_SELECTORS:
            i = select(table, name)
            picks.setdefault(name, []).append(bool(g.loc[i, "correct"]) if i is not None else False)
    acc = {name: float(np.mean(v)) for name, v in picks.items()}
    if space_name is not None:
        for m in STRUCTURED:
            voted = records[records.probe == str(ProbeLabel.route(space_name, m, vote=True))]
            if len(voted):
                acc[f"{m}_vote"] = float(voted["correct"].mean())
    return acc
