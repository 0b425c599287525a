"""The routing audit on tiny models: budgets, space membership, records vs summary."""

import dataclasses
import json

import numpy as np
import pandas as pd
import torch
import pytest

from rnr_interp.engine.decoding import Decoding
from rnr_interp.models import load_model
from rnr_interp.records import RouteSummary, RunDir, comparable
from rnr_interp.analyses.routing.config import BLIND_SEARCHES, SEARCH_SELECTORS, STRUCTURED, RouteConfig, matched_control
from rnr_interp.analyses.routing.evaluator import RouteEvaluator, Search, blind_reward, run_searches
from rnr_interp.analyses.routing.run import run_route_audit
from rnr_interp.analyses.routing.summary import _picks_correct, _selector_choices
from rnr_interp.analyses.routing.selectors import select
from rnr_interp.analyses.routing.batching import Lockstep
from rnr_interp.analyses.routing.spaces import make_space
from rnr_interp.tasks import load_task
from rnr_interp.tasks.base import Task


@pytest.fixture(scope="module")
def routed_run(tmp_path_factory):
    lm = load_model("tiny-llama:6")
    task = load_task("arithmetic", n=5)
    out = tmp_path_factory.mktemp("route")
    # collapse=1.0: the tiny model's full path rarely parses; keep its cells in the aggregate
    cfg = RouteConfig(samples=6, budget=6, spaces=("native", "skiponly"), batch_size=4, collapse=1.0)
    summary = run_route_audit(lm, task, out, cfg, progress=False)
    records = RunDir(out).read_records()
    records.attrs["run"] = str(out)
    return lm, task, cfg, summary, records


def route_of(intervention: str) -> tuple[int, ...]:
    """The path in a record's intervention id, e.g. "route:0-1-1-2"."""
    return tuple(int(i) for i in intervention.removeprefix("route:").split("-"))


def probe_methods(cfg) -> list[str]:
    """The route probes' methods of a run of `cfg`: random_matched is one control per search."""
    return [m for m in cfg.methods if m != "random_matched"] + [matched_control(m) for m in STRUCTURED]


def test_each_search_spends_exactly_its_budget_inside_its_space(routed_run):
    lm, task, cfg, _, records = routed_run
    for space_name in cfg.spaces:
        space = make_space(space_name, lm.n_layers)
        for method in (*probe_methods(cfg), *BLIND_SEARCHES):
            sub = records[records.probe == f"{space_name}:{method}"]
            assert sub.question_id.nunique() == len(task), (space_name, method)
            for qid, g in sub.groupby("question_id"):
                routes = [route_of(i) for i in g.sort_values("candidate").intervention]
                assert len(routes) == cfg.budget == len(set(routes)), (space_name, method, qid)
                assert routes[0] == tuple(range(lm.n_layers))
                assert all(space.contains(r) for r in routes)


def test_oracle_at_k_equals_direct_computation_from_records(routed_run):
    _, task, cfg, summary, records = routed_run
    for space_name in cfg.spaces:
        cell = summary.cells[next(c for c in summary.cells if c.endswith(space_name))]
        for method in probe_methods(cfg):
            sub = records[records.probe == f"{space_name}:{method}"]
            direct = sub.groupby("question_id")["correct"].any().mean()
            assert cell["oracle_at_k"][method] == pytest.approx(direct)


def test_deployed_and_temperature_candidates_recorded(routed_run):
    _, task, cfg, summary, records = routed_run
    dep = records[records.probe == "deployed"]
    assert len(dep) == len(task) and summary.deployed == pytest.approx(dep.correct.mean())
    assert (records.probe == "temperature").sum() == cfg.samples * len(task)


def test_six_selectors_and_the_vote_line_are_reported(routed_run):
    _, task, cfg, summary, records = routed_run
    for cell in summary.cells.values():
        sel = cell["selectors"]
        assert {"majority", "weighted_majority", "confidence", "self_verification", *SEARCH_SELECTORS} == set(sel)
        assert {"mcts_vote", "hill_climb_vote", "genetic_vote", "mcts_confidence"} <= set(sel)
        for v in sel.values():
            assert v["accuracy_ci"][0] <= v["accuracy"] <= v["accuracy_ci"][1]
            assert v["selection_gap"] == pytest.approx(cell["oracle_at_k"]["random"] - v["accuracy"])


def test_deployable_vote_starts_at_greedy_and_ends_at_the_majority_pick(routed_run):
    lm, task, cfg, summary, records = routed_run
    curves = RunDir(records.attrs["run"]).read_table("route_curves")
    for cell, info in summary.cells.items():
        c = curves[curves.cell == cell]
        for vote, selector in (("majority", "majority"), ("weighted_majority", "weighted_majority")):
            line = c[(c.kind == "vote") & (c.method == vote)].sort_values("budget")
            assert list(line.budget) == list(range(1, cfg.budget + 1))
            # k = 1 is the full path alone, greedy: the deployed answer.
            full_path = records[(records.probe == f"{info['space']}:random") & (records.candidate == 0)]
            assert line.accuracy.iloc[0] == pytest.approx(full_path.correct.mean())
            assert line.accuracy.iloc[-1] == pytest.approx(info["selectors"][selector]["accuracy"])
            assert (line.lo <= line.accuracy + 1e-9).all() and (line.accuracy <= line.hi + 1e-9).all()
        oracle = c[(c.kind == "oracle") & (c.method == "random")].sort_values("budget")
        assert oracle.accuracy.is_monotonic_increasing
        assert oracle.accuracy.iloc[0] == pytest.approx(line.accuracy.iloc[0])  # the same K=1 point


