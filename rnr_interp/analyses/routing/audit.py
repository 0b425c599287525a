"""The routing audit: random routes vs structured search at a matched budget, and
answer-blind selectors, on one model and task.

For every question and route space (a *cell* is model x task x space):
- `deployed`: greedy on the full path; `temperature`: K temperature samples (same prefill);
- `random`: the full path + K-1 distinct routes from the space's own sampler (one shared
  seed, so every question gets the same routes and each route is one batch over all
  questions);
- `mcts`, `hill_climb`, `genetic`: oracle searches with the gold answer as reward, K
  distinct route evaluations each (the full path first, as for random);
- `random_matched`: the full path + K-1 distinct random routes whose distances from the
  full path (`RouteSpace.edits`) are drawn from those of the routes the oracle searches
  evaluated on the chunk's questions in the same space (`search.random_matched`); run
  after them, one shared seed like `random`;
- `mcts_blind`, `hill_climb_blind`, `genetic_blind`: the same searches, K evaluations
  each, rewarded answer-blind by the model's per-token probability of its own output
  (`selectors.search_reward`).
Every evaluated route is a record (probe = "space:method", intervention = the route);
self-verification's score of every distinct answer of the temperature samples and of
each space's random routes is a record too (probe "verify:LABEL", `ProbeLabel`), so the
summary reads records only.

Answer-blind selectors, each spending K route evaluations: majority vote (ties to the
answer seen first; the full path is seen first), confidence and self-verification over
the K random-route candidates; for each blind search, its *vote* (majority over the
answers of the routes it evaluated, ties as majority's; the paper's "MCTS vote") and its
*confidence* pick (the route of best reward, i.e. `confidence` over those routes). The
confidence-weighted vote is reported as a second line beside majority. Along the budget
curve, the deployable vote at each k (majority, and weighted) is drawn beside each
oracle curve (`metrics.vote_curve`: expectation over random (k-1)-subsets of the random
routes with the full path always in).

Format collapse is judged on what every method shares, the full path's greedy output:
a model-task whose deployed answers mostly fail to parse (``unparsed_rate > collapse``,
default 0.5) has every space's cell flagged and left out of the headline comparisons
(`routing.cells` also shows them with the flagged cells kept). A rule on random's own
routes would drop exactly the cells where random strays furthest, i.e. loses most.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from rnr_interp.engine.decoding import SAMPLING_TEMPERATURE, Decoding

from rnr_interp.engine.generate import last_logits
from rnr_interp.engine.rows import PrefillCache, Row, generate_rows
from rnr_interp.interventions import Route, route_schedule, set_id
from rnr_interp.metrics import bootstrap_ci, oracle_curve_after_first, paired_diff_ci, question_scores, selection_summary, unparsed_rate, vote_matrix, wilson_interval
from rnr_interp.models import LoadedModel
from rnr_interp.grading import graded, other_grading, question_null, null_summary, regrade, unfinished_rate, unfinished_warning
from rnr_interp.records import DEFAULT_GRADING, DEPLOYED, ROUTE, Journal, ProbeLabel, RouteSummary, RunDir, RunFolderError
from rnr_interp.analyses.routing.batching import Lockstep
from rnr_interp.analyses.routing.search import ADAPTIVE, SEARCHES, round_size
from rnr_interp.analyses.routing.selectors import search_reward, select
from rnr_interp.analyses.routing.spaces import SPACES, RouteSpace, make_space, space_size
from rnr_interp.engine.sampling import Probe, candidate_row, run_config, sample_questions
from rnr_interp.tasks import reload_task
from rnr_interp.tasks.base import Question, Task

STRUCTURED = ADAPTIVE
#: the random samplers the structured searches are compared with
BASELINES = ("random", "random_matched")
#: selectors over a probe's K candidates (weighted_majority is majority's second line)
CANDIDATE_SELECTORS = ("majority", "weighted_majority", "confidence", "self_verification")
#: answer-blind searches: probe method -> the search run with `search_reward`
BLIND_SEARCHES = {f"{m}_blind": m for m in STRUCTURED}
#: selectors over a blind search's evaluated routes: name -> (blind probe method, selector)
SEARCH_SELECTORS = {
    **{f"{m}_vote": (f"{m}_blind", "majority") for m in STRUCTURED},
    **{f"{m}_confidence": (f"{m}_blind", "confidence") for m in STRUCTURED},
}
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
    methods: tuple[str, ...] = tuple(SEARCHES)
    #: routes each structured search (gold-rewarded and blind) proposes per round: None
    #: for each search's default (MCTS 1, hill climbing 8 neighbours, genetic one
    #: generation of 8); 1 makes every search sequential. The budget stays K distinct
    #: routes whatever this is; it changes which routes an adaptive search picks.
    proposals: int | None = None
    temperature: float = SAMPLING_TEMPERATURE
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
        if "random_matched" in self.methods and not set(self.methods) & set(STRUCTURED):
            raise ValueError("random_matched matches the structured searches' routes: give one of "
                             f"{', '.join(STRUCTURED)} with it")
        if self.proposals is not None and self.proposals < 1:
            raise ValueError(f"proposals must be >= 1, got {self.proposals}")



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

    def job(q: Question, s: Search):
        evaluate = lockstep.evaluate_for(q.id)

        def score(routes):
            rows = evaluate(routes)
            if on_evaluated is not None:
                on_evaluated(len(rows))
            return [s.reward(q, row) for row in rows]

        # Every search of a method shares one seed across questions (random search asks
        # every question for the same routes, which batch fully); runs are reproducible.
        return SEARCHES[s.method](s.space, score, budget, np.random.default_rng(seed), **s.options)

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


def _rows(pairs, probe: str, common: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**row, **common, "probe": probe, "candidate": i, "seed": 0} for i, (_, row) in enumerate(pairs)]


def gold_reward(q: Question, row: dict[str, Any]) -> float:
    """The oracle searches' reward: is the route's answer correct."""
    return float(row["correct"])


def audit_searches(spaces: dict[str, RouteSpace], methods: Sequence[str], proposals: int | None = None) -> dict[str, Search]:
    """The searches the audit runs first on every question, by record probe label: per
    space, random and the gold-rewarded `methods`, and the answer-blind searches, each
    adaptive one with its round size (`search.round_size`). `random_matched` is not
    among them: it needs these searches' routes (`matched_searches`)."""
    searches = {}
    for name, space in spaces.items():
        for m in dict.fromkeys(("random", *methods)):
            if m != "random_matched":
                searches[str(ProbeLabel.route(name, m))] = Search(space, m, gold_reward, _round(m, proposals))
        for label, m in BLIND_SEARCHES.items():
            searches[str(ProbeLabel.route(name, label))] = Search(space, m, blind_reward, _round(m, proposals))
    return searches


