"""The routing audit: random routes vs structured search at a matched budget, and
answer-blind selectors, on one model and task.

For every question and route space (a *cell* is model x task x space):
- `deployed`: greedy on the full path; `temperature`: K temperature samples (same prefill);
- `random`: the full path + K-1 distinct uniform routes (one shared seed, so every
  question gets the same routes and each route is one batch over all questions);
- `mcts`, `hill_climb`, `genetic`: oracle searches with the gold answer as reward, K
  distinct route evaluations each (the full path first, as for random);
- `mcts_blind`, `hill_climb_blind`, `genetic_blind`: the same searches, K evaluations
  each, rewarded answer-blind by the model's per-token probability of its own output
  (`selectors.search_reward`); each answers with the best route it found.
Every evaluated route is a record (probe = "space:method", intervention = the route).

Six answer-blind selectors, each spending K route evaluations: majority vote (ties to
the answer seen first; the full path is seen first), confidence and self-verification
over the K random-route candidates, and the three blind searches. The
confidence-weighted vote is reported as a second line beside majority. Along the budget
curve, the deployable vote at each k (majority, and weighted) is drawn beside each
oracle curve (`metrics.vote_curve`: expectation over random (k-1)-subsets of the random
routes with the full path always in).
A cell whose random routes mostly fail to parse (``unparsed_rate > collapse``,
default 0.5) is flagged as format collapse and excluded from comparisons.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from rnr_interp.generate import Decoding, PromptStates, generate, last_logits, prompt_states
from rnr_interp.interventions import Route, route_schedule, set_id
from rnr_interp.metrics import bootstrap_ci, oracle_curve_after_first, paired_diff_ci, question_scores, selection_summary, unparsed_rate, vote_matrix, wilson_interval
from rnr_interp.models import LoadedModel
from rnr_interp.grading import graded, other_grading, question_null, null_summary, regrade, unfinished_rate, unfinished_warning
from rnr_interp.records import DEFAULT_GRADING, Journal, ProbeLabel, RunDir, RunFolderError, comparable, config_diff
from rnr_interp.routing.batching import Lockstep
from rnr_interp.routing.search import SEARCHES
from rnr_interp.routing.selectors import search_reward, select
from rnr_interp.routing.spaces import SPACES, RouteSpace, make_space
from rnr_interp.sampling import Probe, candidate_row, prompt_ids, run_config, sample_questions
from rnr_interp.tasks.base import Question, Task

STRUCTURED = ("mcts", "hill_climb", "genetic")
#: selectors over a probe's K candidates (weighted_majority is majority's second line)
CANDIDATE_SELECTORS = ("majority", "weighted_majority", "confidence", "self_verification")
#: answer-blind search selectors: name -> the search run with `search_reward`
SEARCH_SELECTORS = {f"{m}_blind": m for m in STRUCTURED}
SIX_SELECTORS = ("majority", "confidence", "self_verification", *SEARCH_SELECTORS)
VOTES = {"majority": False, "weighted_majority": True}  # deployable lines: confidence-weighted?
#: rows (question, route) per batched generation in the audit, whatever its questions per
#: chunk: a batch takes rows from every search of the chunk (`run_searches`), and on a CPU
#: a decoding step of few rows spends most of its time reading weights
#: (benchmarks/route_batching.py; README, routing). A cost knob: results do not depend on it.
ROUTE_ROWS = 64
#: the same off the CPU: on a GPU rows are nearly free (a decoding step of 720 rows took
#: about 1.5x one of 32 in the silencing sweep on an H200; README), so a batch holds what
#: the round has, up to this. Memory: about 21 MB of keys and values a row at 456
#: positions (a GSM8K prompt and 256 new tokens) on the demo model, 11 GB for 512.
GPU_ROUTE_ROWS = 512
VERIFY_PROMPT = "{question}\n\nProposed answer: {answer}\n\nIs the proposed answer correct? Reply with yes or no."


def route_rows(lm: LoadedModel) -> int:
    """Rows per batched route generation on `lm`'s device (a cost knob)."""
    return ROUTE_ROWS if lm.device.type == "cpu" else GPU_ROUTE_ROWS


