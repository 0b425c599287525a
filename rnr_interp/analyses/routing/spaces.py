"""Route spaces: which block orders a search may try, and how it moves between them.

A route is a tuple of block indices run in order; the full path is `tuple(range(L))`.
Every route this module knows is the full path with some layers skipped and some
contiguous blocks of 1-4 layers run twice, the second copy right after the first
(`[0, 1, 2, 3, 1, 2, 3, 4, ...]` repeats block 1..3). Inside, a route is held as a
*plan*: one code per layer,

    SKIP (0)   the layer is not run
    ONCE (1)   the layer runs once
    TWICE (2)  the layer opens a repeated block; TWICE_CONT (3) continues it

so a plan reads like a polar action vector (0 skip, 1 run, 2 repeat) whose repeated
layers also say where each block starts. Plans and routes are in one-to-one
correspondence (`_parse` / `_route`), and every edit is "make layers [start, stop)
one segment with polar action a" (`Edit`), so the three spaces below share all the
machinery and differ in which plan codes they allow, which edits they propose and
how they sample. As sets, skiponly < native < polar (strictly, for L >= 2):

native     the model's own layers as the unit: each layer is skipped, run once or run
           twice in place (`..., 4, 4, ...`); skips are proposed 1-4 contiguous layers
           at a time, repeats one layer at a time. No block of two or more layers is
           ever repeated.
polar      after the PoLar/CoLa path space: the model cut into segments of 1-4
           consecutive layers, each skipped (0), run (1) or run twice as a block (2),
           so `[..., 1, 2, 3, 1, 2, 3, ...]` is a polar route and not a native one.
           Sampling draws a segmentation and an action vector, a local move re-labels
           any 1-4 layers, and tree actions go left to right.
skiponly   any subset of layers removed; no repeats.

Length bounds (defaults; pass min_len / max_len to override): with slack = L // 3,
native and polar allow lengths L - slack .. L + slack, skiponly L - slack .. L (a
third of the depth may go, e.g. 8..16 for L = 12, 20..40 for L = 30). Every space
contains the full path, so min_len <= L <= max_len is required.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np

#: a route as data: block indices in run order (applied as the intervention `interventions.Route`)
LayerPath = tuple[int, ...]
Plan = tuple[int, ...]

SKIP, ONCE, TWICE, TWICE_CONT = 0, 1, 2, 3
_RUNS = (0, 1, 2, 2)  # how many times each code runs its layer
MAX_SEGMENT = 4  # the longest skip or repeat edit, and the longest polar segment

STOP = "stop"  # the MCTS action that ends a route; `actions()` never lists it


class Edit(NamedTuple):
    """Make layers [start, stop) one segment with polar action 0 (skip), 1 (run once)
    or 2 (run twice, as one repeated block)."""

    start: int
    stop: int
    action: int


Action = Edit | str  # an Edit, or STOP


# -- plans <-> routes ------------------------------------------------------


def _segment_codes(n: int, action: int) -> list[int]:
    if action == TWICE:
        return [TWICE] + [TWICE_CONT] * (n - 1)
    return [action] * n


def _route(plan: Plan) -> LayerPath:
    """The block order a plan runs: a repeated block's copy follows its last layer."""
    out: list[int] = []
    block: list[int] = []
    for layer, code in enumerate(plan):
        if code != TWICE_CONT and block:
            out.extend(block)
            block = []
        if code == SKIP:
            continue
        out.append(layer)
        if code in (TWICE, TWICE_CONT):
            block.append(layer)
    out.extend(block)
    return tuple(out)


@lru_cache(maxsize=1 << 16)
def _parse(route: LayerPath, n_layers: int) -> Plan | None:
    """The plan that runs `route`, or None when no plan does (a layer out of range,
    used three times, out of order other than by a repeat, or a repeat longer than
    MAX_SEGMENT)."""
    plan = [SKIP] * n_layers
    last = -1  # the deepest layer run so far
    i = 0
    while i < len(route):
        layer = route[i]
        if not 0 <= layer < n_layers:
            return None
        if layer > last:  # moving forward; layers jumped over stay SKIP
            plan[layer] = ONCE
            last = layer
            i += 1
            continue
        # A step back must be the copy of block [layer, last], all of it run once so far.
        n = last - layer + 1
        if n > MAX_SEGMENT or route[i : i + n] != tuple(range(layer, last + 1)):
            return None
        if any(plan[j] != ONCE for j in range(layer, last + 1)):
            return None
        plan[layer : last + 1] = _segment_codes(n, TWICE)
        i += n
    return tuple(plan)