def test_every_selector_recomputes_from_the_records_alone(routed_run):
    """Each selector's pick per question, rebuilt from the stored records only (random
    candidates, the blind searches' candidates, the verify:LABEL rows of
    self-verification), gives the accuracy the summary reports, for every selector
    and both candidate sources."""
    _, task, cfg, summary, records = routed_run
    verify = records[records.probe.str.startswith("verify:")]

    def picks_correct(cands: pd.DataFrame, selector: str, verify_probe: str) -> bool:
        table = cands.sort_values("candidate").reset_index(drop=True)
        if selector == "self_verification":
            scores = verify[(verify.probe == verify_probe) & (verify.question_id == table.question_id.iloc[0])]
            by_answer = dict(zip(scores.extracted, scores.logprob))
            assert set(by_answer) == {a for a in table.extracted if isinstance(a, str)}  # every distinct answer scored
            table = table.assign(verify_yes_logprob=[by_answer.get(a, -np.inf) for a in table.extracted])
        i = select(table, selector)
        return bool(table.loc[i, "correct"]) if i is not None else False

    by_q = lambda probe: [g for _, g in records[records.probe == probe].groupby("question_id")]  # noqa: E731
    temperature = summary.temperature["selectors"]
    for name in ("majority", "weighted_majority", "confidence", "self_verification"):
        hits = [picks_correct(g, name, "verify:temperature") for g in by_q("temperature")]
        assert temperature[name]["accuracy"] == pytest.approx(np.mean(hits)), name
    for cell in summary.cells.values():
        space = cell["space"]
        assert set(cell["selectors"]) == {"majority", "weighted_majority", "confidence", "self_verification", *SEARCH_SELECTORS}
        for name, value in cell["selectors"].items():
            if name in SEARCH_SELECTORS:
                probe, selector = SEARCH_SELECTORS[name]
                hits = [picks_correct(g, selector, "") for g in by_q(f"{space}:{probe}")]
            else:
                hits = [picks_correct(g, name, f"verify:{space}:random") for g in by_q(f"{space}:random")]
            assert value["accuracy"] == pytest.approx(np.mean(hits)), (space, name)


def test_random_matched_draws_at_the_searches_distances(routed_run):
    """Each search's matched control draws from that search's own distance profile of
    the chunk (not a pool of all three), the search is compared with its own control,
    and the cell's route_cells row reports each method's mean distance."""
    lm, _, cfg, summary, records = routed_run
    cells = RunDir(records.attrs["run"]).read_table("route_cells")
    for space_name in cfg.spaces:
        space = make_space(space_name, lm.n_layers)
        edits = {m: [space.edits(route_of(i)) for i in records[records.probe == f"{space_name}:{m}"].intervention]
                 for m in probe_methods(cfg)}
        for m in STRUCTURED:
            assert set(edits[matched_control(m)]) <= set(edits[m]), m
        row = cells[cells.space == space_name].set_index("method")
        for m in probe_methods(cfg):
            assert row.loc[m, "edits_mean"] == pytest.approx(np.mean(edits[m]))
        cell = next(c for c in summary.cells.values() if c["space"] == space_name)
        for m in STRUCTURED:
            assert row.loc[m, "matched_control"] == cell["matched_minus_structured"][m]["baseline"] == matched_control(m)
            assert cell["matched_minus_structured"][m]["value"] == pytest.approx(
                cell["oracle_at_k"][matched_control(m)] - cell["oracle_at_k"][m])
    # the distance profiles behind the figure: every evaluated route counted once
    distances = RunDir(records.attrs["run"]).read_table("route_distances")
    for space_name in cfg.spaces:
        for m in probe_methods(cfg):
            mine = distances[(distances.space == space_name) & (distances.method == m)]
            assert mine.routes.sum() == (records.probe == f"{space_name}:{m}").sum()


def test_no_two_questions_share_a_random_route_list(routed_run):
    """A fresh draw per question: random's and each matched control's route lists differ
    between any two questions (the tiny spaces hold far more than K routes)."""
    _, task, cfg, _, records = routed_run
    for space_name in cfg.spaces:
        for m in ("random", *(matched_control(s) for s in STRUCTURED)):
            sub = records[records.probe == f"{space_name}:{m}"].sort_values("candidate")
            lists = [tuple(g.intervention.iloc[1:]) for _, g in sub.groupby("question_id")]
            assert len(set(lists)) == len(lists) == len(task), (space_name, m)


def test_genetic_and_random_share_no_route_beyond_the_full_path():
    """Independent seed streams per method: over many questions in a large space,
    genetic search's routes (its first generation is drawn at random too) and random's
    have only the full path in common, and so do a search's questions without a hit."""
    from types import SimpleNamespace

    from rnr_interp.analyses.routing.run import audit_searches

    spaces = {"native": make_space("native", 30)}
    questions = [SimpleNamespace(id=f"q{i}") for i in range(12)]
    searches = audit_searches(spaces, ("random", "genetic", "mcts"))
    searches = {label: Search(s.space, s.method, lambda q, row: 0.0, s.options) for label, s in searches.items()
                if label in ("native:random", "native:genetic", "native:mcts")}
    found = run_searches(FakeRoutes(), questions, searches, 16, 0)
    full = tuple(range(30))
    for q in questions:
        routes = {m: {r for r, _ in found[f"native:{m}"][q.id]} for m in ("random", "genetic", "mcts")}
        assert routes["random"] & routes["genetic"] == {full}
    # no reward anywhere: each question's searches still draw their own routes
    for m in ("random", "genetic", "mcts"):
        lists = [tuple(r for r, _ in found[f"native:{m}"][q.id]) for q in questions]
        assert len(set(lists)) == len(questions), m