@dataclass(frozen=True)
class RouteConfig:
    #: K temperature samples per question (the `temperature` probe)
    samples: int = 32
    #: route evaluations per search and question: the matched budget K of every method and selector
    budget: int = 32
    spaces: tuple[str, ...] = ("native",)
    methods: tuple[str, ...] = ("random", "mcts", "hill_climb", "genetic")
    temperature: float = 1.0
    seed: int = 0
    collapse: float = 0.5
    #: questions per chunk: the lockstep's unit and a records part (a batch holds
    #: max(batch_size, `route_rows`) rows, from every search of the chunk); a chunk
    #: stopped part way keeps its work in the run's journal
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
    """Greedy generation of (question, route) pairs, batched (rows on different routes
    share a batch) and cached, so a route any method has already tried for a question
    costs nothing again. With `reuse_prefix`, each prompt's full-path prefill is kept
    and a batch whose rows all start with blocks 0..p-1 unchanged replays them instead
    of recomputing its prefill."""

    def __init__(self, lm: LoadedModel, task: Task, decoding: Decoding, batch_size: int = 16, reuse_prefix: bool = True,
                 journal: Journal | None = None, grading: str = DEFAULT_GRADING):
        self.lm, self.task, self.decoding, self.batch_size = lm, task, decoding, batch_size
        #: the run's grading: the one its records' `correct`, and so the oracle searches' reward, holds
        self.grading = grading
        self.by_id = {q.id: q for q in task.questions}
        self.cache: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
        #: where each generated batch's rows go as they are made (a stopped chunk's
        #: evaluations then come back through `restore`)
        self.journal = journal
        self.states: dict[str, PromptStates] | None = {} if reuse_prefix else None
        #: a batch's schedule may run this many blocks. On a CPU every block a row passes
        #: by costs compute: the spaces' longest default route. On a GPU a forward costs
        #: about the same for 1 row or 40, so deeper shared schedules cost less than
        #: more batches. Results do not depend on it (a pure cost knob).
        L = lm.n_layers
        self.max_depth = L + L // 3 if lm.device.type == "cpu" else 3 * L
        self.n_generated = 0  # (question, route) pairs generated
        self.n_batches = 0  # batched generations they took

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
        # Sorted, so routes that share a prefix (and the replay of it) share a batch.
        todo = sorted(dict.fromkeys(req for req in requests if req not in self.cache), key=lambda req: (req[1], req[0]))
        for group in self._groups(todo):
            chunk = [self.by_id[qid] for qid, _ in group]
            gens = generate(self.lm, [prompt_ids(self.lm, self.task, q) for q in chunk], decoding=self.decoding,
                            interventions=[[Route(route)] for _, route in group], stop_strings=self.task.stop_strings,
                            reuse=self._states(chunk))
            self.n_generated += len(group)
            self.n_batches += 1
            for (qid, route), [g] in zip(group, gens):
                self.cache[(qid, route)] = candidate_row(self.task, self.by_id[qid], g, self.grading,
                                                         intervention=set_id([Route(route)]))
            if self.journal is not None:
                self.journal.append({"question_id": qid, "route": list(route), "row": self.cache[(qid, route)]} for qid, route in group)
        return [self.cache[req] for req in requests]

    def restore(self, entries: list[dict[str, Any]]) -> None:
        """Take back the evaluations a journal holds for this task's questions (a search
        asks for the same routes again, given the same rows)."""
        self.cache.update(((e["question_id"], tuple(e["route"])), with_both_grades(e["row"], self.task))
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

    def job(q: Question, s: Search):
        evaluate = lockstep.evaluate_for(q.id)

        def score(routes):
            rows = evaluate(routes)
            if on_evaluated is not None:
                on_evaluated(len(rows))
            return [s.reward(q, row) for row in rows]

        # Every search of a method shares one seed across questions (random search asks
        # every question for the same routes, which batch fully); runs are reproducible.
        return SEARCHES[s.method](s.space, score, budget, np.random.default_rng(seed))

    pairs = [(label, s, q) for label, s in searches.items() for q in questions]
    results = lockstep.run([lambda s=s, q=q: job(q, s) for _, s, q in pairs])
    out: dict[str, dict[str, list]] = {label: {} for label in searches}
    for (label, _, q), res in zip(pairs, results):
        out[label][q.id] = [(route, evaluator.cache[(q.id, route)]) for route, _ in res.evaluated]
    return out


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


def _rows(pairs, probe: str, common: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**row, **common, "probe": probe, "candidate": i, "seed": 0} for i, (_, row) in enumerate(pairs)]


def gold_reward(q: Question, row: dict[str, Any]) -> float:
    """The oracle searches' reward: is the route's answer correct."""
    return float(row["correct"])