def _length(plan: Plan) -> int:
    return sum(_RUNS[c] for c in plan)


def _apply(plan: Plan, edit: Edit) -> Plan:
    new = list(plan)
    new[edit.start : edit.stop] = _segment_codes(edit.stop - edit.start, edit.action)
    # A repeated block cut on its right keeps its tail as a block of its own.
    if edit.stop < len(new) and new[edit.stop] == TWICE_CONT:
        new[edit.stop] = TWICE
    return tuple(new)


def _length_after(plan: Plan, length: int, edit: Edit) -> int:
    """`_length(_apply(plan, edit))` without building the plan (a cut block keeps its
    run count, so only the edited range changes)."""
    before = sum(_RUNS[c] for c in plan[edit.start : edit.stop])
    return length - before + (edit.stop - edit.start) * _RUNS[edit.action]


# -- the polar view ----------------------------------------------------------

Segments = tuple[tuple[int, int], ...]


def polar_encode(route: Sequence[int], n_layers: int) -> tuple[Segments, tuple[int, ...]]:
    """Canonical polar form of a route: half-open layer ranges and their actions.

    Canonical means: each repeated block is one segment (action 2); runs of skipped or
    run-once layers are merged greedily left to right into segments of at most
    MAX_SEGMENT layers (six run-once layers -> one segment of 4, one of 2). Length
    bounds are not checked here. Raises ValueError for a route no plan runs.
    """
    plan = _parse(tuple(route), n_layers)
    if plan is None:
        raise ValueError(f"route {tuple(route)} is not a skip/repeat route of {n_layers} layers")
    segments, actions = [], []
    start = 0
    while start < n_layers:
        code = plan[start]
        stop = start + 1
        if code == TWICE:
            while stop < n_layers and plan[stop] == TWICE_CONT:
                stop += 1
        else:
            while stop < n_layers and stop - start < MAX_SEGMENT and plan[stop] == code:
                stop += 1
        segments.append((start, stop))
        actions.append(code)
        start = stop
    return tuple(segments), tuple(actions)


def polar_decode(segments: Sequence[tuple[int, int]], actions: Sequence[int]) -> LayerPath:
    """The route of a segmentation (contiguous half-open ranges from layer 0, each of
    1-4 layers) and one action per segment; canonical or not."""
    if len(segments) != len(actions):
        raise ValueError("one action per segment")
    plan: list[int] = []
    for (start, stop), action in zip(segments, actions):
        if start != len(plan) or not 1 <= stop - start <= MAX_SEGMENT:
            raise ValueError(f"segment {(start, stop)}: segments must tile 0..L in 1-{MAX_SEGMENT} layers")
        if action not in (SKIP, ONCE, TWICE):
            raise ValueError(f"action {action}: must be 0, 1 or 2")
        plan.extend(_segment_codes(stop - start, action))
    return _route(tuple(plan))


# -- what each space proposes ----------------------------------------------


def _ranges(plan: Plan, first: int = 0, code: int | None = None) -> Iterator[tuple[int, int]]:
    """Ranges [start, stop) of 1..MAX_SEGMENT layers starting at `first` or later whose
    layers all have `code` (any code when None)."""
    for start in range(first, len(plan)):
        for stop in range(start + 1, min(start + MAX_SEGMENT, len(plan)) + 1):
            if code is not None and plan[stop - 1] != code:
                break
            yield start, stop


def _blocks(plan: Plan) -> Iterator[tuple[int, int]]:
    for start, code in enumerate(plan):
        if code == TWICE:
            stop = start + 1
            while stop < len(plan) and plan[stop] == TWICE_CONT:
                stop += 1
            yield start, stop


def _first_untouched(plan: Plan) -> int:
    """One past the deepest layer not run exactly once: where left-to-right edits resume."""
    return max((i + 1 for i, c in enumerate(plan) if c != ONCE), default=0)


def _grow_edits(plan: Plan, first: int = 0) -> Iterator[Edit]:
    """Skip or repeat (as one block) 1-4 layers that still run once."""
    for start, stop in _ranges(plan, first, ONCE):
        yield Edit(start, stop, SKIP)
        yield Edit(start, stop, TWICE)


def _native_grow(plan: Plan) -> Iterator[Edit]:
    """Skip 1-4 layers that still run once, or repeat one of them in place."""
    for start, stop in _ranges(plan, 0, ONCE):
        yield Edit(start, stop, SKIP)
        if stop == start + 1:
            yield Edit(start, stop, TWICE)