def test_every_method_spends_exactly_k_distinct_routes_batched_and_sequential():
    """Through the audit's own search list and lockstep: per method (random_matched
    included) and question, exactly K distinct route evaluations, whatever the round
    size; the evaluator generates each (question, route) pair once."""
    from types import SimpleNamespace

    from rnr_interp.analyses.routing.run import audit_searches, matched_searches

    spaces = {"native": make_space("native", 8)}
    questions = [SimpleNamespace(id="q"), SimpleNamespace(id="p")]
    methods = ("random", "random_matched", "mcts", "hill_climb", "genetic")
    k = 12
    for proposals in (None, 1, 4):
        fake = FakeRoutes()
        searches = audit_searches(spaces, methods, proposals)
        searches = {label: Search(s.space, s.method, blind_reward, s.options) for label, s in searches.items()}
        found = run_searches(fake, questions, searches, k, 0)
        found |= run_searches(fake, questions, matched_searches(spaces, methods, found), k, 0)
        assert set(found) == {f"native:{m}" for m in (*methods[:1], *methods[2:], *BLIND_SEARCHES,
                                                      *(matched_control(s) for s in STRUCTURED))}
        for label, per_q in found.items():
            for q in questions:
                routes = [r for r, _ in per_q[q.id]]
                assert len(routes) == len(set(routes)) == k, (proposals, label)
        assert fake.n_evaluated == len({(q, r) for per_q in found.values() for q, pairs in per_q.items() for r, _ in pairs})
        sizes = {s.options.get("batch_size") for s in searches.values() if s.method in ("mcts", "hill_climb", "genetic")}
        assert sizes == ({1, 8} if proposals is None else {proposals})


class FakeRoutes:
    """A route evaluator without a model: question "q" answers "B" with per-token
    probability 0.9 on any route that repeats one of layers 0-3, and "A" with
    probability 0.2 otherwise (the full path included). Counts evaluations."""

    def __init__(self):
        self.cache, self.n_evaluated = {}, 0

    def __call__(self, requests):
        for key in requests:
            if key not in self.cache:
                self.n_evaluated += 1
                route = key[1]
                b = any(route.count(layer) > 1 for layer in range(4))
                self.cache[key] = {"question_id": key[0], "extracted": "B" if b else "A", "correct": b,
                                   "logprob": float(np.log(0.9 if b else 0.2)) * 3, "n_tokens": 3}
        return [self.cache[key] for key in requests]


def test_search_selectors_pick_their_best_route_against_the_majority():
    """Random routes mostly answer "A", so majority picks "A"; every blind search, with
    the same budget, climbs the confidence reward to a "B" route and answers "B"."""
    import pandas as pd
    from types import SimpleNamespace

    space, k = make_space("native", 8), 24
    q = SimpleNamespace(id="q")
    fake = FakeRoutes()
    rand = run_searches(fake, [q], {"random": Search(space, "random", blind_reward)}, k, 0)["random"]["q"]
    table = pd.DataFrame([row for _, row in rand])
    assert table.extracted.iloc[select(table, "majority")] == "A"
    for name, method in BLIND_SEARCHES.items():
        before = fake.n_evaluated
        found = run_searches(fake, [q], {name: Search(space, method, blind_reward)}, k, 0)[name]["q"]
        assert len(found) == len({r for r, _ in found}) == k, name  # exactly K distinct route evaluations
        assert fake.n_evaluated - before <= k  # routes another method tried cost nothing again
        pick = pd.DataFrame([row for _, row in found])
        assert pick.extracted.iloc[select(pick, "confidence")] == "B", name


def test_one_lockstep_serves_every_search_in_each_round():
    """All searches of a chunk wait on one lockstep: each round's batch holds routes of
    every search still running, so the rounds are those of the longest search, not
    their sum, and each search finds what it finds when run alone."""
    from types import SimpleNamespace

    class Rounds(FakeRoutes):
        def __init__(self):
            super().__init__()
            self.rounds = 0

        def __call__(self, requests):
            self.rounds += 1
            return super().__call__(requests)

    space, k = make_space("native", 8), 12
    questions = [SimpleNamespace(id="q"), SimpleNamespace(id="p")]
    searches = {m: Search(space, m, blind_reward) for m in ("random", "mcts", "hill_climb", "genetic")}
    joint = Rounds()
    heard: list[int] = []
    together = run_searches(joint, questions, searches, k, 0, on_evaluated=heard.append)
    # the progress callback hears of every evaluation once, as rounds return
    assert sum(heard) == sum(len(pairs) for per_q in together.values() for pairs in per_q.values())
    assert len(heard) > len(searches) * len(questions)  # in steps, not once at the end
    rounds = {}
    for label, search in searches.items():
        alone = Rounds()
        found = run_searches(alone, questions, {label: search}, k, 0)[label]
        rounds[label] = alone.rounds
        for q in questions:
            assert [r for r, _ in found[q.id]] == [r for r, _ in together[label][q.id]], label
    assert joint.rounds == max(rounds.values()) < sum(rounds.values())


def test_selector_picks_grade_abstentions_wrong():
    import pandas as pd
    g = pd.DataFrame({"question_id": ["q"] * 2, "extracted": [None, None], "correct": [False, False],
                      "logprob": [-1.0, -2.0], "n_tokens": [2, 2]})
    blind = {name: [g] for name in BLIND_SEARCHES}
    picks = _picks_correct(_selector_choices([g], blind, {"q": {}}), [g], blind)
    assert set(picks) == {"majority", "weighted_majority", "confidence", "self_verification", *SEARCH_SELECTORS}
    assert all(not v.any() for v in picks.values())


