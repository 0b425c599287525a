"""Evaluating routes for the audit: the batched, cached greedy generation of (question,
route) pairs (`RouteEvaluator`), the searches run over it in one lockstep
(`run_searches`), the two rewards they maximise (the gold answer's, the model's own
confidence) and self-verification's scores of proposed answers."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from rnr_interp.engine.decoding import Decoding
from rnr_interp.engine.generate import last_logits
from rnr_interp.engine.rows import PrefillCache, Row, generate_rows
from rnr_interp.engine.sampling import candidate_row
from rnr_interp.interventions import Route, route_schedule, set_id
from rnr_interp.models import LoadedModel
from rnr_interp.records import DEFAULT_GRADING, Journal, ProbeLabel
from rnr_interp.analyses.routing.batching import Lockstep
from rnr_interp.analyses.routing.search import SEARCHES
from rnr_interp.analyses.routing.selectors import search_reward
from rnr_interp.analyses.routing.spaces import RouteSpace
from rnr_interp.tasks.base import Question, Task

VERIFY_PROMPT = "{question}\n\nProposed answer: {answer}\n\nIs the proposed answer correct? Reply with yes or no."


class RouteEvaluator:
    """Greedy generation of (question, route) pairs, batched (rows on different routes
    share a batch) and cached, so a route any method has already tried for a question
    costs nothing again; the rows go through the one row runner (`engine.rows`). With
    `reuse_prefix`, each prompt's full-path prefill is kept and a row whose route starts
    with blocks 0..p-1 unchanged replays them instead of recomputing its prefill."""

    def __init__(self, lm: LoadedModel, task: Task, decoding: Decoding, batch_size: int = 16, reuse_prefix: bool = True,
                 journal: Journal | None = None, sparse_slots: bool | None = None, grading: str = DEFAULT_GRADING):
        self.lm, self.task, self.decoding, self.batch_size = lm, task, decoding, batch_size
        #: rows run only their own route positions (`interventions.applied`; None: where that pays)
        self.sparse_slots = sparse_slots
        #: the run's grading: the one its records' `correct`, and so the oracle searches' reward, holds
        self.grading = grading
        self.by_id = {q.id: q for q in task.questions}
        self.cache: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
        #: where each generated batch's rows go as they are made (a stopped chunk's
        #: evaluations then come back through `restore`)
        self.journal = journal
        self.prefills = PrefillCache(lm, task, enabled=reuse_prefix)
        #: a batch's schedule may run this many blocks. On a CPU every position costs its
        #: block's weight reads, however few rows run it (with sparse slots a row no longer
        #: computes the positions it passes by): the spaces' longest default route. On a GPU a forward costs
        #: about the same for 1 row or 40, so deeper shared schedules cost less than
        #: more batches. Results do not depend on it (a pure cost knob).
        L = lm.n_layers
        self.max_depth = L + L // 3 if lm.device.type == "cpu" else 3 * L
        self.n_generated = 0  # (question, route) pairs generated
        self.n_batches = 0  # batched generations they took
        self.n_calls = 0  # calls (a lockstep's rounds: each hands over every waiting request)

    def forget(self, qids) -> None:
        """Drop stored prefills of questions that are done (they are large)."""
        self.prefills.forget(qids)

    def __call__(self, requests: list[tuple[str, tuple[int, ...]]]) -> list[dict[str, Any]]:
        self.n_calls += 1
        # Sorted, so routes that share a prefix (and the replay of it) share a batch.
        todo = sorted(dict.fromkeys(req for req in requests if req not in self.cache), key=lambda req: (req[1], req[0]))
        for group in self._groups(todo):
            rows = [Row(self.by_id[qid], (Route(route),)) for qid, route in group]
            gens = generate_rows(self.lm, self.task, rows, self.decoding, self.prefills, sparse_slots=self.sparse_slots)
            self.n_generated += len(group)
            self.n_batches += 1
            for (qid, route), g in zip(group, gens):
                self.cache[(qid, route)] = candidate_row(self.task, self.by_id[qid], g, self.grading,
                                                         intervention=set_id([Route(route)]))
            if self.journal is not None:
                self.journal.append({"question_id": qid, "route": list(route), "row": self.cache[(qid, route)]} for qid, route in group)
        return [self.cache[req] for req in requests]

    def restore(self, entries: list[dict[str, Any]]) -> None:
        """Take back the evaluations a journal holds for this task's questions (a search
        asks for the same routes again, given the same rows)."""
        self.cache.update(((e["question_id"], tuple(e["route"])), e["row"])
                          for e in entries if "route" in e and e["question_id"] in self.by_id)

    def _groups(self, pairs: list[tuple[str, tuple[int, ...]]]):
        """Batches of up to `batch_size` (question, route) pairs, each row on its own
        route: the batch runs one schedule holding every row's route
        (`interventions.route_schedule`), so the adaptive searches' many one-question
        routes share forwards instead of running a batch of one row each (the cost
        that dominated). A pair joins the batch while the schedule stays within
        `max_depth` positions, which bounds what a row pays for blocks it passes by."""
        group: list[tuple[str, tuple[int, ...]]] = []
        schedule: tuple[int, ...] = ()
        for qid, route in pairs:
            # Merging into the group's schedule gives the schedule of the whole group
            # (the same smallest-next-layer steps), the one `applied` will run.
            merged = route_schedule([schedule, route])[0] if 0 < len(group) < self.batch_size else route
            if group and (len(group) >= self.batch_size or len(merged) > max(self.max_depth, len(route))):
                yield group
                group, merged = [], route
            group.append((qid, route))
            schedule = merged
        if group:
            yield group


@dataclass(frozen=True)
class Search:
    """One search to run on every question: its route space, its method and the reward
    it maximises, `reward(question, row) -> float`."""

    space: RouteSpace
    method: str
    reward: Callable[[Question, dict[str, Any]], float]
    #: keyword arguments of the search function (its round size, random_matched's profile)
    options: Mapping[str, Any] = field(default_factory=dict)


def run_searches(evaluator: RouteEvaluator, questions: Sequence[Question], searches: dict[str, Search], budget: int,
                 seed: int, on_evaluated: Callable[[int], None] | None = None,
                 ) -> dict[str, dict[str, list[tuple[tuple[int, ...], dict[str, Any]]]]]:
    """Every search on every question, all in one lockstep: each round gathers the
    routes every (search, question) pair waits on, so the evaluator's batches fill with
    rows from all of them (on a CPU a batch of few rows wastes most of each weight read)
    and a route two searches ask for is generated once. A search's evaluations depend
    on its own rewards only, so running them together changes no result.
    `on_evaluated(n)` hears of every n route evaluations as their rows arrive (a
    progress bar: each counts against one search's budget, at most
    len(searches) * len(questions) * budget in all).
    Returns, per search label and question id, the evaluated (route, row) pairs in
    evaluation order."""
    lockstep = Lockstep(evaluator)

    def job(q: Question, s: Search, label: str):
        evaluate = lockstep.evaluate_for(q.id)

        def score(routes):
            rows = evaluate(routes)
            if on_evaluated is not None:
                on_evaluated(len(rows))
            return [s.reward(q, row) for row in rows]

        return SEARCHES[s.method](s.space, score, budget, search_rng(seed, label, q.id), **s.options)

    pairs = [(label, s, q) for label, s in searches.items() for q in questions]
    results = lockstep.run([lambda s=s, q=q, label=label: job(q, s, label) for label, s, q in pairs])
    out: dict[str, dict[str, list]] = {label: {} for label in searches}
    for (label, _, q), res in zip(pairs, results):
        out[label][q.id] = [(route, evaluator.cache[(q.id, route)]) for route, _ in res.evaluated]
    return out


def search_rng(seed: int, label: str, question_id: str) -> np.random.Generator:
    """The random stream of one search (its probe label) on one question
    (`config.SEED_STREAMS`). A search shares it with no other search and no other
    question: random routes are a fresh draw per question, a search without a reward
    signal yet explores from its own stream, and genetic search's first generation is
    not random's. Reproducible from the run's seed."""
    return np.random.default_rng([seed, zlib.crc32(label.encode()), zlib.crc32(question_id.encode())])


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
    logp = torch.log_softmax(last_logits(lm, prompts).float(), -1)
    margin = torch.logsumexp(logp[:, yes], -1) - torch.logsumexp(logp[:, no], -1)
    by_answer = dict(zip(distinct, margin.tolist()))
    return [by_answer.get(a, float("-inf")) if a is not None else float("-inf") for a in answers]


def verify_rows(lm: LoadedModel, task: Task, questions: Sequence[Question], rows: Sequence[dict[str, Any]],
                probes: Sequence[str]) -> list[dict[str, Any]]:
    """Self-verification records (`ProbeLabel.verify`) of each question's distinct
    answers under each of `probes` among `rows`, in sorted order of the answers; each
    row copies the first candidate with its answer (its grade, gold and run fields)."""
    out = []
    for q in questions:
        for probe in probes:
            first: dict[str, dict[str, Any]] = {}
            for row in rows:
                if row["question_id"] == q.id and row["probe"] == probe and isinstance(row["extracted"], str):
                    first.setdefault(row["extracted"], row)
            answers = sorted(first)
            label = str(ProbeLabel.verify(ProbeLabel.parse(probe)))
            for i, (answer, score) in enumerate(zip(answers, verify_scores(lm, task, q, answers) if answers else [])):
                out.append({**first[answer], "probe": label, "candidate": i, "intervention": "", "seed": 0, "text": "",
                            "logprob": float(score), "n_tokens": 0, "finish": "stop"})
    return out


def gold_reward(q: Question, row: dict[str, Any]) -> float:
    """The oracle searches' reward: is the route's answer correct."""
    return float(row["correct"])


def blind_reward(q: Question, row: dict[str, Any]) -> float:
    """The search selectors' reward: no gold answer, only the model's own confidence."""
    return search_reward(row["extracted"], row["logprob"], row["n_tokens"])
