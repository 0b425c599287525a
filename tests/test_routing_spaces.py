"""Route spaces: every route they produce is in the space and its bounds; membership
rejects what the spaces exclude; the polar form round-trips."""

import itertools

import numpy as np
import pytest

from rnr_interp.analyses.routing.spaces import SPACES, STOP, Edit, RouteSpace, make_space, polar_decode, polar_encode


def in_bounds(space: RouteSpace, route) -> bool:
    return space.contains(route) and space.min_len <= len(route) <= space.max_len


@pytest.mark.parametrize("n_layers", [4, 8, 12, 30])
@pytest.mark.parametrize("name", SPACES)
def test_every_move_stays_in_space(name, n_layers):
    space = make_space(name, n_layers)
    rng = np.random.default_rng(n_layers)
    routes = [space.sample(rng) for _ in range(500)]
    for route, other in zip(routes, routes[1:] + routes[:1]):
        assert in_bounds(space, route), route
        assert polar_decode(*polar_encode(route, n_layers)) == route
        near = space.neighborhood(route)
        assert route not in near and len(set(near)) == len(near)
        assert all(in_bounds(space, r) for r in near)
        assert space.neighbors(route, rng) in near
        assert all(in_bounds(space, space.apply(route, a)) for a in space.actions(route))
        assert in_bounds(space, space.crossover(route, other, rng))
    if name == "skiponly":
        assert all(list(r) == sorted(set(r)) for r in routes)  # no repeats, in order


@pytest.mark.parametrize("name", SPACES)
def test_enumeration_matches_membership(name):
    """iter_routes lists exactly the routes `contains` accepts (brute force, L <= 4)."""
    for n_layers in (1, 2, 3, 4):
        space = make_space(name, n_layers)
        listed = list(space.iter_routes())
        assert len(listed) == len(set(listed))
        brute = {
            r
            for n in range(space.min_len, space.max_len + 1)
            for r in itertools.product(range(n_layers), repeat=n)
            if space.contains(r)
        }
        assert set(listed) == brute


def test_default_bounds():
    assert make_space("native", 12) == RouteSpace("native", 12, 8, 16)
    assert make_space("polar", 30) == RouteSpace("polar", 30, 20, 40)
    assert make_space("skiponly", 12) == RouteSpace("skiponly", 12, 8, 12)
    assert make_space("native", 12, min_len=6, max_len=20).max_len == 20
    for bad in (dict(min_len=13), dict(max_len=11), dict(max_len=25), dict(min_len=0)):
        with pytest.raises(ValueError):
            make_space("native", 12, **bad)
    with pytest.raises(ValueError):
        make_space("skiponly", 12, max_len=13)
    with pytest.raises(ValueError):
        make_space("teleport", 12)


def test_native_examples():
    space = make_space("native", 12)
    full = tuple(range(12))
    assert space.contains(full)
    assert space.contains(full[:3] + full[4:])  # skip one layer
    assert space.contains(full[:2] + full[6:])  # skip four
    assert not space.contains(full[:6] + (3, 4, 5) + full[6:])  # a block of 3 repeated: polar only
    assert make_space("polar", 12).contains(full[:6] + (3, 4, 5) + full[6:])
    assert space.contains((0, 1, 1, 2, 2) + full[3:])  # two adjacent single repeats
    assert space.contains((0, 1, 3, 4, 4) + full[5:])  # skip, then repeat
    assert not space.contains(full[:3] + (2, 2) + full[3:])  # layer 2 used three times
    assert not space.contains((0, 2, 1) + full[3:])  # out of order
    assert not space.contains((0, 1, 3, 1, 3) + full[4:])  # repeated block with a hole
    assert not space.contains((0, 1, 2, 3, 1, 2) + full[4:])  # a copy runs up to the layer it follows
    assert not space.contains(full[:7] + (2, 3, 4, 5, 6) + full[7:])  # block of 5
    assert not space.contains(full[:7])  # too short
    assert not space.contains(full + tuple(range(12)))  # too long
    assert not space.contains(full[:11] + (12,))  # no layer 12
    assert not space.contains([0.5] + list(full[1:]))


def test_native_edits():
    space = make_space("native", 8)
    full = space.full_path
    assert space.apply(full, Edit(3, 4, 0)) == (0, 1, 2, 4, 5, 6, 7)
    assert space.apply(full, Edit(2, 3, 2)) == (0, 1, 2, 2, 3, 4, 5, 6, 7)
    with pytest.raises(ValueError):
        space.apply(full, Edit(2, 4, 2))  # a block repeat is a polar edit
    assert space.apply(full, STOP) == full
    actions = space.actions(full)
    assert Edit(2, 4, 0) in actions and Edit(5, 6, 2) in actions
    assert Edit(2, 4, 2) not in actions
    assert Edit(0, 3, 0) not in actions  # length 5 < min_len 6
    # A repeated layer is neither skipped nor repeated again.
    repeated = space.apply(full, Edit(3, 4, 2))
    assert all(not (a.start <= 3 < a.stop) for a in space.actions(repeated))
    # Local moves can undo: unroll the block, restore a skipped layer.
    assert full in space.neighborhood(repeated)
    assert full in space.neighborhood(space.apply(full, Edit(3, 4, 0)))


def test_skiponly_has_no_repeats():
    space = make_space("skiponly", 8)
    full = space.full_path
    assert space.contains((0, 1, 3, 4, 6, 7))
    assert not space.contains((0, 1, 2, 2, 3, 4, 5, 6, 7))
    assert all(a.action == 0 and a.stop == a.start + 1 for a in space.actions(full))
    # Tree actions skip left to right: after skipping 4, only 5..7 can follow.
    assert [a.start for a in space.actions((0, 1, 2, 3, 5, 6, 7))] == [5, 6, 7]
    # Local moves flip one layer: restore 4 (the full path) or skip one more.
    assert sorted(map(len, space.neighborhood((0, 1, 2, 3, 5, 6, 7)))) == [6] * 7 + [8]