def audit_searches(spaces: dict[str, RouteSpace], methods: Sequence[str]) -> dict[str, Search]:
    """The searches the audit runs on every question, by record probe label: per space,
    random and `methods` rewarded by the gold answer, and the answer-blind searches."""
    searches = {}
    for name, space in spaces.items():
        for m in dict.fromkeys(("random", *methods)):
            searches[str(ProbeLabel.route(name, m))] = Search(space, m, gold_reward)
        for label, m in SEARCH_SELECTORS.items():
            searches[str(ProbeLabel.route(name, label))] = Search(space, m, blind_reward)
    return searches


def blind_reward(q: Question, row: dict[str, Any]) -> float:
    """The search selectors' reward: no gold answer, only the model's own confidence."""
    return search_reward(row["extracted"], row["logprob"], row["n_tokens"])


def route_decoding(task: Task) -> Decoding:
    """How every route and the deployed full path decode: greedy, to the task's length."""
    return Decoding(max_new_tokens=task.max_new_tokens)


def route_run_config(lm: LoadedModel, task: Task, cfg: RouteConfig, grading: str | None = None) -> dict[str, Any]:
    """The run config of a route audit: what a run folder stores and a resume checks.
    `grading` None: the folder's own when resuming, else the default."""
    return run_config("route", lm, task, grading=grading, route=asdict(cfg), deployed=asdict(route_decoding(task)))


def with_both_grades(row: dict[str, Any], task: Task) -> dict[str, Any]:
    """A journalled row with both grades: a row journalled before they were recorded
    (its `correct` then the flexible rule's) gets them from its text."""
    if "correct_strict" in row:
        return row
    q = next(q for q in task.questions if q.id == row["question_id"])
    strict = task.grade_candidate(row["text"], q, row["finish"]).strict and bool(row["correct"])
    return {**row, "correct_strict": strict, "correct_flexible": bool(row["correct"])}


def run_route_audit(lm: LoadedModel, task: Task, out: str | Path, cfg: RouteConfig = RouteConfig(), progress: bool = True,
                    grading: str | None = None) -> dict[str, Any]:
    decoding = route_decoding(task)
    run = RunDir.create(out, route_run_config(lm, task, cfg, grading))
    run_id = run.run_id
    common = {"run_id": run_id, "model": lm.spec, "task": task.name}
    done = run.done_question_ids()
    questions = [q for q in task.questions if q.id not in done]
    # A chunk stopped part way left its temperature samples and route evaluations in the
    # run's journal: they are taken back, and the chunk redoes only what is missing.
    saved = run.journal.read()
    evaluator = RouteEvaluator(lm, task, decoding, max(cfg.batch_size, route_rows(lm)), cfg.reuse_prefix, journal=run.journal,
                               grading=run.grading)
    evaluator.restore(saved)
    saved_samples = {tuple(e["question_ids"]): [with_both_grades(r, task) for r in e["samples"]] for e in saved if "samples" in e}
    spaces = {name: make_space(name, lm.n_layers, min_len=cfg.min_len, max_len=cfg.max_len) for name in cfg.spaces}
    searches = audit_searches(spaces, cfg.methods)

    bar = tqdm(total=len(task.questions), initial=len(task.questions) - len(questions), unit="q", desc="route audit", disable=not progress)
    for start in range(0, len(questions), cfg.batch_size):
        chunk = questions[start:start + cfg.batch_size]
        ids = [q.id for q in chunk]
        rows = saved_samples.get(tuple(ids))
        if rows is None:
            rows = sample_questions(lm, task, chunk, probe=Probe(k=cfg.samples, temperature=cfg.temperature, seed=cfg.seed),
                                    deployed=decoding, run_id=run_id, grading=run.grading)
            run.journal.append([{"question_ids": ids, "samples": rows}])
        # Within a chunk (tens of minutes on a CPU for long answers), the searches' budget spent.
        with tqdm(total=len(searches) * len(chunk) * cfg.budget, unit="route", desc="route evaluations",
                  leave=False, disable=not progress) as routes_bar:
            found = run_searches(evaluator, chunk, searches, cfg.budget, cfg.seed, on_evaluated=routes_bar.update)
        for label, per_question in found.items():
            for pairs in per_question.values():
                rows += _rows(pairs, label, common)
        run.write_question_batch(rows)
        run.journal.clear()
        evaluator.forget(q.id for q in chunk)
        bar.update(len(chunk))
    bar.close()
    summary = summarize_routes(run, lm, task, cfg)
    run.write_summary(summary)
    return summary