def audit_searches_count(cfg: RouteConfig) -> int:
    """How many searches `audit_searches` runs on every question (each writes `budget` rows)."""
    return len(cfg.spaces) * (len(dict.fromkeys(("random", *cfg.methods))) + len(BLIND_SEARCHES))


def _round(method: str, proposals: int | None) -> dict[str, Any]:
    size = round_size(method, proposals)
    return {} if size is None else {"batch_size": size}


def matched_searches(spaces: dict[str, RouteSpace], methods: Sequence[str],
                     found: dict[str, dict[str, list[tuple[tuple[int, ...], dict[str, Any]]]]]) -> dict[str, Search]:
    """`random_matched` per space, its distance profile the edit distances
    (`RouteSpace.edits`) of every route after the full path that the gold-rewarded
    structured searches among `methods` evaluated on these questions in that space
    (`found`, from `run_searches`); none when `methods` has no random_matched."""
    if "random_matched" not in methods:
        return {}
    out = {}
    for name, space in spaces.items():
        profile = [space.edits(route) for m in methods if m in STRUCTURED
                   for pairs in found[str(ProbeLabel.route(name, m))].values() for route, _ in pairs[1:]]
        out[str(ProbeLabel.route(name, "random_matched"))] = Search(space, "random_matched", gold_reward, {"profile": profile})
    return out