def _native_local(plan: Plan) -> Iterator[Edit]:
    """A native edit or the undoing of one: restore 1-4 skipped layers, unroll a repeat."""
    yield from _native_grow(plan)
    for start, stop in _ranges(plan, code=SKIP):
        yield Edit(start, stop, ONCE)
    for start, stop in _blocks(plan):
        yield Edit(start, stop, ONCE)


def _polar_tree(plan: Plan) -> Iterator[Edit]:
    # Left to right, so a route has (almost) one path in the tree: the only freedom
    # left is how a long skipped run is chunked.
    return _grow_edits(plan, first=_first_untouched(plan))


def _polar_local(plan: Plan) -> Iterator[Edit]:
    for start, stop in _ranges(plan):
        for action in (SKIP, ONCE, TWICE):
            yield Edit(start, stop, action)


def _skip_tree(plan: Plan) -> Iterator[Edit]:
    # Skips in increasing layer order: every subset has exactly one path in the tree.
    for layer in range(_first_untouched(plan), len(plan)):
        yield Edit(layer, layer + 1, SKIP)


def _skip_local(plan: Plan) -> Iterator[Edit]:
    for layer, code in enumerate(plan):
        yield Edit(layer, layer + 1, ONCE if code == SKIP else SKIP)


def _sample_native(space: RouteSpace, rng: np.random.Generator) -> Plan:
    """Uniform over edit sequences: k ~ U{1..max(1, L // 4)} edits from the full path,
    each uniform among the native edits that keep the route in bounds (skip 1-4
    contiguous layers still run once, or repeat one such layer in place; fewer edits if
    none is left)."""
    plan = space.full_plan
    for _ in range(int(rng.integers(1, max(1, space.n_layers // 4) + 1))):
        moves = [_apply(plan, e) for e in space._fitting(plan, _native_grow(plan))]
        if not moves:
            break
        plan = moves[int(rng.integers(len(moves)))]
    return plan


def _sample_polar(space: RouteSpace, rng: np.random.Generator) -> Plan:
    """Uniform over action vectors: segment lengths drawn left to right uniformly from
    1..min(4, layers left), one action per segment uniform in {0 skip, 1 run once, 2 run
    twice as a block}; draws out of bounds are rejected (the all-1 vector is always in
    bounds, so this ends)."""
    L = space.n_layers
    for _ in range(100_000):
        plan: list[int] = []
        while len(plan) < L:
            n = int(rng.integers(1, min(MAX_SEGMENT, L - len(plan)) + 1))
            plan.extend(_segment_codes(n, int(rng.integers(3))))
        if space.min_len <= _length(plan) <= space.max_len:
            return tuple(plan)
    raise RuntimeError(f"{space}: polar sampling keeps leaving the length bounds")


def _sample_skiponly(space: RouteSpace, rng: np.random.Generator) -> Plan:
    """Uniform over the number of skipped layers (1..L - min_len), then uniform over
    which layers."""
    most = space.n_layers - space.min_len
    if most == 0:
        return space.full_plan
    plan = list(space.full_plan)
    for layer in rng.choice(space.n_layers, size=int(rng.integers(1, most + 1)), replace=False):
        plan[layer] = SKIP
    return tuple(plan)


class _Kind(NamedTuple):
    codes: tuple[int, ...]  # allowed plan codes, in enumeration order
    tree: Callable[[Plan], Iterator[Edit]]  # MCTS actions (before bounds)
    local: Callable[[Plan], Iterator[Edit]]  # neighbourhood moves (before bounds)
    sample: Callable[["RouteSpace", np.random.Generator], Plan]


_KINDS: dict[str, _Kind] = {
    "native": _Kind((ONCE, SKIP, TWICE), _native_grow, _native_local, _sample_native),
    "polar": _Kind((ONCE, SKIP, TWICE, TWICE_CONT), _polar_tree, _polar_local, _sample_polar),
    "skiponly": _Kind((ONCE, SKIP), _skip_tree, _skip_local, _sample_skiponly),
}
SPACES = tuple(_KINDS)


def default_bounds(name: str, n_layers: int) -> tuple[int, int]:
    slack = n_layers // 3
    return n_layers - slack, n_layers + (0 if name == "skiponly" else slack)


# -- the space -------------------------------------------------------------


@dataclass(frozen=True)
class RouteSpace:
    """A set of routes over `n_layers` blocks with min_len <= len(route) <= max_len.

    sample(rng)          a route from the space's generative process (see _sample_*)
    neighbors(route, rng) one local move, uniform over the distinct routes it reaches
    actions(route)       the edits an MCTS node may expand (STOP is the tree's own)
    apply(route, action) the route an action leads to
    crossover(a, b, rng) one-point crossover of plans; a parent when out of bounds
    """

    name: str
    n_layers: int
    min_len: int
    max_len: int

    def __post_init__(self) -> None:
        if self.name not in _KINDS:
            raise ValueError(f"unknown route space {self.name!r}; one of {SPACES}")
        if self.n_layers < 1:
            raise ValueError("n_layers must be >= 1")
        longest = self.n_layers * max(_RUNS[c] for c in self._kind.codes)
        if not 1 <= self.min_len <= self.n_layers <= self.max_len <= longest:
            raise ValueError(
                f"{self.name}: need 1 <= min_len <= {self.n_layers} <= max_len <= {longest},"
                f" got min_len={self.min_len}, max_len={self.max_len}"
            )

    @property
    def _kind(self) -> _Kind:
        return _KINDS[self.name]

    @property
    def full_path(self) -> LayerPath:
        return tuple(range(self.n_layers))

    @property
    def full_plan(self) -> Plan:
        return (ONCE,) * self.n_layers

    # -- membership ---------------------------------------------------------
    def plan(self, route: Sequence[int]) -> Plan | None:
        """The route's plan, or None when the route is not in this space."""
        try:
            route = tuple(operator.index(v) for v in route)  # ints, numpy ints; not 0.5
        except TypeError:
            return None
        plan = _parse(route, self.n_layers)
        if plan is None or not set(plan) <= set(self._kind.codes):
            return None
        if not self.min_len <= len(route) <= self.max_len:
            return None
        return plan

    def contains(self, route: Sequence[int]) -> bool:
        return self.plan(route) is not None

    def __contains__(self, route: Sequence[int]) -> bool:
        return self.contains(route)

    def _plan_of(self, route: Sequence[int]) -> Plan:
        plan = self.plan(route)
        if plan is None:
            raise ValueError(f"route {tuple(route)} is not in {self}")
        return plan

    def _fitting(self, plan: Plan, edits: Iterator[Edit]) -> Iterator[Edit]:
        """The edits whose result stays within the length bounds."""
        length = _length(plan)
        for edit in edits:
            if self.min_len <= _length_after(plan, length, edit) <= self.max_len:
                yield edit

    # -- moves ---------------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> LayerPath:
        return _route(self._kind.sample(self, rng))

    @property
    def sampler(self) -> str:
        """What `sample` draws, in words (its docstring, with the bounds): the random
        baseline's distribution, recorded in a route run's manifest."""
        return f"lengths {self.min_len}..{self.max_len}; " + " ".join((self._kind.sample.__doc__ or "").split())

    def neighborhood(self, route: Sequence[int]) -> list[LayerPath]:
        """Every distinct route one local move away (never the route itself), in a
        fixed order."""
        plan = self._plan_of(route)
        found: dict[Plan, None] = {}
        for edit in self._fitting(plan, self._kind.local(plan)):
            new = _apply(plan, edit)
            if new != plan:
                found[new] = None
        return [_route(p) for p in found]

    def neighbors(self, route: Sequence[int], rng: np.random.Generator) -> LayerPath:
        """One random local move; the route itself only when no move stays in bounds."""
        near = self.neighborhood(route)
        return near[int(rng.integers(len(near)))] if near else tuple(route)

    def actions(self, route: Sequence[int]) -> list[Edit]:
        """Tree actions: native, a skip of 1-4 layers still run once or a repeat of one;
        polar, a skip or block repeat of 1-4 such layers, only right of the last edited layer; skiponly, one more layer skipped,
        right of the last skipped one. All keep the route in bounds. The tree starts at
        the full path; intermediate routes must be in bounds too, so a route reachable
        only through an out-of-bounds one is not in the (polar) tree."""
        plan = self._plan_of(route)
        return list(self._fitting(plan, self._kind.tree(plan)))

    def apply(self, route: Sequence[int], action: Action) -> LayerPath:
        if action == STOP:
            return tuple(route)
        new = _route(_apply(self._plan_of(route), action))
        if not self.contains(new):
            raise ValueError(f"{action} takes {tuple(route)} out of {self}")
        return new

    def crossover(self, a: Sequence[int], b: Sequence[int], rng: np.random.Generator) -> LayerPath:
        """Layers before a random cut from `a`, the rest from `b`; a block of `b` cut in
        two keeps its tail as a block. Falls back to `a` when out of bounds."""
        plan_a, plan_b = self._plan_of(a), self._plan_of(b)
        if self.n_layers < 2:
            return tuple(a)
        cut = int(rng.integers(1, self.n_layers))
        child = plan_a[:cut] + plan_b[cut:]
        if child[cut] == TWICE_CONT:
            child = child[:cut] + (TWICE,) + child[cut + 1 :]
        route = _route(child)
        return route if self.min_len <= len(route) <= self.max_len else tuple(a)

    # -- distance from the full path --------------------------------------------
    def edits(self, route: Sequence[int]) -> int:
        """How far `route` is from the full path: the number of layers not run exactly
        once (skipped or run twice). A skip of 3 layers counts 3, a repeated block of 2
        counts 2; the full path counts 0. It is the Hamming distance between the route's
        plan and the full path's, and equals the Levenshtein distance between the two
        block sequences when no skip sits beside a repeat."""
        return sum(code != ONCE for code in self._plan_of(route))

    def sample_at(self, edits: int, rng: np.random.Generator, tries: int = 64) -> LayerPath | None:
        """A route `edits` layers away from the full path (`edits`), or None when a few
        walks find none: a random walk from the full path, each step an edit that only
        changes layers still run once (the space's own kinds: native skips of 1-4 layers
        or a repeat of one; polar skips or block repeats of 1-4; skiponly one skip),
        uniform among those that keep the route in bounds and do not pass `edits`,
        stopped when the route is exactly `edits` away. Which route of that distance
        comes out follows the walk, not a uniform draw over the routes at that distance."""
        if edits == 0:
            return self.full_path
        grow = {"native": _native_grow, "polar": _grow_edits, "skiponly": _skip_local}[self.name]
        for _ in range(tries):
            plan, changed = self.full_plan, 0
            while changed < edits:
                moves = [e for e in self._fitting(plan, grow(plan))
                         if plan[e.start] == ONCE and changed + (e.stop - e.start) <= edits]
                if not moves:
                    break
                edit = moves[int(rng.integers(len(moves)))]
                plan, changed = _apply(plan, edit), changed + edit.stop - edit.start
            if changed == edits:
                return _route(plan)
        return None

    # -- enumeration -----------------------------------------------------------
    def _next_codes(self, position: int, length: int, block: int) -> Iterator[tuple[int, int, int]]:
        """The plan codes layer `position` may take after a plan of route length
        `length` whose repeated block so far is `block` layers long, in enumeration
        order, each with the length and open block after it: the one rule `iter_routes`
        walks and `space_size` counts."""
        codes = self._kind.codes
        most = max(_RUNS[c] for c in codes)
        left = self.n_layers - position - 1
        for code in codes:
            if code == TWICE_CONT and not 0 < block < MAX_SEGMENT:
                continue
            new = length + _RUNS[code]
            if new > self.max_len or new + most * left < self.min_len:
                continue
            yield code, new, block + 1 if code == TWICE_CONT else int(code == TWICE)

    def iter_routes(self) -> Iterator[LayerPath]:
        """Every route of the space, depth first with run-once layers first (so routes
        near the full path come early). Exponential in L: exhaust it only for small L;
        taking the first few items is cheap for any L."""
        plan: list[int] = []

        def extend(length: int, block: int) -> Iterator[LayerPath]:
            if len(plan) == self.n_layers:
                yield _route(tuple(plan))
                return
            for code, new, open_block in self._next_codes(len(plan), length, block):
                plan.append(code)
                yield from extend(new, open_block)
                plan.pop()

        yield from extend(0, 0)


def space_size(space: RouteSpace) -> int:
    """How many routes `space` holds: `iter_routes` counted without enumerating it (by
    position, length so far and open block), so it is quick for any L."""

    @lru_cache(maxsize=None)
    def count(position: int, length: int, block: int) -> int:
        if position == space.n_layers:
            return 1
        return sum(count(position + 1, new, open_block) for _, new, open_block in space._next_codes(position, length, block))

    return count(0, 0, 0)


def make_space(name: str, n_layers: int, *, min_len: int | None = None, max_len: int | None = None) -> RouteSpace:
    """A route space with the default bounds (see module doc) unless given."""
    lo, hi = default_bounds(name, n_layers) if name in _KINDS else (1, n_layers)
    return RouteSpace(name, n_layers, lo if min_len is None else min_len, hi if max_len is None else max_len)