def route_config_of(run: RunDir) -> RouteConfig:
    """The RouteConfig a route run folder was started with."""
    if run.config.get("kind") != "route":
        raise RunFolderError(f"{run.path} is not a route run (its kind: {run.config.get('kind')!r})")
    stored = run.config.get("route") or {}
    try:
        return RouteConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})
    except TypeError as err:
        raise RunFolderError(f"{run.path}: route settings this version does not know ({err})") from None


def summarize_so_far(run: RunDir, out: str | Path, lm: LoadedModel, task: Task) -> dict[str, Any]:
    """A route run's summary over the chunks it has written so far, without touching the
    run (it may still be going): its records are copied into a new run folder `out`
    (`RunDir.snapshot`), which gets the summary and tables a finished run gets, over
    those questions. For runs that take hours (GSM8K answers on a CPU). `lm` and `task`
    must be the run's: the config they make is checked against the stored one."""
    cfg = route_config_of(run)
    differ = config_diff(comparable(run.config), comparable(route_run_config(lm, task, cfg, run.grading)))
    if differ:
        raise RunFolderError(f"{run.path} was not run with this model and task: they differ in {', '.join(differ)}")
    if not run.done_question_ids():
        raise RunFolderError(f"{run.path}: no chunk written yet, nothing to summarise")
    snap = run.snapshot(out)  # counted from the copy: the run may write a chunk meanwhile
    summary = summarize_routes(snap, lm, task, cfg)
    summary["snapshot"] = {"of": str(run.path.resolve()), "questions_done": len(snap.done_question_ids()),
                           "questions_total": len(task)}
    snap.write_summary(summary)
    return summary


def _candidates(records: pd.DataFrame, probe: str, qids: Sequence[str]) -> list[pd.DataFrame]:
    """Each question's candidates of one probe, in evaluation order."""
    by_q = {qid: g.sort_values("candidate").reset_index(drop=True) for qid, g in records[records.probe == probe].groupby("question_id", sort=False)}
    missing = [q for q in qids if q not in by_q]
    if missing:
        raise ValueError(f"questions without {probe!r} candidates: {missing[:5]}")
    return [by_q[q] for q in qids]


def _prefix_oracle(cands: list[pd.DataFrame], budget: int, exchangeable: bool) -> np.ndarray:
    """(questions, budget): o_i after b evaluations. Random routes after the full path are
    exchangeable, so their curve is the unbiased pass@k with the full path always in;
    an adaptive search's curve is the running best in its own evaluation order."""
    out = np.zeros((len(cands), budget))
    ks = np.arange(1, budget + 1)
    for i, g in enumerate(cands):
        correct = g["correct"].astype(bool).to_numpy()
        if exchangeable:
            out[i] = oracle_curve_after_first(bool(correct[0]), len(correct) - 1, int(correct[1:].sum()), ks)
        else:
            running = np.maximum.accumulate(correct[:budget].astype(float))
            out[i, :len(running)] = running
            out[i, len(running):] = running[-1] if len(running) else 0.0
    return out


def _curve_rows(cell: str, method: str, kind: str, values: np.ndarray, seed: int) -> list[dict[str, Any]]:
    lo, hi = bootstrap_ci(values, seed=seed)
    return [{"cell": cell, "method": method, "kind": kind, "budget": b + 1, "accuracy": float(v), "lo": float(l), "hi": float(h)}
            for b, (v, l, h) in enumerate(zip(values.mean(0), np.atleast_1d(lo), np.atleast_1d(hi)))]


