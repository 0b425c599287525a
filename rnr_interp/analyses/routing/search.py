"""Route search for one question, under a budget of distinct route evaluations.

ORACLE. These searches maximise whatever the caller's `evaluate` returns; in the audit
that is correctness against the gold answer, so a route they find shows what the model
can *reach*, not what it would answer. (The answer-blind searches "mcts_blind",
"hill_climb_blind", "genetic_blind", whose routes the vote and confidence selectors
pick from, are these same searches run with `selectors.search_reward`, the model's
confidence in its own output, in place of the gold reward.) `random` and
`random_matched` draw their routes without looking at any reward.

Rounds: the adaptive searches take `batch_size`, the routes they propose per round
(one callback batch); 1 is the sequential search. The budget is the same whatever it is.

Budget: one unit is one distinct route sent to `evaluate`. The full path is always the
first evaluation, for every method; a route proposed again is answered from the cache
and costs nothing; a search stops exactly at its budget, or earlier only when every
route of the space has been evaluated (then `n_evaluations` says how many there were).
`evaluate(routes) -> scores` is called with batches of new routes (never empty, never
a route twice over the whole search); rewards in [0, 1] suit the MCTS constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from .spaces import STOP, Action, LayerPath, RouteSpace

EvaluateFn = Callable[[list[LayerPath]], Sequence[float]]

_SAMPLE_TRIES = 64  # random draws for an unseen route before enumerating the space


class BudgetExceeded(RuntimeError):
    """A search asked for more new routes than its budget has left (a bug in the search)."""


class Evaluator:
    """The caller's `evaluate` behind a cache and a hard budget of distinct routes."""

    def __init__(self, space: RouteSpace, evaluate: EvaluateFn, budget: int):
        if budget < 1:
            raise ValueError("budget must be >= 1 (the full path is always evaluated)")
        self.space, self.budget = space, budget
        self._evaluate = evaluate
        self.scores: dict[LayerPath, float] = {}  # insertion order is evaluation order
        self.n_calls = 0

    @property
    def remaining(self) -> int:
        return self.budget - len(self.scores)

    def __contains__(self, route: LayerPath) -> bool:
        return route in self.scores

    def __call__(self, routes: Iterable[LayerPath]) -> list[float]:
        """Scores of `routes`, evaluating (in one batch) those not seen before.
        Raises BudgetExceeded when the new ones do not fit in the budget."""
        routes = [tuple(r) for r in routes]
        new = list(dict.fromkeys(r for r in routes if r not in self.scores))
        if len(new) > self.remaining:
            raise BudgetExceeded(f"{len(new)} new routes, {self.remaining} left of {self.budget}")
        for route in new:
            if route not in self.space:
                raise ValueError(f"route {route} is not in {self.space}")
        if new:
            scores = list(self._evaluate(new))
            self.n_calls += 1
            if len(scores) != len(new):
                raise ValueError(f"evaluate returned {len(scores)} scores for {len(new)} routes")
            self.scores.update(zip(new, map(float, scores)))
        return [self.scores[r] for r in routes]

    def result(self, method: str) -> SearchResult:
        evaluated = list(self.scores.items())
        # max() keeps the first of equal rewards: the earliest route found wins ties.
        best_route, best_reward = max(evaluated, key=lambda item: item[1])
        return SearchResult(method, evaluated, best_route, best_reward, len(evaluated), self.n_calls)


@dataclass(frozen=True)
class SearchResult:
    """`evaluated`: (route, callback value) in evaluation order, the full path first.
    Rewards are the callback's raw values (MCTS's length penalty stays inside its tree)."""

    method: str
    evaluated: list[tuple[LayerPath, float]] = field(repr=False)
    best_route: LayerPath
    best_reward: float
    n_evaluations: int
    n_calls: int  # how many batches went to the callback


def _begin(space: RouteSpace, evaluate: EvaluateFn, budget: int) -> tuple[Evaluator, float]:
    ev = Evaluator(space, evaluate, budget)
    return ev, ev([space.full_path])[0]


def _fresh(space: RouteSpace, ev: Evaluator, rng: np.random.Generator, taken: Iterable[LayerPath] = ()) -> LayerPath | None:
    """A route neither evaluated nor in `taken`: a random sample if one of a few draws
    is new, else the first such route of the enumeration; None once the space is spent.
    This is every search's way out of a corner it has already explored."""
    taken = set(taken)
    for _ in range(_SAMPLE_TRIES):
        route = space.sample(rng)
        if route not in ev and route not in taken:
            return route
    # Only |evaluated| + |taken| routes are excluded, so this stops early for any L.
    return next((r for r in space.iter_routes() if r not in ev and r not in taken), None)