def test_skiponly_tree_reaches_every_route():
    space = make_space("skiponly", 7)
    frontier, reached = [space.full_path], {space.full_path}
    while frontier:
        route = frontier.pop()
        for action in space.actions(route):
            child = space.apply(route, action)
            assert child not in reached  # one path per route: the tree has no transpositions
            reached.add(child)
            frontier.append(child)
    assert reached == set(space.iter_routes())


def test_polar_canonical_form():
    full = tuple(range(8))
    assert polar_encode(full, 8) == (((0, 4), (4, 8)), (1, 1))
    route = (0, 1, 3, 4, 5, 3, 4, 5, 6, 7)  # skip 2, repeat 3..5
    segments, actions = polar_encode(route, 8)
    assert segments == ((0, 2), (2, 3), (3, 6), (6, 8)) and actions == (1, 0, 2, 1)
    # A non-canonical segmentation of the same route decodes alike and re-encodes canonically.
    split = ((0, 1), (1, 2), (2, 3), (3, 6), (6, 7), (7, 8))
    assert polar_decode(split, (1, 1, 0, 2, 1, 1)) == route
    # Adjacent repeated segments stay apart: merging them would change the route.
    assert polar_encode((0, 0, 1, 1, 2, 3), 4) == (((0, 1), (1, 2), (2, 4)), (2, 2, 1))
    with pytest.raises(ValueError):
        polar_encode((0, 2, 1, 3), 4)
    with pytest.raises(ValueError):
        polar_decode(((0, 5),), (1,))  # a segment of 5
    with pytest.raises(ValueError):
        polar_decode(((0, 2), (3, 4)), (1, 1))  # a gap
    with pytest.raises(ValueError):
        polar_decode(((0, 2),), (3,))


def test_polar_round_trip_exhaustive():
    for n_layers in (5, 6):
        for route in make_space("polar", n_layers).iter_routes():
            segments, actions = polar_encode(route, n_layers)
            assert polar_decode(segments, actions) == route
            assert polar_encode(polar_decode(segments, actions), n_layers) == (segments, actions)


def test_spaces_are_strictly_nested_distinct_sets():
    skiponly, native, polar = (set(make_space(name, 6, min_len=4, max_len=8 if name != "skiponly" else 6).iter_routes())
                               for name in ("skiponly", "native", "polar"))
    assert skiponly < native < polar
    assert (0, 1, 1, 2, 3, 4, 5) in native - skiponly  # a layer repeated in place
    assert (0, 1, 2, 1, 2, 3, 4, 5) in polar - native  # a block of two repeated


def test_spaces_generate_different_route_sets():
    """What the random probe draws differs by space, not only what each allows: skips
    only; single layers repeated in place; blocks of layers repeated."""
    drawn = {}
    for name in SPACES:
        space, rng = make_space(name, 30), np.random.default_rng(0)
        drawn[name] = [space.sample(rng) for _ in range(200)]
    assert all(len(set(r)) == len(r) for r in drawn["skiponly"])
    assert any(len(set(r)) < len(r) for r in drawn["native"])
    assert not any(_block_repeat(r) for r in drawn["native"])
    assert sum(map(_block_repeat, drawn["polar"])) > 50
    assert len({frozenset(routes) for routes in drawn.values()}) == 3


def _block_repeat(route) -> bool:
    """A step back in the route: a block of two or more layers run again (polar only;
    a native repeat runs the same layer twice in a row)."""
    return any(b < a for a, b in zip(route, route[1:]))


def test_polar_tree_goes_left_to_right():
    space = make_space("polar", 12)
    route = space.apply(space.full_path, Edit(4, 6, 2))
    assert min(a.start for a in space.actions(route)) == 6


def test_sampling_is_seeded():
    for name in SPACES:
        space = make_space(name, 12)
        a = [space.sample(np.random.default_rng(7)) for _ in range(3)]
        b = [space.sample(np.random.default_rng(7)) for _ in range(3)]
        assert a == b


def test_crossover_falls_back_to_a_parent():
    space = make_space("native", 8, min_len=8, max_len=8)
    a = (0, 1, 2, 3, 4, 5, 6, 6)  # skip 7, repeat 6
    b = (1, 1, 2, 3, 4, 5, 6, 7)  # skip 0, repeat 1
    rng = np.random.default_rng(0)
    children = {space.crossover(a, b, rng) for _ in range(50)}
    # Cutting inside keeps neither edit (the full path); cutting at 1 or 7 keeps both
    # repeats or both skips, out of bounds, so the first parent comes back.
    assert children == {a, space.full_path}


@pytest.mark.parametrize("name", SPACES)
def test_sample_at_draws_a_route_exactly_that_many_edits_away(name):
    space = make_space(name, 12)
    rng = np.random.default_rng(0)
    assert space.sample_at(0, rng) == space.full_path and space.edits(space.full_path) == 0
    most = 12 - space.min_len if name == "skiponly" else 8
    for edits in range(1, most + 1):
        for _ in range(5):
            route = space.sample_at(edits, rng)
            assert route in space and space.edits(route) == edits, (name, edits, route)
    assert make_space("skiponly", 12).sample_at(5, rng) is None  # at most 4 layers may go
    if name != "skiponly":  # repeat layer 1, skip layer 3
        assert space.edits((0, 1, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11)) == 2
    assert "lengths" in space.sampler and space.sampler.startswith(f"lengths {space.min_len}..{space.max_len}")