def summarize_routes(run: RunDir, lm: LoadedModel, task: Task, cfg: RouteConfig, grading: str | None = None,
                     target: RunDir | None = None) -> dict[str, Any]:
    """Per cell: oracle curves with intervals, the deployable votes along them, oracle@K
    per method, random - structured at K (Newcombe paired), and each selector's
    accuracy, selection gap and gap recovery (paired), all under `grading` (default: the
    run's), with the deployed accuracy, oracles@K and selector accuracies under the
    other grading beside (`summary[other]`). The collapse rule reads the unparsed rate,
    which no grading changes. Tables (under `grading`): route_curves, route_cells,
    selectors, written to `target` (default: the run). Old records' strict grades are
    read from their texts (`grading.regrade`); self-verification scores come from `lm`."""
    grading = grading or run.grading
    records = regrade(run.read_records(), task)
    qids = list(question_scores(graded(records, "flexible"), "temperature").index)
    # The selectors' choices are answer-blind: made once, then graded either way.
    choices = {"temperature": _selector_choices(lm, task, _candidates(records, "temperature", qids), {})}
    for space_name in cfg.spaces:
        choices[space_name] = _selector_choices(
            lm, task, _candidates(records, str(ProbeLabel.route(space_name, "random")), qids),
            {name: _candidates(records, str(ProbeLabel.route(space_name, name)), qids) for name in SEARCH_SELECTORS})
    summary, tables = _graded_routes(graded(records, grading), lm, task, cfg, choices)
    other = other_grading(grading)
    beside, _ = _graded_routes(graded(records, other), lm, task, cfg, choices)
    summary["grading"] = grading
    summary[other] = {"deployed": beside["deployed"], "oracle_at_k": beside["oracle_at_k"],
                      "temperature_oracle": beside["temperature"]["oracle"],
                      "cells": {cell: {"oracle_at_k": c["oracle_at_k"],
                                       "selectors": {name: sel["accuracy"] for name, sel in c["selectors"].items()}}
                                for cell, c in beside["cells"].items()}}
    null = question_null(graded(records, grading), task, "temperature", grading, cfg.samples, seed=cfg.seed)
    if null is not None:
        t_scores = question_scores(graded(records, grading), "temperature")
        summary["null"] = null_summary(t_scores["d"], t_scores["o"], *null)
    summary["unfinished_rate"] = {p: unfinished_rate(records, p) for p in dict.fromkeys(records["probe"])}
    summary["warnings"] = [w for p, r in summary["unfinished_rate"].items() if (w := unfinished_warning(r, p))]
    for name, table in tables.items():
        (target or run).write_table(name, table)
    return summary


def _graded_routes(records: pd.DataFrame, lm: LoadedModel, task: Task, cfg: RouteConfig,
                   choices: dict[str, dict[str, list[int | None]]]) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """`summarize_routes`' summary and tables from records graded one way (`correct`)."""
    scores = question_scores(records, "temperature")
    qids = list(scores.index)
    d = scores["d"].to_numpy()
    greedy = float(d.mean())
    curves, cells, selectors = [], [], []
    summary: dict[str, Any] = {"kind": "route", "model": lm.spec, "task": task.name, "k": cfg.samples, "budget": cfg.budget,
                               "n_questions": len(scores), "deployed": greedy,
                               "deployed_ci": list(wilson_interval(d.sum(), len(d))), "cells": {}}
    # Plain sampling's selection gap, the same for every cell.
    temperature = _picks_correct(choices["temperature"], _candidates(records, "temperature", qids), {})
    t_oracle = scores["o"].to_numpy()
    summary["temperature"] = {"oracle": float(t_oracle.mean()),
                              "selectors": {name: selection_summary(d, t_oracle, hit) for name, hit in temperature.items()}}
    for space_name in cfg.spaces:
        cell = f"{lm.spec}/{task.name}/{space_name}"
        rand = _candidates(records, str(ProbeLabel.route(space_name, "random")), qids)
        unparsed = unparsed_rate(pd.concat(rand))
        excluded = bool(unparsed > cfg.collapse)
        at_k: dict[str, np.ndarray] = {}
        for m in dict.fromkeys(("random", *cfg.methods)):
            curve = _prefix_oracle(rand if m == "random" else _candidates(records, str(ProbeLabel.route(space_name, m)), qids), cfg.budget, m == "random")
            curves += _curve_rows(cell, m, "oracle", curve, cfg.seed)
            at_k[m] = curve[:, -1].astype(bool)
        for vote, weighted in VOTES.items():
            curves += _curve_rows(cell, vote, "vote", vote_matrix(rand, np.arange(1, cfg.budget + 1), weighted, 1, cfg.seed), cfg.seed)
        blind = {name: _candidates(records, str(ProbeLabel.route(space_name, name)), qids) for name in SEARCH_SELECTORS}
        picks = _picks_correct(choices[space_name], rand, blind)
        oracle = at_k["random"]
        oracle_at_k = {m: float(v.mean()) for m, v in at_k.items()}
        diffs = {m: {"value": oracle_at_k["random"] - oracle_at_k[m], "ci": [float(x) for x in paired_diff_ci(at_k[m], oracle)]}
                 for m in STRUCTURED if m in at_k}
        for m, v in at_k.items():
            cells.append({"cell": cell, "model": lm.spec, "task": task.name, "space": space_name, "method": m,
                          "oracle": float(v.mean()), "oracle_lo": wilson_interval(v.sum(), len(v))[0],
                          "oracle_hi": wilson_interval(v.sum(), len(v))[1],
                          "random_minus": diffs.get(m, {}).get("value", 0.0),
                          "random_minus_lo": diffs.get(m, {}).get("ci", [0.0, 0.0])[0],
                          "random_minus_hi": diffs.get(m, {}).get("ci", [0.0, 0.0])[1],
                          "deployed": greedy, "n_questions": len(qids), "k": cfg.budget,
                          "excluded": excluded, "unparsed_rate": unparsed})
        cell_sel = {}
        for name, hit in picks.items():
            cell_sel[name] = selection_summary(d, oracle, hit)
            selectors.append({"cell": cell, "space": space_name, "selector": name, "source": "routes", **_flat(cell_sel[name])})
        for name, sel in summary["temperature"]["selectors"].items():
            selectors.append({"cell": cell, "space": space_name, "selector": name, "source": "temperature", **_flat(sel)})
        summary["cells"][cell] = {
            "space": space_name, "oracle_at_k": oracle_at_k, "excluded": excluded, "unparsed_rate": unparsed,
            "random_minus_structured": diffs, "selectors": cell_sel,
        }
    sel = pd.DataFrame(selectors)
    tables = {"route_curves": pd.DataFrame(curves), "route_cells": pd.DataFrame(cells), "selectors": sel}
    kept = [c for c, v in summary["cells"].items() if not v["excluded"]]
    summary["excluded_cells"] = [c for c in summary["cells"] if c not in kept]
    methods = dict.fromkeys(("random", *cfg.methods))
    summary["oracle_at_k"] = {m: float(np.nanmean([summary["cells"][c]["oracle_at_k"][m] for c in kept])) if kept else float("nan") for m in methods}
    routes_sel = sel[(sel.source == "routes") & sel.cell.isin(kept)] if len(sel) else sel
    summary["selectors"] = {name: {"accuracy": float(g.accuracy.mean()), "gap_recovery_median": float(g.gap_recovery.median())}
                            for name, g in routes_sel.groupby("selector", sort=False)} if len(routes_sel) else {}
    return summary, tables