def _fresh_batch(space: RouteSpace, ev: Evaluator, rng: np.random.Generator, n: int) -> list[LayerPath]:
    """Up to n distinct unseen routes (fewer only when the space runs out)."""
    batch: list[LayerPath] = []
    while len(batch) < n and (route := _fresh(space, ev, rng, batch)) is not None:
        batch.append(route)
    return batch


# -- random ----------------------------------------------------------------


def _sampled(space: RouteSpace, evaluate: EvaluateFn, budget: int, rng: np.random.Generator, method: str,
             draw: Callable[[], LayerPath | None], batch_size: int | None) -> SearchResult:
    """The full path, then budget - 1 distinct routes from `draw` (a route, or None for
    a miss; after _SAMPLE_TRIES misses or repeats in a row, the first unseen route of the
    enumeration, as in `_fresh`), all in one batch unless `batch_size` is given. Every
    draw is independent of the rewards."""
    ev, _ = _begin(space, evaluate, budget)
    routes: list[LayerPath] = []
    seen: set[LayerPath] = set(ev.scores)
    misses = 0
    while len(routes) < ev.remaining:
        if misses >= _SAMPLE_TRIES:
            route = next((r for r in space.iter_routes() if r not in seen), None)
            if route is None:
                break  # the space is spent
        else:
            route = draw()
        if route is None or route in seen:
            misses += 1
            continue
        routes.append(route)
        seen.add(route)
        misses = 0
    step = batch_size or max(1, len(routes))
    for i in range(0, len(routes), step):
        ev(routes[i : i + step])
    return ev.result(method)


def random_search(
    space: RouteSpace, evaluate: EvaluateFn, budget: int, rng: np.random.Generator, batch_size: int | None = None
) -> SearchResult:
    """The full path, then budget - 1 distinct samples from `space.sample` (all in one
    batch unless `batch_size` is given)."""
    return _sampled(space, evaluate, budget, rng, "random", lambda: space.sample(rng), batch_size)


def random_matched(
    space: RouteSpace,
    evaluate: EvaluateFn,
    budget: int,
    rng: np.random.Generator,
    profile: Sequence[int] = (),
    batch_size: int | None = None,
) -> SearchResult:
    """Random routes at the searches' distances: the full path, then budget - 1 distinct
    routes, each drawn by picking a distance d uniformly from `profile` (the edit
    distances, `RouteSpace.edits`, of the routes the searches being compared evaluated
    after the full path, one entry per route) and then a route d edits away
    (`RouteSpace.sample_at`). So its distribution of distances is `profile`'s, up to the
    routes being distinct; which route is drawn never depends on a reward. Without a
    profile it is `random_search`."""
    if not len(profile):
        return _sampled(space, evaluate, budget, rng, "random_matched", lambda: space.sample(rng), batch_size)
    distances = np.asarray(profile, dtype=int)
    return _sampled(space, evaluate, budget, rng, "random_matched",
                    lambda: space.sample_at(int(distances[rng.integers(len(distances))]), rng), batch_size)


# -- MCTS ------------------------------------------------------------------


@dataclass(eq=False)
class _Node:
    route: LayerPath
    untried: list[Action]  # actions not expanded yet; a STOP child is a leaf
    children: list[_Node] = field(default_factory=list)
    #: descents through the node, counted when a descent passes (a pending one is a
    #: virtual loss: it counts as a visit with reward 0 until its route is scored)
    visits: int = 0
    total: float = 0.0

    def ucb(self, parent_visits: int, c: float, low: float = 0.0, high: float = 1.0) -> float:
        """UCB1 with the mean reward rescaled from [low, high] (the rewards seen so far)
        to [0, 1], so that the exploration constant means the same whatever the spread
        of the rewards."""
        if self.visits == 0:
            return math.inf
        mean = (self.total / self.visits - low) / (high - low) if high > low else 0.0
        return mean + c * math.sqrt(math.log(parent_visits) / self.visits)


def _node(space: RouteSpace, route: LayerPath, terminal: bool = False) -> _Node:
    return _Node(route, [] if terminal else [*space.actions(route), STOP])


def _rollout(space: RouteSpace, route: LayerPath, rng: np.random.Generator, p_stop: float) -> LayerPath:
    """Random tree actions until a coin with P(stop) = p_stop says stop."""
    while rng.random() >= p_stop:
        actions = space.actions(route)
        if not actions:
            break
        route = space.apply(route, actions[int(rng.integers(len(actions)))])
    return route


def widened(visits: int, c: float, alpha: float) -> int:
    """Progressive widening: how many children a node with `visits` visits may have,
    max(1, ceil(c * visits ** alpha)). With c = 1, alpha = 0.5 the root of a search of
    budget 32 opens about 6 of its ~100 children and spends the other visits below them."""
    return max(1, math.ceil(c * visits**alpha))