def blind_reward(q: Question, row: dict[str, Any]) -> float:
    """The search selectors' reward: no gold answer, only the model's own confidence."""
    return search_reward(row["extracted"], row["logprob"], row["n_tokens"])


def route_decoding(task: Task) -> Decoding:
    """How every route and the deployed full path decode: greedy, to the task's length."""
    return Decoding(max_new_tokens=task.max_new_tokens)


def route_run_config(lm: LoadedModel, task: Task, cfg: RouteConfig, grading: str | None = None) -> dict[str, Any]:
    """The run config of a route audit: what a run folder stores and a resume checks.
    `grading` None: the folder's own when resuming, else the default."""
    samplers = {name: make_space(name, lm.n_layers, min_len=cfg.min_len, max_len=cfg.max_len).sampler for name in cfg.spaces}
    return run_config(ROUTE, lm, task, grading=grading, route=asdict(cfg), deployed=asdict(route_decoding(task)),
                      random_samplers=samplers)


def with_both_grades(row: dict[str, Any], task: Task) -> dict[str, Any]:
    """A journalled row with both grades: a row journalled before they were recorded
    (its `correct` then the flexible rule's) gets them from its text."""
    if "correct_strict" in row:
        return row
    q = next(q for q in task.questions if q.id == row["question_id"])
    strict = task.grade_candidate(row["text"], q, row["finish"]).strict and bool(row["correct"])
    return {**row, "correct_strict": strict, "correct_flexible": bool(row["correct"])}


def run_route_audit(lm: LoadedModel, task: Task, out: str | Path, cfg: RouteConfig = RouteConfig(), progress: bool = True,
                    grading: str | None = None) -> RouteSummary:
    decoding = route_decoding(task)
    spaces = route_spaces(cfg, lm.n_layers)  # refused before the run folder is made
    run = RunDir.create(out, route_run_config(lm, task, cfg, grading))
    run_id = run.run_id
    common = {"run_id": run_id, "model": lm.spec, "task": task.name}
    done = run.done_question_ids()
    questions = [q for q in task.questions if q.id not in done]
    # A chunk stopped part way left its temperature samples and route evaluations in the
    # run's journal: they are taken back, and the chunk redoes only what is missing.
    saved = read_route_journal(run)
    evaluator = RouteEvaluator(lm, task, decoding, max(cfg.batch_size, route_rows(lm)), cfg.reuse_prefix, journal=run.journal,
                               grading=run.grading)
    evaluator.restore(saved)
    saved_samples = {tuple(e["question_ids"]): [with_both_grades(r, task) for r in e["samples"]] for e in saved if "samples" in e}
    searches = audit_searches(spaces, cfg.methods, cfg.proposals)
    n_matched = len(spaces) if "random_matched" in cfg.methods else 0
    verified = [str(ProbeLabel.sample("temperature")), *(str(ProbeLabel.route(name, "random")) for name in spaces)]

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
        with tqdm(total=(len(searches) + n_matched) * len(chunk) * cfg.budget, unit="route", desc="route evaluations",
                  leave=False, disable=not progress) as routes_bar:
            found = run_searches(evaluator, chunk, searches, cfg.budget, cfg.seed, on_evaluated=routes_bar.update)
            # random_matched draws at the distances the searches just evaluated
            found |= run_searches(evaluator, chunk, matched_searches(spaces, cfg.methods, found), cfg.budget, cfg.seed,
                                  on_evaluated=routes_bar.update)
        for label, per_question in found.items():
            for pairs in per_question.values():
                rows += _rows(pairs, label, common)
        rows += verify_rows(lm, task, chunk, rows, verified)
        run.write_question_batch(rows)
        run.journal.clear()
        evaluator.forget(q.id for q in chunk)
        bar.update(len(chunk))
    bar.close()
    return run.write_summary(summarize_routes(run, cfg, task=task))