def _flat(sel: dict[str, Any]) -> dict[str, Any]:
    """A selection summary as table columns (intervals as _lo/_hi)."""
    out: dict[str, Any] = {}
    for key, value in sel.items():
        if key.endswith("_ci"):
            out[f"{key[:-3]}_lo"], out[f"{key[:-3]}_hi"] = value
        else:
            out[key] = value
    return out


def _selector_choices(lm: LoadedModel, task: Task, cands: list[pd.DataFrame],
                      blind: dict[str, list[pd.DataFrame]]) -> dict[str, list[int | None]]:
    """Per selector, the candidate it picks for each question (None: it abstains): the
    candidate selectors over `cands`, each search selector over its own search's
    candidates (its best-rewarded route). Answer-blind: no grade is read."""
    by_id = {q.id: q for q in task.questions}
    choices: dict[str, list[int | None]] = {name: [] for name in CANDIDATE_SELECTORS}
    for g in cands:
        answers = [a if isinstance(a, str) else None for a in g["extracted"]]
        table = g.assign(verify_yes_logprob=verify_scores(lm, task, by_id[g["question_id"].iloc[0]], answers))
        for name in CANDIDATE_SELECTORS:
            choices[name].append(select(table, name))
    for name, per_q in blind.items():
        choices[name] = [select(g, "confidence") for g in per_q]
    return choices


def _picks_correct(choices: dict[str, list[int | None]], cands: list[pd.DataFrame],
                   blind: dict[str, list[pd.DataFrame]]) -> dict[str, np.ndarray]:
    """Per selector, whether its pick is correct (`correct`) for each question; an
    abstention is wrong."""
    return {name: np.asarray([bool(g.loc[i, "correct"]) if i is not None else False
                              for i, g in zip(picked, blind.get(name, cands))], dtype=bool)
            for name, picked in choices.items()}


def _selector_picks(lm: LoadedModel, task: Task, cands: list[pd.DataFrame], blind: dict[str, list[pd.DataFrame]]) -> dict[str, np.ndarray]:
    """Per selector, whether its pick is correct for each question (an abstention is
    wrong), under the grading the candidates' `correct` holds."""
    return _picks_correct(_selector_choices(lm, task, cands, blind), cands, blind)