def test_searches_in_one_lockstep_equal_each_search_on_one_question_alone():
    lm = load_model("tiny-llama:6")
    task = load_task("arithmetic", n=4)
    space = make_space("native", lm.n_layers)
    gold = lambda q, row: float(row["correct"] or row["extracted"] is not None)  # a reward with some signal
    searches = {m: Search(space, m, gold) for m in ("mcts", "hill_climb")}
    together = run_searches(RouteEvaluator(lm, task, Decoding(max_new_tokens=8)), task.questions, searches, 5, 0)
    for q in task.questions:
        for label, search in searches.items():
            alone = run_searches(RouteEvaluator(lm, task, Decoding(max_new_tokens=8)), [q], {label: search}, 5, 0)[label]
            assert [r for r, _ in alone[q.id]] == [r for r, _ in together[label][q.id]]
            assert [row["text"] for _, row in alone[q.id]] == [row["text"] for _, row in together[label][q.id]]


def test_lockstep_surfaces_search_errors():
    ls = Lockstep(lambda reqs: [0.0] * len(reqs))

    def bad():
        ls.evaluate_for("q")([(0, 1)])
        raise RuntimeError("search broke")

    with pytest.raises(RuntimeError, match="search broke"):
        ls.run([bad, lambda: ls.evaluate_for("p")([(0,)])])


def test_format_collapse_is_flagged_and_excluded(tmp_path):
    """The threshold decides: above it the cell is listed as excluded and left out of
    the aggregate; the unparsed rate judged is the full path's (the deployed answers),
    which every method shares, not random's own routes', read under the run's grading."""
    from rnr_interp.grading import graded_answers

    lm = load_model("tiny-llama:6")
    task = load_task("arithmetic", n=2)
    for collapse, excluded in ((-1.0, True), (1.0, False)):
        out = tmp_path / str(collapse)
        s = run_route_audit(lm, task, out, RouteConfig(samples=3, budget=3, methods=("random",), collapse=collapse), progress=False)
        [cell] = s.cells.values()
        records = RunDir(out).read_records()
        answers = graded_answers(records[records.probe == "deployed"], task, RunDir(out).grading)
        assert cell["unparsed_rate"] == pytest.approx(np.mean([a is None for a in answers]))
        assert s.exclusion["parse"] == RunDir(out).grading
        assert cell["excluded"] is excluded
        assert s.excluded_cells == (list(s.cells) if excluded else [])
        assert np.isnan(s.oracle_at_k["random"]) == excluded


@pytest.mark.parametrize("spec", ["tiny-llama:6", "tiny-qwen2:6", "tiny-gpt2:6", "tiny-gemma:6", "tiny-olmo2:6", "tiny-gemma3:6"])
def test_prefix_reuse_equals_running_the_route_from_scratch(spec):
    from rnr_interp.engine.generate import _replay_args, forward, generate, left_pad, new_cache, prompt_states
    from rnr_interp.interventions import shared_prefix
    from rnr_interp.engine.batch import replaying
    from rnr_interp.interventions import Route, applied

    lm = load_model(spec)
    prompts = [lm.encode(lm.render(p)) for p in ["hello 12+3", "what is 7*8 exactly?", "a"]]
    states = prompt_states(lm, prompts)  # prefilled in a batch of 3, reused in a batch of 2
    ids, mask = left_pad(prompts[1:], lm.tokenizer.pad_token_id)
    for path in [(0, 1, 2, 2, 3, 4, 5), (0, 1, 3, 4, 5), (0, 1, 2, 3, 4, 5, 5)]:
        p = shared_prefix(path)
        with torch.inference_mode(), applied(lm, [Route(path)]):
            scratch = forward(lm, ids, mask, new_cache())[0]
            cache = new_cache()
            with replaying(lm, *_replay_args(states[1:], p, ids.shape[1]), cache):
                reused = forward(lm, ids, mask, cache)[0]
        real = mask.bool()
        assert torch.allclose(reused[real], scratch[real], atol=1e-5), path
        dec = Decoding(max_new_tokens=8)
        a = generate(lm, prompts[1:], n=2, decoding=dec, interventions=[Route(path)], reuse=states[1:])
        b = generate(lm, prompts[1:], n=2, decoding=dec, interventions=[Route(path)])
        assert [[g.tokens for g in r] for r in a] == [[g.tokens for g in r] for r in b]


def test_rows_with_their_own_routes_replay_their_own_prefixes(monkeypatch):
    """Rows with different routes in one batch: each replays the blocks before its own
    route departs from the full path (rows grouped by that prefix, caches joined), and
    generates what it generates without any reuse."""
    import rnr_interp.engine.generate as engine
    from rnr_interp.engine.generate import generate, prompt_states
    from rnr_interp.interventions import Route

    lm = load_model("tiny-llama:6")
    prompts = [lm.encode(lm.render(p)) for p in ["hello 12+3", "what is 7*8 exactly?", "a", "b c"]]
    routes = [[Route((0, 1, 2, 2, 3, 4, 5))], [Route((0, 1, 3, 4, 5))], [Route((0, 1, 2, 3, 4, 4, 5))], []]
    replayed = []
    original = engine.replaying
    monkeypatch.setattr(engine, "replaying", lambda lm_, resid, keys, *a: replayed.append(len(keys)) or original(lm_, resid, keys, *a))
    dec = Decoding(temperature=1.0, max_new_tokens=8)
    seeds = [[b * 10 + j for j in range(2)] for b in range(len(prompts))]
    a = generate(lm, prompts, n=2, decoding=dec, seeds=seeds, interventions=routes, reuse=prompt_states(lm, prompts))
    # The schedule (0 1 2 2 3 4 4 5) departs from the full path at its position 3, so no
    # row replays more than 3; the route that skips block 2 replays 2.
    assert sorted(replayed) == [2, 3]
    b = generate(lm, prompts, n=2, decoding=dec, seeds=seeds, interventions=routes)
    assert [[g.tokens for g in r] for r in a] == [[g.tokens for g in r] for r in b]