def route_spaces(cfg: RouteConfig, n_layers: int) -> dict[str, RouteSpace]:
    """The route spaces of `cfg` on a model of `n_layers` blocks. Refused (ValueError)
    when a space holds fewer distinct routes than the budget: every search evaluates
    `budget` distinct routes per question, and the oracle and vote curves are drawn to
    the budget, so such a run could write its records but never its summary."""
    spaces = {name: make_space(name, n_layers, min_len=cfg.min_len, max_len=cfg.max_len) for name in cfg.spaces}
    sizes = {name: space_size(space) for name, space in spaces.items()}
    small = [name for name, size in sizes.items() if size < cfg.budget]
    if small:
        space = spaces[small[0]]
        raise ValueError(
            f"route budget {cfg.budget} (--budget, else --k) is more than the {sizes[small[0]]} distinct routes of space "
            f"{space.name!r} on this {n_layers}-layer model (route lengths {space.min_len}..{space.max_len}); "
            f"the largest budget that works is {min(sizes.values())}")
    return spaces


#: the fields of a route evaluation's row in the journal (`candidate_row`'s)
_ROUTE_ROW_FIELDS = ("question_id", "intervention", "text", "extracted", "gold", "correct", "logprob", "n_tokens", "finish")


def read_route_journal(run: RunDir) -> list[dict[str, Any]]:
    """The run's journal, checked before anything of it is used: each line is a chunk's
    samples (question_ids, samples: record rows) or one route evaluation (question_id,
    route, row), and belongs to this run. Lines written before lines carried the run's
    id are the run's when the samples they came with carry its id in their rows (a
    chunk's journal starts with its samples). Anything else: RunFolderError naming the
    file and line, before anything is appended."""
    journal = run.journal
    entries = journal.read()
    vouched = any(not Journal.unowned(e) for e in entries)
    for n, e in enumerate(entries, 1):
        if "samples" in e:
            ids, rows = e.get("question_ids"), e.get("samples")
            if not (isinstance(ids, list) and all(isinstance(q, str) for q in ids) and isinstance(rows, list)
                    and all(isinstance(r, dict) and r.get("question_id") in ids for r in rows)):
                raise journal.error(n, "a samples entry needs question_ids (strings) and samples (rows of those questions)")
            owners = {r.get("run_id") for r in rows}
            if owners - {run.run_id}:
                raise journal.error(n, f"samples of another run (run_id {sorted(map(str, owners - {run.run_id}))[0][:20]!r})")
            vouched = vouched or bool(rows)
        elif "route" in e:
            route, row = e.get("route"), e.get("row")
            if not (isinstance(e.get("question_id"), str) and isinstance(route, list)
                    and all(isinstance(b, int) and not isinstance(b, bool) for b in route)
                    and isinstance(row, dict) and all(f in row for f in _ROUTE_ROW_FIELDS)
                    and row["question_id"] == e["question_id"]):
                raise journal.error(n, "a route entry needs question_id, route (block numbers) and row "
                                       f"(with {', '.join(_ROUTE_ROW_FIELDS)})")
        else:
            raise journal.error(n, "not a route run's journal entry (needs samples or route)")
    if entries and not vouched:
        raise journal.error(1, "names no run (neither its lines nor its samples carry a run id)")
    return entries


def route_config_of(run: RunDir) -> RouteConfig:
    """The RouteConfig a route run folder was started with."""
    if run.config.get("kind") != ROUTE:
        raise RunFolderError(f"{run.path} is not a route run (its kind: {run.config.get('kind')!r})")
    stored = run.config.get("route") or {}
    try:
        return RouteConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})
    except TypeError as err:
        raise RunFolderError(f"{run.path}: route settings this version does not know ({err})") from None


