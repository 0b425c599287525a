"""The routing audit: random routes vs structured search at a matched budget, and
answer-blind selectors, on one model and task.

For every question and route space (a *cell* is model x task x space):
- `deployed`: greedy on the full path; `temperature`: K temperature samples (same prefill);
- `random`: the full path + K-1 distinct routes from the space's own sampler, a fresh
  draw for every question (`evaluator.search_rng`: one seed stream per search and
  question);
- `mcts`, `hill_climb`, `genetic`: oracle searches with the gold answer as reward, K
  distinct route evaluations each (the full path first, as for random);
- `random_matched_SEARCH` (`random_matched` in the config), one per structured search:
  the full path + K-1 distinct random routes whose distances from the full path
  (`RouteSpace.edits`) are drawn from those of the routes that search evaluated on the
  chunk's questions in the same space (`search.random_matched`); run after them, a
  fresh draw per question like `random`;
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

from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from rnr_interp.engine.sampling import Probe, sample_questions
from rnr_interp.models import LoadedModel
from rnr_interp.records import Journal, ProbeLabel, RouteSummary, RunDir
from rnr_interp.analyses.routing.config import (BLIND_SEARCHES, STRUCTURED, RouteConfig, matched_control, route_decoding,
                                                route_rows, route_run_config, route_spaces)
from rnr_interp.analyses.routing.evaluator import RouteEvaluator, Search, blind_reward, gold_reward, run_searches, verify_rows
from rnr_interp.analyses.routing.search import round_size
from rnr_interp.analyses.routing.spaces import RouteSpace
from rnr_interp.analyses.routing.summary import summarize_routes
from rnr_interp.tasks.base import Task


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
    saved_samples = {tuple(e["question_ids"]): e["samples"] for e in saved if "samples" in e}
    searches = audit_searches(spaces, cfg.methods, cfg.proposals)
    n_matched = len(spaces) * matched_count(cfg)
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


def _rows(pairs, probe: str, common: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**row, **common, "probe": probe, "candidate": i, "seed": 0} for i, (_, row) in enumerate(pairs)]



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
    """How many searches the audit runs on every question (each writes `budget` rows):
    `audit_searches`' and the matched controls (`matched_searches`)."""
    searched = [m for m in cfg.methods if m in STRUCTURED]
    return len(cfg.spaces) * (len({"random", *searched}) + len(BLIND_SEARCHES) + matched_count(cfg))


def matched_count(cfg: RouteConfig) -> int:
    """How many matched controls `matched_searches` runs per space and question."""
    return len([m for m in cfg.methods if m in STRUCTURED]) if "random_matched" in cfg.methods else 0


def _round(method: str, proposals: int | None) -> dict[str, Any]:
    size = round_size(method, proposals)
    return {} if size is None else {"batch_size": size}


def matched_searches(spaces: dict[str, RouteSpace], methods: Sequence[str],
                     found: dict[str, dict[str, list[tuple[tuple[int, ...], dict[str, Any]]]]]) -> dict[str, Search]:
    """With `random_matched` among `methods`: per space and gold-rewarded structured
    search among `methods`, that search's own matched control (`config.matched_control`),
    its distance profile the edit distances (`RouteSpace.edits`) of every route after the
    full path that this search evaluated on these questions in that space (`found`, from
    `run_searches`). Each search is then compared with random routes at its own
    distances, not at a pool of all the searches' distances."""
    if "random_matched" not in methods:
        return {}
    out = {}
    for name, space in spaces.items():
        for m in (m for m in methods if m in STRUCTURED):
            profile = [space.edits(route) for pairs in found[str(ProbeLabel.route(name, m))].values() for route, _ in pairs[1:]]
            out[str(ProbeLabel.route(name, matched_control(m)))] = Search(space, "random_matched", gold_reward,
                                                                          {"profile": profile})
    return out


#: the fields of a route evaluation's row in the journal (`candidate_row`'s)
_ROUTE_ROW_FIELDS = ("question_id", "intervention", "text", "extracted", "gold", "correct", "correct_strict",
                     "correct_flexible", "logprob", "n_tokens", "finish")


def read_route_journal(run: RunDir) -> list[dict[str, Any]]:
    """The run's journal, checked before anything of it is used: each line is a chunk's
    samples (question_ids, samples: record rows) or one route evaluation (question_id,
    route, row), and carries this run's id. Anything else: RunFolderError naming the
    file and line, before anything is appended."""
    journal = run.journal
    entries = journal.read()
    for n, e in enumerate(entries, 1):
        if Journal.unowned(e):
            raise journal.error(n, "names no run (a journal line carries its run's id)")
        if "samples" in e:
            ids, rows = e.get("question_ids"), e.get("samples")
            if not (isinstance(ids, list) and all(isinstance(q, str) for q in ids) and isinstance(rows, list)
                    and all(isinstance(r, dict) and r.get("question_id") in ids for r in rows)):
                raise journal.error(n, "a samples entry needs question_ids (strings) and samples (rows of those questions)")
            owners = {r.get("run_id") for r in rows}
            if owners - {run.run_id}:
                raise journal.error(n, f"samples of another run (run_id {sorted(map(str, owners - {run.run_id}))[0][:20]!r})")
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
    return entries