def mcts(
    space: RouteSpace,
    evaluate: EvaluateFn,
    budget: int,
    rng: np.random.Generator,
    c_ucb: float = 0.25,
    length_penalty: float = 0.1,
    p_stop: float = 1.0,
    stall: int = 64,
    widening: tuple[float, float] = (1.0, 0.5),
    batch_size: int = 1,
) -> SearchResult:
    """UCB1 over `space.actions` from the full path with progressive widening; each node
    also has a STOP child (evaluate the node's own route). One descent: from the root,
    while the node already has as many children as `widened(visits, *widening)` allows,
    move to its child of highest UCB1 (mean rewards rescaled to the range seen so far);
    at a node that may widen, expand one untried action at random, roll out from the
    new child by random actions (stop with probability p_stop before each; the default
    1.0 evaluates the new child's own route, no rollout), and evaluate the final route.

    Widening is what lets a small budget search: without it the root's ~100 (native) to
    ~200 (polar) untried actions absorb every one of K = 32 evaluations, no node is ever
    selected by its reward, and the search is a sampler of routes one edit (plus a
    rollout) away. The defaults were chosen on planted landscapes at K = 32
    (tests/test_routing_search.py): rollouts and a large exploration constant each
    blur the few rewards such a budget gets.

    Tree reward = score - length_penalty * |len(route) - L| / L: with the default 0.1 and
    bounds at L +- L // 3 the penalty is at most ~0.033, so it only breaks ties between
    equally scored routes in favour of the smaller change of depth.

    Rounds: each round makes `batch_size` descents that end on distinct new routes and
    evaluates them in one batch (1: the sequential search). A descent counts its visit at
    once and its reward when the round's batch returns (virtual loss), so the descents
    of one round spread over the tree instead of repeating one path. A descent ending on
    a route already evaluated is scored from the cache at no cost; after `stall` such
    descents in a row, a fresh random route joins the round instead, so a tree that has
    explored its corner still spends its budget (or stops when the space is exhausted).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ev, _ = _begin(space, evaluate, budget)
    L = space.n_layers
    root = _node(space, space.full_path)

    def descend() -> tuple[list[_Node], LayerPath]:
        node, path = root, [root]
        while True:
            node.visits += 1  # a virtual loss until `credit` adds the reward
            if node.untried and len(node.children) < widened(node.visits - 1, *widening):
                action = node.untried.pop(int(rng.integers(len(node.untried))))
                child = _node(space, space.apply(node.route, action), terminal=action == STOP)
                child.visits += 1
                node.children.append(child)
                path.append(child)
                return path, child.route if action == STOP else _rollout(space, child.route, rng, p_stop)
            if not node.children:
                return path, node.route  # a STOP leaf re-scores its route
            parent = node
            node = max(parent.children, key=lambda ch: ch.ucb(parent.visits, c_ucb, *seen))
            path.append(node)

    seen = [math.inf, -math.inf]  # the lowest and highest tree reward credited so far

    def credit(path: list[_Node], route: LayerPath) -> None:
        reward = ev.scores[route] - length_penalty * abs(len(route) - L) / L
        seen[:] = min(seen[0], reward), max(seen[1], reward)
        for node in path:
            node.total += reward

    while ev.remaining:
        want = min(batch_size, ev.remaining)
        new: list[LayerPath] = []
        waiting: list[tuple[list[_Node], LayerPath]] = []
        idle = 0
        while len(new) < want:
            path, final = descend()
            if final in ev:
                credit(path, final)
                idle += 1
                if idle < stall:
                    continue
                route = _fresh(space, ev, rng, new)  # outside the tree
                if route is None:
                    break
                new.append(route)
            else:
                waiting.append((path, final))
                if final not in new:
                    new.append(final)
            idle = 0
        if not new:
            break
        ev(new)
        for path, final in waiting:
            credit(path, final)
    return ev.result("mcts")


# -- hill climbing -----------------------------------------------------------


def _climb_step(
    space: RouteSpace,
    ev: Evaluator,
    route: LayerPath,
    score: float,
    rng: np.random.Generator,
    batch_size: int,
    patience: int,
) -> tuple[LayerPath, float] | None:
    """A neighbour scoring above `score`, or None: none of the already-known ones and
    none of `patience` batches of unseen ones (in random order) does better. Within a
    batch the best neighbour wins (first improvement at batch granularity)."""
    near = space.neighborhood(route)
    known = [(ev.scores[r], r) for r in near if r in ev]
    if known and (best := max(known, key=lambda item: item[0]))[0] > score:
        return best[1], best[0]  # a free move: no evaluation needed
    unseen = [near[i] for i in rng.permutation(len(near)) if near[i] not in ev]
    for k in range(patience):
        batch = unseen[k * batch_size : (k + 1) * batch_size][: ev.remaining]
        if not batch:
            break
        scores = ev(batch)
        i = int(np.argmax(scores))
        if scores[i] > score:
            return batch[i], scores[i]
    return None


def hill_climb(
    space: RouteSpace,
    evaluate: EvaluateFn,
    budget: int,
    rng: np.random.Generator,
    batch_size: int = 8,
    patience: int = 4,
) -> SearchResult:
    """Stochastic hill climbing with random restarts. Starts at the full path; each step
    evaluates unseen neighbours `batch_size` at a time and moves to the best one that
    strictly improves; after `patience` batches without improvement (or with the whole
    neighbourhood known) the climb restarts from an unseen `space.sample`."""
    ev, score = _begin(space, evaluate, budget)
    route = space.full_path
    while ev.remaining:
        step = _climb_step(space, ev, route, score, rng, batch_size, patience)
        if step is not None:
            route, score = step
            continue
        if not ev.remaining or (start := _fresh(space, ev, rng)) is None:
            break
        route, score = start, ev([start])[0]
    return ev.result("hill_climb")


# -- genetic -----------------------------------------------------------------


def _tournament(pop: list[LayerPath], ev: Evaluator, rng: np.random.Generator, size: int) -> LayerPath:
    picks = rng.choice(len(pop), size=size, replace=len(pop) < size)
    return max((pop[i] for i in sorted(picks)), key=lambda r: ev.scores[r])


def _child(
    space: RouteSpace,
    ev: Evaluator,
    pop: list[LayerPath],
    taken: list[LayerPath],
    rng: np.random.Generator,
    tournament: int,
    p_crossover: float,
    p_mutation: float,
) -> LayerPath | None:
    """One new route bred from the population; when breeding keeps giving known
    routes, a few more mutations, then a fresh sample (None when the space is spent)."""
    child = _tournament(pop, ev, rng, tournament)
    if rng.random() < p_crossover:
        child = space.crossover(child, _tournament(pop, ev, rng, tournament), rng)
    if rng.random() < p_mutation:
        child = space.neighbors(child, rng)
    for _ in range(8):
        if child not in ev and child not in taken:
            return child
        child = space.neighbors(child, rng)
    return _fresh(space, ev, rng, taken)


def genetic(
    space: RouteSpace,
    evaluate: EvaluateFn,
    budget: int,
    rng: np.random.Generator,
    population: int = 8,
    tournament: int = 2,
    p_crossover: float = 0.9,
    p_mutation: float = 0.5,
    batch_size: int | None = None,
) -> SearchResult:
    """Elitist (mu + lambda) genetic search. Generation 0: the full path and
    population - 1 samples (evaluated in rounds of `batch_size`). Each round breeds `batch_size` new routes (default
    `population`: one generation a round; 1: the sequential, steady-state variant) by
    tournament selection, `space.crossover` and mutation by `space.neighbors`, evaluates
    them as one batch, and keeps the best `population` of parents and children (parents
    first on ties)."""
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ev, _ = _begin(space, evaluate, budget)
    pop = [space.full_path, *_fresh_batch(space, ev, rng, min(population - 1, ev.remaining))]
    step = batch_size or population
    for i in range(1, len(pop), step):  # generation 0, in rounds of batch_size too
        ev(pop[i : i + step])
    while ev.remaining:
        children: list[LayerPath] = []
        while len(children) < min(batch_size or population, ev.remaining):
            child = _child(space, ev, pop, children, rng, tournament, p_crossover, p_mutation)
            if child is None:
                break
            children.append(child)
        if not children:
            break
        ev(children)
        pop = sorted(pop + children, key=lambda r: -ev.scores[r])[:population]
    return ev.result("genetic")


SearchFn = Callable[..., SearchResult]
SEARCHES: dict[str, SearchFn] = {
    "random": random_search,
    "random_matched": random_matched,
    "mcts": mcts,
    "hill_climb": hill_climb,
    "genetic": genetic,
}
#: searches whose proposals depend on the rewards they get (the "structured" ones)
ADAPTIVE = ("mcts", "hill_climb", "genetic")
#: routes each adaptive search proposes per round by default: MCTS one (the sequential
#: search), hill climbing one batch of neighbours, the genetic search one generation
DEFAULT_ROUND = {"mcts": 1, "hill_climb": 8, "genetic": 8}


def round_size(method: str, proposals: int | None) -> int | None:
    """Routes `method` proposes per round: `proposals` for an adaptive search when
    given, else its default; None for the random samplers (all their routes in one
    batch, as they need no reward to choose them)."""
    if method not in ADAPTIVE:
        return None
    return DEFAULT_ROUND[method] if proposals is None else proposals