def test_prefix_reuse_really_replays_the_stored_states():
    """Corrupting the stored residual changes the output: the replay path is taken."""
    from rnr_interp.engine.generate import generate, prompt_states
    from rnr_interp.interventions import Route

    lm = load_model("tiny-llama:6")
    prompts = [lm.encode(lm.render("what is 7*8?"))]
    states = prompt_states(lm, prompts)
    states[0].resid_pre = states[0].resid_pre * -3.0
    path = (0, 1, 2, 2, 3, 4, 5)
    a = generate(lm, prompts, decoding=Decoding(max_new_tokens=8), interventions=[Route(path)], reuse=states)
    b = generate(lm, prompts, decoding=Decoding(max_new_tokens=8), interventions=[Route(path)])
    assert a[0][0].logprob != b[0][0].logprob


@pytest.mark.slow
def test_smollm2_route_pipeline_end_to_end(smollm2, tmp_path):
    """Random vs the three searches, every selector, on the real model: records, summary
    and figures are written; the claim is measured, not asserted either way."""
    from rnr_interp.report.figures import routing_figures
    from rnr_interp.report.html import write_report

    task = load_task("arithmetic", n=3)
    # collapse=1.0: keep the cell whatever its parse rate, so every figure has data.
    s = run_route_audit(smollm2, task, tmp_path, RouteConfig(samples=4, budget=4, spaces=("skiponly",), collapse=1.0), progress=False)
    records = RunDir(tmp_path).read_records()
    methods = {"random", "mcts", "hill_climb", "genetic", *(matched_control(m) for m in STRUCTURED)}
    for m in methods:
        assert (records.probe == f"skiponly:{m}").sum() == 4 * len(task)
    [cell] = s.cells.values()
    assert set(cell["oracle_at_k"]) == methods
    assert {"majority", "weighted_majority", "confidence", "self_verification", *SEARCH_SELECTORS} == set(cell["selectors"])
    names = [name for name, _ in routing_figures(RunDir(tmp_path), "smollm2")]
    assert names[:2] == ["route_curves", "route_cell_difference"] and "route_distances" in names
    # Gap recovery is undefined (NaN) when the oracle equals greedy; then no selector figure.
    sel = RunDir(tmp_path).read_table("selectors")
    assert ("selector_recovery" in names) == bool(sel.gap_recovery.notna().any())
    assert write_report(tmp_path).is_file()


@pytest.mark.parametrize("reuse", [True, False])
def test_rows_on_different_routes_equal_one_route_per_batch(reuse):
    """Rows on different routes (skips, in-place repeats, a repeated block, a skipped
    first layer) in one batch generate what each route generates in a batch of its
    own, and take fewer batches."""
    lm = load_model("tiny-llama:6")
    task = load_task("arithmetic", n=3)
    routes = [tuple(range(6)), (0, 1, 3, 4, 5), (0, 2, 3, 5), (1, 2, 3, 4, 5),
              (0, 1, 2, 2, 3, 4, 5), (0, 1, 2, 3, 1, 2, 3, 4, 5), (0, 1, 1, 2, 4, 4, 5)]
    requests = [(q.id, r) for q in task.questions for r in routes]
    per_route = RouteEvaluator(lm, task, Decoding(max_new_tokens=8), batch_size=1, reuse_prefix=reuse)
    for req in requests:
        per_route([req])
    mixed = RouteEvaluator(lm, task, Decoding(max_new_tokens=8), batch_size=8, reuse_prefix=reuse)
    rows = mixed(requests)
    assert mixed.n_generated == len(requests) and per_route.n_batches == len(requests)
    assert mixed.n_batches < len(requests) / 2
    for req, row in zip(requests, rows):
        ref = per_route.cache[req]
        assert (row["text"], row["intervention"]) == (ref["text"], ref["intervention"])
        assert row["logprob"] == pytest.approx(ref["logprob"], abs=1e-4)


def test_route_schedule_holds_every_route_once_per_repeat():
    from rnr_interp.interventions import route_schedule

    routes = [(0, 1, 2, 3, 4), (0, 2, 3, 4), (0, 1, 1, 2, 3, 4), (0, 1, 2, 3, 2, 3, 4), (1, 2, 3)]
    schedule, slots = route_schedule(routes)
    # the full path with each distinct repeated block inserted once
    assert schedule == (0, 1, 1, 2, 3, 2, 3, 4)
    for route, pos in zip(routes, slots):
        assert tuple(schedule[i] for i in pos) == route and list(pos) == sorted(set(pos))
    assert route_schedule([(3, 1)] * 2) == ((3, 1), [(0, 1), (0, 1)])
    # merging one route at a time into the schedule so far (how batches are grown) gives
    # the schedule of all of them at once (what a batch runs)
    grown = routes[0]
    for route in routes[1:]:
        grown = route_schedule([grown, route])[0]
    assert grown == schedule


def test_a_batch_schedule_stays_within_max_depth():
    lm = load_model("tiny-llama:6")
    task = load_task("arithmetic", n=2)
    ev = RouteEvaluator(lm, task, Decoding(max_new_tokens=2), batch_size=16)
    ev.max_depth = 7
    pairs = [("q", (0, 1, 1, 2, 3, 4, 5)), ("q", (0, 1, 2, 3, 3, 4, 5)), ("q", (0, 1, 2, 3, 4, 5, 5))]
    # two repeats make a schedule of 8 > 7: each route alone
    assert [len(g) for g in ev._groups(pairs)] == [1, 1, 1]
    ev.max_depth = 8
    assert [len(g) for g in ev._groups(pairs)] == [2, 1]