def summarize_so_far(run: RunDir, out: str | Path) -> RouteSummary:
    """A route run's summary over the chunks it has written so far, without touching the
    run (it may still be going): its records are copied into a new run folder `out`
    (`RunDir.snapshot`), which gets the summary and tables a finished run gets, over
    those questions. For runs that take hours (GSM8K answers on a CPU). No model; the
    task is reloaded from the file the run names, for the golds of the chance nulls
    (where it cannot be, the summary goes without them and says so)."""
    cfg = route_config_of(run)
    if not run.done_question_ids():
        raise RunFolderError(f"{run.path}: no chunk written yet, nothing to summarise")
    snap = run.snapshot(out)  # counted from the copy: the run may write a chunk meanwhile
    try:
        task, why = reload_task(run.config["task"]), None
    except (OSError, ValueError, RunFolderError) as exc:
        task, why = None, f"chance nulls: the run's task cannot be reloaded here ({exc})"
    summary = summarize_routes(snap, cfg, task=task)
    if why is not None:
        summary.setdefault("missing", []).append(why)
    summary["snapshot"] = {"of": str(run.path.resolve()), "questions_done": len(snap.done_question_ids()),
                           "questions_total": (run.config.get("task") or {}).get("n_questions")}
    return snap.write_summary(summary)


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


def route_of(intervention: str) -> tuple[int, ...]:
    """The route in a route record's intervention id ("route:0-1-1-2", `Route.label`)."""
    return tuple(int(i) for i in intervention.removeprefix("route:").split("-"))


def verification_stored(run: RunDir) -> bool:
    """Whether a route run's records hold its self-verification scores (runs made
    before they were stored do not)."""
    return bool(run.read_records()["probe"].str.startswith("verify:").any())