def test_a_run_stopped_mid_chunk_resumes_from_its_journal(routed_run, tmp_path, monkeypatch):
    """A route run killed inside a chunk keeps the chunk's samples and evaluations in the
    run's journal; resumed, it generates only what was missing, writes the records an
    uninterrupted run writes, and leaves no journal behind."""
    import rnr_interp.analyses.routing.run as audit
    import rnr_interp.engine.rows as row_runner

    lm, task, cfg, summary, records = routed_run
    assert len(task.questions) > cfg.batch_size, "needs a second chunk"
    original, calls = row_runner.generate, []

    def dies_on_the_third_batch(*a, **kw):
        calls.append(len(a[1]))
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return original(*a, **kw)

    monkeypatch.setattr(row_runner, "generate", dies_on_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        run_route_audit(lm, task, tmp_path, cfg, progress=False)
    journal = RunDir(tmp_path).journal.read()
    assert RunDir(tmp_path).parts() == []
    assert sum("samples" in e for e in journal) == 1
    assert sum("route" in e for e in journal) == sum(calls[:2]) > 0

    resampled, generated = [], []
    original_sample = audit.sample_questions
    monkeypatch.setattr(audit, "sample_questions", lambda *a, **kw: resampled.append([q.id for q in a[2]]) or original_sample(*a, **kw))
    monkeypatch.setattr(row_runner, "generate", lambda *a, **kw: generated.append(len(a[1])) or original(*a, **kw))
    resumed = run_route_audit(lm, task, tmp_path, cfg, progress=False)
    # the first chunk's samples came back from the journal; the second chunk sampled
    assert resampled == [[q.id for q in task.questions[cfg.batch_size:]]]
    # every (question, route) pair is generated once in all, the journal's not again
    routes = records[records.intervention.str.startswith("route:")]
    n_pairs = len(set(zip(routes.question_id, routes.intervention)))
    assert sum(generated) == n_pairs - sum(calls[:2])
    assert not RunDir(tmp_path).journal.path.exists()
    key = ["question_id", "probe", "candidate", "intervention"]
    a, b = (df.sort_values(key).reset_index(drop=True) for df in (RunDir(tmp_path).read_records(), records))
    same = ["question_id", "probe", "candidate", "intervention", "text", "extracted", "correct", "n_tokens", "finish"]
    pd.testing.assert_frame_equal(a[same], b[same])
    assert np.allclose(a["logprob"], b["logprob"], atol=1e-5)
    assert resumed.oracle_at_k == summary.oracle_at_k


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_summary_so_far_is_the_summary_of_a_run_over_the_chunks_written(routed_run, tmp_path):
    """`summarize_so_far` on a run stopped after its first chunk reports what a finished
    run over those questions alone reports, and leaves the stopped run as it was."""
    import shutil

    from rnr_interp.analyses.routing.summary import summarize_so_far

    lm, task, cfg, _, _ = routed_run
    stopped = tmp_path / "stopped"
    shutil.copytree(RunDir(routed_run[4].attrs["run"]).path, stopped)
    parts = RunDir(stopped).parts()
    assert len(parts) == 2, "needs a run of two chunks"
    parts[-1].unlink()
    (stopped / "summary.json").unlink()
    before = _files(stopped)

    so_far = summarize_so_far(RunDir(stopped), tmp_path / "snap")
    assert _files(stopped) == before
    assert so_far.snapshot == {"of": str(stopped.resolve()), "questions_done": cfg.batch_size, "questions_total": len(task)}

    first = load_task("arithmetic", n=cfg.batch_size)
    alone = run_route_audit(lm, first, tmp_path / "alone", cfg, progress=False)
    assert so_far.n_questions == alone.n_questions == cfg.batch_size
    for key in ("deployed", "oracle_at_k", "cells", "temperature", "selectors", "excluded_cells"):
        assert json.dumps(getattr(so_far, key), sort_keys=True) == json.dumps(getattr(alone, key), sort_keys=True), key  # NaN == NaN
    snap = RunDir(tmp_path / "snap")
    assert comparable(snap.config) == comparable(RunDir(stopped).config)  # each names its own task.json
    assert json.dumps(snap.read_summary().to_json(), sort_keys=True) == json.dumps(so_far.to_json(), sort_keys=True)
    pd.testing.assert_frame_equal(snap.read_records(), RunDir(stopped).read_records())
    pd.testing.assert_frame_equal(snap.read_table("route_cells"), RunDir(tmp_path / "alone").read_table("route_cells"))


def test_a_summary_so_far_refuses_what_it_cannot_summarise(routed_run, tmp_path):
    import shutil

    from rnr_interp.records import RunFolderError
    from rnr_interp.analyses.routing.summary import summarize_so_far

    lm, task, _, _, records = routed_run
    run = RunDir(records.attrs["run"])
    with pytest.raises(FileExistsError, match="already a run folder"):
        summarize_so_far(run, run.path)
    empty = tmp_path / "empty"
    shutil.copytree(run.path, empty)
    for part in RunDir(empty).parts():
        part.unlink()
    with pytest.raises(RunFolderError, match="no chunk written yet"):
        summarize_so_far(RunDir(empty), tmp_path / "c")
    assert not any((tmp_path / name).exists() for name in "abc")


def test_route_batches_hold_the_rows_of_the_device(monkeypatch, tmp_path):
    """Rows per route batch are the device's (`route_rows`: 64 on a CPU, more on a GPU,
    where rows are nearly free), never fewer than the chunk's questions."""
    import types

    import rnr_interp.analyses.routing.config as config
    import rnr_interp.analyses.routing.run as audit
    import rnr_interp.engine.rows as row_runner

    lm = load_model("tiny-llama:6")
    assert config.route_rows(lm) == config.ROUTE_ROWS
    assert config.route_rows(types.SimpleNamespace(device=torch.device("cuda", 0))) == config.GPU_ROUTE_ROWS > config.ROUTE_ROWS
    sizes, original = [], row_runner.generate
    monkeypatch.setattr(row_runner, "generate", lambda *a, **kw: sizes.append(len(a[1])) or original(*a, **kw))
    monkeypatch.setattr(audit, "route_rows", lambda lm_: 5)
    run_route_audit(lm, load_task("arithmetic", n=3), tmp_path / "a", RouteConfig(samples=4, budget=4, batch_size=2), progress=False)
    assert max(sizes) == 5
    sizes.clear()
    monkeypatch.setattr(audit, "route_rows", lambda lm_: 1)
    run_route_audit(lm, load_task("arithmetic", n=3), tmp_path / "b", RouteConfig(samples=4, budget=4, batch_size=2), progress=False)
    assert max(sizes) == 2


def test_each_route_method_is_read_against_its_own_chance_null(routed_run, tmp_path):
    """Beside every method's oracle@K, the null of the same candidates graded against
    another question's gold. Planted: one method's candidates name every *other*
    question's gold and never its own, so its oracle is 0 and its null is 1 under any
    derangement; the other methods' nulls are `grading.derangement_null` of their records."""
    from rnr_interp.analyses.routing.summary import summarize_routes
    from rnr_interp.grading import derangement_null, graded

    _, task, cfg, _, records = routed_run
    golds = [q.answer for q in task.questions]
    assert len(set(golds)) == len(golds)
    planted = records.copy()
    rows = planted.index[planted.probe == "native:random"]
    order = {q.id: i for i, q in enumerate(task.questions)}
    for idx in rows:
        i, j = order[planted.at[idx, "question_id"]], int(planted.at[idx, "candidate"])
        other = golds[(i + 1 + j % (len(golds) - 1)) % len(golds)]
        planted.loc[idx, ["text", "extracted", "finish"]] = [f"Answer: {other}", other, "stop"]
        planted.loc[idx, ["correct", "correct_flexible", "correct_strict"]] = False
    run = RunDir(records.attrs["run"])
    run.read_records = lambda: planted
    import shutil

    target = RunDir(shutil.copytree(run.path, tmp_path / "target"))
    summary = summarize_routes(run, cfg, task=task, target=target)

    assert isinstance(summary, RouteSummary) and summary.null is not None  # the typed summary, as written
    cell = next(c for c in summary.cells.values() if c["space"] == "native")
    assert cell["oracle_at_k"]["random"] == 0.0
    assert cell["null"]["random"]["O_K"] == 1.0
    assert cell["null"]["random"]["O_K_minus_null"] == -1.0
    assert cell["null"]["random"]["O_K_minus_null_ci"][1] < 0
    for c in summary.cells.values():
        assert set(c["null"]) == set(c["oracle_at_k"])
        for m, null in c["null"].items():
            label = f"{c['space']}:{m}"
            _, o_null = derangement_null(graded(planted, run.grading), task, label, run.grading, seed=cfg.seed)
            assert null["O_K"] == pytest.approx(o_null.mean())
            assert null["O_K_minus_null"] == pytest.approx(c["oracle_at_k"][m] - o_null.mean())
    table = target.read_table("route_cells")
    native = table[(table.space == "native") & (table.method == "random")].iloc[0]
    assert native["null_oracle"] == 1.0 and native["oracle_minus_null"] == -1.0


def _route_candidates(correct_by_question: list[list[bool]], routes_by_question: list[list[str]]) -> list[pd.DataFrame]:
    """Candidates of a random method: per question the full path first, then its routes."""
    return [pd.DataFrame({"intervention": ["route:full", *routes], "correct": [False, *hits]})
            for hits, routes in zip(correct_by_question, routes_by_question)]


def test_the_two_way_interval_widens_only_where_the_route_draw_matters():
    """Planted: 20 questions share one list of 8 routes (the old design). Where one
    route alone solves half the questions, the route draw is a source of variance the
    question bootstrap misses: the two-way interval is wider. Where every question is
    solved by all routes or by none, removing a route changes nothing: equal."""
    from rnr_interp.analyses.routing.summary import route_jackknife_variance, two_way_ci

    routes = [[f"route:r{j}" for j in range(8)]] * 20
    lucky = _route_candidates([[j == 3 and i < 10 for j in range(8)] for i in range(20)], routes)
    o = np.array([g.correct.any() for g in lucky], dtype=float)
    wide = two_way_ci(o, route_jackknife_variance(lucky))
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(wide["ci_two_way"]) > 1.3 * width(wide["ci_questions"]) and wide["route_share"] > 0.4
    flat = _route_candidates([[i < 10] * 8 for i in range(20)], routes)
    o = np.array([g.correct.any() for g in flat], dtype=float)
    same = two_way_ci(o, route_jackknife_variance(flat))
    assert route_jackknife_variance(flat) == 0.0 and same["ci_two_way"] == same["ci_questions"]
    assert same["ci_questions"][0] < 0.5 < same["ci_questions"][1]


def test_a_zero_oracle_is_never_above_chance(routed_run, tmp_path):
    """A method that reaches nothing is never above its chance null, whatever the
    rounding of its bootstrap bound: a bound of 8.17e-18 (the committed GSM8K cell's)
    is zero, not above it."""
    import shutil

    from rnr_interp.analyses.routing.config import above_chance
    from rnr_interp.analyses.routing.summary import summarize_routes

    assert not above_chance(8.17e-18) and not above_chance(0.0) and above_chance(0.01)
    _, task, cfg, _, records = routed_run
    planted = records.copy()
    planted.loc[planted.probe == "native:mcts", ["correct", "correct_flexible", "correct_strict"]] = False
    run = RunDir(records.attrs["run"])
    run.read_records = lambda: planted
    target = RunDir(shutil.copytree(run.path, tmp_path / "target"))
    summary = summarize_routes(run, cfg, task=task, target=target)
    cell = next(c for c in summary.cells.values() if c["space"] == "native")
    assert cell["oracle_at_k"]["mcts"] == 0.0 and cell["null"]["mcts"]["above_chance"] is False
    table = target.read_table("route_cells").set_index(["space", "method"])
    assert not table.loc[("native", "mcts"), "above_chance"]


def test_the_exclusion_rule_reads_the_runs_grading(routed_run):
    """Under strict grading the full path's unparsed share is read by the strict parse
    (an answer not stated in the declared format is none), never above the flexible one."""
    from rnr_interp.analyses.routing.summary import full_path_unparsed

    _, task, cfg, _, records = routed_run
    qids = [q.id for q in task.questions]
    flexible, parse = full_path_unparsed(records, qids, task, "flexible")
    strict, strict_parse = full_path_unparsed(records, qids, task, "strict")
    assert (parse, strict_parse) == ("flexible", "strict") and strict >= flexible
    planted = records.copy()
    full = planted.probe == "deployed"
    planted.loc[full, ["text", "extracted"]] = ["the answer might be 7", "7"]
    assert full_path_unparsed(planted, qids, task, "flexible")[0] == 0.0
    assert full_path_unparsed(planted, qids, task, "strict")[0] == 1.0
    assert full_path_unparsed(planted, qids, None, "strict") == (0.0, "flexible")


class _EchoTask(Task):
    """Graded right when the reply, stripped, is the gold text: the gold can then be
    what a chosen route of the model says, so a route that gives it back is known."""

    name = "echo"
    max_new_tokens = 4

    def extract(self, generation):
        return generation.strip() or None


def _planted_layer_task(lm, gold_route, n: int = 8) -> "_EchoTask":
    """Questions whose gold is the model's greedy reply on `gold_route`, kept where the
    replies differ between questions (so another question's gold is a wrong answer)."""
    import dataclasses

    from rnr_interp.analyses.routing.config import route_decoding
    from rnr_interp.engine.rows import Row, generate_rows
    from rnr_interp.interventions import Route

    base = load_task("arithmetic", n=n)
    echo = _EchoTask(base.questions, source="test")
    gens = generate_rows(lm, echo, [Row(q, (Route(gold_route),)) for q in base.questions], route_decoding(echo))
    seen, questions = set(), []
    for q, g in zip(base.questions, gens):
        if (answer := echo.extract(g.text)) is not None and answer not in seen:
            seen.add(answer)
            questions.append(dataclasses.replace(q, answer=answer))
    return _EchoTask(questions, source="test")


def test_route_layers_name_a_planted_layer_and_nothing_where_nothing_is_planted(tmp_path):
    """Planted: layer 3 of a tiny model damaged (its MLP output x25), each question's gold
    the model's reply with layer 3 skipped, i.e. what removing the damage gives back.
    The route summary's top layer in skip-only is the skip of layer 3, above chance, and
    the question table's best routes skip it. Null: the undamaged model with each
    question's gold the full path's reply to another question: no layer is above chance."""
    from rnr_interp.analyses.routing.layers import route_of

    planted_layer, n_layers = 3, 6
    lm = load_model(f"tiny-llama:{n_layers}")
    skip = tuple(i for i in range(n_layers) if i != planted_layer)
    cfg = RouteConfig(samples=2, budget=8, spaces=("skiponly",), methods=("random", "hill_climb"), collapse=1.0,
                      batch_size=8)
    null_task = _planted_layer_task(lm, tuple(range(n_layers)))
    golds = [q.answer for q in null_task.questions]
    shifted = golds[1:] + golds[:1]
    null_task = _EchoTask([dataclasses.replace(q, answer=a) for q, a in zip(null_task.questions, shifted)], source="test")
    with torch.no_grad():
        lm.hf_model.model.layers[planted_layer].mlp.down_proj.weight.mul_(25.0)
    task = _planted_layer_task(lm, skip)
    assert len(task) >= 5, "too few distinct replies to plant on"

    s = run_route_audit(lm, task, tmp_path / "planted", cfg, progress=False)
    top = s.layers["skiponly"]["top"]
    assert (top["layer"], top["action"], top["above_chance"]) == (planted_layer, "skip", True)
    assert top["gain"] > 0.5 and top["null_gain"] < top["gain_ci"][0]
    table = RunDir(tmp_path / "planted").read_table("route_layers")
    assert set(table.columns) >= {"space", "layer", "action", "gain", "gain_ci_low", "gain_ci_high", "null_gain"}
    assert len(table) == 2 * n_layers and set(table.action) == {"skip", "repeat"}
    others = table[(table.layer != planted_layer) | (table.action != "skip")]
    assert not others.above_chance.any() and (others.gain < top["gain"]).all()
    best = RunDir(tmp_path / "planted").read_table("route_questions")
    assert len(best) and all(planted_layer not in route_of(r) for r in best.route)
    # the report: the heatmap, the ranked gains and the best routes in the question table
    from rnr_interp.report.figures import routing_figures
    from rnr_interp.report.html import build_page

    figs = dict(routing_figures(RunDir(tmp_path / "planted"), "planted"))
    heat = figs["route_layers"].data[0]
    assert list(heat.y) == ["skip", "repeat"] and "*" in heat.text[0][planted_layer]
    page, _ = build_page(RunDir(tmp_path / "planted"))
    assert f"skip {planted_layer}" in page and "best routes (fewest edits)" in page and f"skips {planted_layer}" in page

    s = run_route_audit(load_model(f"tiny-llama:{n_layers}"), null_task, tmp_path / "null", cfg, progress=False)
    assert not any(entry["above_chance"] for entry in s.layers["skiponly"]["ranked"])
    assert not RunDir(tmp_path / "null").read_table("route_layers").above_chance.any()