def _verify_tables(records: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """Stored self-verification scores: per verified probe label, per question, answer -> score."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for probe, g in records[records.probe.str.startswith("verify:")].groupby("probe", sort=False):
        source = str(probe).removeprefix("verify:")
        out[source] = {qid: dict(zip(h.extracted, h.logprob)) for qid, h in g.groupby("question_id", sort=False)}
    return out


def summarize_routes(run: RunDir, cfg: RouteConfig, grading: str | None = None, target: RunDir | None = None,
                     task: Task | None = None, lm: LoadedModel | None = None) -> dict[str, Any]:
    """Per cell: oracle curves with intervals, the deployable votes along them, oracle@K
    and mean edit distance per method, random - structured and random_matched -
    structured at K (Newcombe paired), and each selector's accuracy, selection gap and
    gap recovery (paired), all under `grading` (default: the run's), with the deployed
    accuracy, oracles@K and selector accuracies under the other grading beside
    (`summary[other]`), the chance null of the temperature probe and each probe's
    unfinished rate. Tables (under `grading`): route_curves, route_cells,
    route_distances, selectors, written to `target` (default: the run).

    Reads the records only. Records of runs made before both grades were recorded get
    their strict grade from their texts when `task` is given (`grading.regrade`), and
    before self-verification scores were stored, from `lm` when it is given (`rnr
    regrade` passes both); without them those parts are left out and named in
    `summary["missing"]`."""
    grading = grading or run.grading
    records = run.read_records()
    if task is not None:
        records = regrade(records, task)
    both = not records["correct_strict"].isna().any()
    if grading == "strict" and not both:
        raise RunFolderError(f"{run.path}: its records hold no strict grades (made before they were recorded); "
                             "`rnr regrade RUN` reads them from the texts")
    verify = _verify_tables(records)
    headline = graded(records, grading)  # a copy of the records: made once
    t_scores = question_scores(headline, "temperature")
    qids = list(t_scores.index)
    rand_labels = {space: str(ProbeLabel.route(space, "random")) for space in cfg.spaces}
    if "temperature" not in verify and lm is not None and task is not None:
        # a run from before the scores were stored: the model scores them now
        by_id = {q.id: q for q in task.questions}
        rows = records[records.probe.isin(["temperature", *rand_labels.values()])].to_dict("records")
        verify = _verify_tables(pd.DataFrame(verify_rows(lm, task, [by_id[q] for q in qids], rows,
                                                         ["temperature", *rand_labels.values()])))
    # The selectors' choices are answer-blind: made once, then graded either way.
    choices = {"temperature": _selector_choices(_candidates(records, "temperature", qids), {}, verify.get("temperature"))}
    for space, label in rand_labels.items():
        choices[space] = _selector_choices(
            _candidates(records, label, qids),
            {name: _candidates(records, str(ProbeLabel.route(space, name)), qids) for name in BLIND_SEARCHES},
            verify.get(label))
    summary, tables = _graded_routes(headline, run.config, cfg, choices)
    if "temperature" not in verify:
        summary["missing"] = ["self_verification: these records hold no stored self-verification scores"]
    other = other_grading(grading)
    if both:
        beside, _ = _graded_routes(graded(records, other), run.config, cfg, choices)
        summary[other] = {"deployed": beside["deployed"], "oracle_at_k": beside["oracle_at_k"],
                          "temperature_oracle": beside["temperature"]["oracle"],
                          "cells": {cell: {"oracle_at_k": c["oracle_at_k"],
                                           "selectors": {name: sel["accuracy"] for name, sel in c["selectors"].items()}}
                                    for cell, c in beside["cells"].items()}}
    else:
        summary.setdefault("missing", []).append(f"{other}: these records hold no strict grades (`rnr regrade` reads them)")
    summary["grading"] = grading
    if task is not None:
        null = question_null(headline, task, "temperature", grading, cfg.samples, seed=cfg.seed)
        if null is not None:
            summary["null"] = null_summary(t_scores["d"], t_scores["o"], *null)
        _route_nulls(headline, task, grading, cfg, summary, tables)
    summary["unfinished_rate"] = {p: unfinished_rate(records, p) for p in dict.fromkeys(records["probe"])
                                  if not str(p).startswith("verify:")}
    summary["warnings"] = [w for p, r in summary["unfinished_rate"].items() if (w := unfinished_warning(r, p))]
    for name, table in tables.items():
        (target or run).write_table(name, table)
    return summary


def _route_nulls(records: pd.DataFrame, task: Task, grading: str, cfg: RouteConfig, summary: dict[str, Any],
                 tables: dict[str, pd.DataFrame]) -> None:
    """Each cell's chance null per method, beside its oracle@K: what the same K route
    candidates reach by coincidence (`grading.question_null`: graded against another
    question's gold, or guessing like them for a finite option set). A gold-rewarded
    search steers its routes toward the true gold; its null asks how often that set
    holds a wrong question's gold instead. Into `summary["cells"][cell]["null"][method]`
    and the `route_cells` table (`null_oracle`, `oracle_minus_null` with its interval)."""
    columns: list[dict[str, Any]] = []
    for cell, c in summary["cells"].items():
        c["null"] = {}
        for m in c["oracle_at_k"]:
            label = str(ProbeLabel.route(c["space"], m))
            null = question_null(records, task, label, grading, cfg.budget, seed=cfg.seed)
            if null is None:
                continue
            scores = question_scores(records, label)
            c["null"][m] = null_summary(scores["d"].to_numpy(), scores["o"].to_numpy(), *null, seed=cfg.seed)
            lo, hi = c["null"][m]["O_K_minus_null_ci"]
            columns.append({"cell": cell, "method": m, "null_oracle": c["null"][m]["O_K"],
                            "oracle_minus_null": c["null"][m]["O_K_minus_null"],
                            "oracle_minus_null_lo": lo, "oracle_minus_null_hi": hi})
    if columns and len(tables["route_cells"]):
        tables["route_cells"] = tables["route_cells"].merge(pd.DataFrame(columns), on=["cell", "method"], how="left")


def _graded_routes(records: pd.DataFrame, config: dict[str, Any], cfg: RouteConfig,
                   choices: dict[str, dict[str, list[int | None]]]) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """`summarize_routes`' summary and tables from records graded one way (`correct`)."""
    model, task_name = config["model"], config["task"]["name"]
    n_layers = int(config["model_facts"]["n_layers"])
    scores = question_scores(records, "temperature")
    qids = list(scores.index)
    d = scores["d"].to_numpy()
    greedy = float(d.mean())
    # Format collapse, judged on the one output every method shares: the full path's.
    deployed = records[records.probe == DEPLOYED]
    collapse_rate = unparsed_rate(deployed[deployed.question_id.isin(qids)])
    excluded = bool(collapse_rate > cfg.collapse)
    curves, cells, distances, selectors = [], [], [], []
    summary: dict[str, Any] = {"kind": ROUTE, "model": model, "task": task_name, "k": cfg.samples, "budget": cfg.budget,
                               "n_questions": len(scores), "deployed": greedy,
                               "deployed_ci": list(wilson_interval(d.sum(), len(d))),
                               "proposals": {m: round_size(m, cfg.proposals) for m in STRUCTURED},
                               "exclusion": {"rule": "full path's unparsed rate > collapse", "collapse": cfg.collapse,
                                             "full_path_unparsed_rate": collapse_rate},
                               "cells": {}}
    # Plain sampling's selection gap, the same for every cell.
    temperature = _picks_correct(choices["temperature"], _candidates(records, "temperature", qids), {})
    t_oracle = scores["o"].to_numpy()
    summary["temperature"] = {"oracle": float(t_oracle.mean()),
                              "selectors": {name: selection_summary(d, t_oracle, hit) for name, hit in temperature.items()}}
    methods = list(dict.fromkeys(("random", *cfg.methods)))
    for space_name in cfg.spaces:
        cell = f"{model}/{task_name}/{space_name}"
        space = make_space(space_name, n_layers, min_len=cfg.min_len, max_len=cfg.max_len)
        rand_label = str(ProbeLabel.route(space_name, "random"))
        rand = _candidates(records, rand_label, qids)
        rand_unparsed = unparsed_rate(pd.concat(rand))  # shown, not judged (see the exclusion rule)
        at_k: dict[str, np.ndarray] = {}
        edits: dict[str, np.ndarray] = {}
        for m in methods:
            cands = _candidates(records, str(ProbeLabel.route(space_name, m)), qids)
            curve = _prefix_oracle(cands, cfg.budget, m in BASELINES)
            curves += _curve_rows(cell, m, "oracle", curve, cfg.seed)
            at_k[m] = curve[:, -1].astype(bool)
            edits[m] = np.concatenate([[space.edits(route_of(i)) for i in g["intervention"]] for g in cands])
            values, counts = np.unique(edits[m], return_counts=True)
            distances += [{"cell": cell, "space": space_name, "method": m, "edits": int(v), "routes": int(c)}
                          for v, c in zip(values, counts)]
        for vote, weighted in VOTES.items():
            curves += _curve_rows(cell, vote, "vote", vote_matrix(rand, np.arange(1, cfg.budget + 1), weighted, 1, cfg.seed), cfg.seed)
        blind = {name: _candidates(records, str(ProbeLabel.route(space_name, name)), qids) for name in BLIND_SEARCHES}
        picks = _picks_correct(choices[space_name], rand, blind)
        oracle = at_k["random"]
        oracle_at_k = {m: float(v.mean()) for m, v in at_k.items()}
        #: no method beat greedy anywhere: the comparison could not have gone either way
        informative = any(v.mean() > greedy for v in at_k.values())
        diffs = {base: {m: {"value": oracle_at_k[base] - oracle_at_k[m], "ci": [float(x) for x in paired_diff_ci(at_k[m], at_k[base])]}
                        for m in STRUCTURED if m in at_k} for base in BASELINES if base in at_k}
        for m, v in at_k.items():
            lo, hi = wilson_interval(v.sum(), len(v))
            row = {"cell": cell, "model": model, "task": task_name, "space": space_name, "method": m,
                   "oracle": float(v.mean()), "oracle_lo": lo, "oracle_hi": hi, "edits_mean": float(edits[m].mean())}
            for base, column in (("random", "random_minus"), ("random_matched", "matched_minus")):
                diff = diffs.get(base, {}).get(m)
                row |= {column: diff["value"] if diff else np.nan, f"{column}_lo": diff["ci"][0] if diff else np.nan,
                        f"{column}_hi": diff["ci"][1] if diff else np.nan}
            cells.append({**row, "deployed": greedy, "n_questions": len(qids), "k": cfg.budget, "excluded": excluded,
                          "informative": informative, "unparsed_rate": collapse_rate,
                          "random_unparsed_rate": rand_unparsed})
        cell_sel = {}
        for name, hit in picks.items():
            cell_sel[name] = selection_summary(d, oracle, hit)
            selectors.append({"cell": cell, "space": space_name, "selector": name, "source": "routes", **_flat(cell_sel[name])})
        for name, sel in summary["temperature"]["selectors"].items():
            selectors.append({"cell": cell, "space": space_name, "selector": name, "source": "temperature", **_flat(sel)})
        summary["cells"][cell] = {
            "space": space_name, "oracle_at_k": oracle_at_k, "edits_mean": {m: float(v.mean()) for m, v in edits.items()},
            "excluded": excluded, "informative": informative, "unparsed_rate": collapse_rate,
            "random_minus_structured": diffs.get("random", {}), "matched_minus_structured": diffs.get("random_matched", {}),
            "selectors": cell_sel,
        }
    sel = pd.DataFrame(selectors)
    tables = {"route_curves": pd.DataFrame(curves), "route_cells": pd.DataFrame(cells),
              "route_distances": pd.DataFrame(distances), "selectors": sel}
    kept = [c for c, v in summary["cells"].items() if not v["excluded"]]
    summary["excluded_cells"] = [c for c in summary["cells"] if c not in kept]
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


def _selector_choices(cands: list[pd.DataFrame], blind: dict[str, list[pd.DataFrame]],
                      verify: dict[str, dict[str, float]] | None) -> dict[str, list[int | None]]:
    """Per selector, the candidate it picks for each question (None: it abstains): the
    candidate selectors over `cands` (self-verification from the stored per-answer
    scores `verify`, question -> answer -> score; left out when None), and each search
    selector over its blind search's candidates in `blind`. Answer-blind: no grade is
    read, so one choice serves both gradings."""
    names = [n for n in CANDIDATE_SELECTORS if verify is not None or n != "self_verification"]
    choices: dict[str, list[int | None]] = {name: [] for name in names}
    for g in cands:
        if verify is not None:
            by_answer = verify.get(g["question_id"].iloc[0], {})
            g = g.assign(verify_yes_logprob=[by_answer.get(a, -math.inf) if isinstance(a, str) else -math.inf
                                             for a in g["extracted"]])
        for name in names:
            choices[name].append(select(g, name))
    for name, (probe, selector) in SEARCH_SELECTORS.items():
        if probe in blind:
            choices[name] = [select(g, selector) for g in blind[probe]]
    return choices


def _picks_correct(choices: dict[str, list[int | None]], cands: list[pd.DataFrame],
                   blind: dict[str, list[pd.DataFrame]]) -> dict[str, np.ndarray]:
    """Per selector, whether its pick is correct (`correct`) for each question; an
    abstention is wrong."""
    def pool(name: str) -> list[pd.DataFrame]:
        return blind[SEARCH_SELECTORS[name][0]] if name in SEARCH_SELECTORS else cands

    return {name: np.asarray([bool(g.loc[i, "correct"]) if i is not None else False
                              for i, g in zip(picked, pool(name))], dtype=bool)
            for name, picked in choices.items()}
