"""The engine's side of interventions: a batch whose rows carry their own sets and
routes, kept aligned with the KV cache as rows fan out and leave.

`batch_applied` is `interventions.applied` for a generation batch: rows may take
different routes. The decoder then runs one layer list that holds every row's route
(`interventions.route_schedule`), each row passing the residual stream through the
positions its own route does not run, with its own KV-cache entry per position. With
sparse slots (`sparse_slots_pay`) each position runs its block on the rows whose route
runs it only, and its cache entry holds those rows only; `Batch.select` then cuts each
entry by its own rows. `Batch.row_prefixes` says how many leading blocks each row may
replay from a stored prefill (`replaying`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn
from transformers.cache_utils import Cache

from rnr_interp.interventions import (
    BatchRows, Intervention, Route, current_layers, first_layer, installed, layer_list, route_schedule, row_sets,
    shared_prefix,
)


class Batch:
    """The interventions in force over a generation batch: each row's set (`rows`, the
    hooks' masks) and route. `select` and `repeat_interleave` keep both, and the KV
    cache's route entries, aligned when the batch is reordered."""

    def __init__(self, rows: BatchRows, route: Route | None = None,
                 row_slots: list[tuple[int, ...]] | None = None, sparse: bool = True):
        self.rows = rows
        #: the layer list every row goes through (applied by swapping the decoder's list), or None
        self.route = route
        #: rows with routes of their own: the positions of `route` each row runs (the
        #: others pass its residual stream through); None when every row runs all of it
        self.row_slots = row_slots
        #: with row_slots: a position runs its block on its own rows only (gathered, then
        #: scattered back), and its KV-cache entry holds those rows only. Otherwise every
        #: row runs every position and the rows that skip it keep their input (`run_slot`).
        self.sparse = sparse
        self._rebuild_slots()

    def _rebuild_slots(self) -> None:
        if self.row_slots is None:
            return
        keep = torch.zeros((len(self.route.path), len(self.row_slots)), dtype=torch.bool)
        for r, slots in enumerate(self.row_slots):
            keep[list(slots), r] = True
        self._slot_keep = keep.to(self.rows.device)
        # Per position, the rows that run it (None: every row, nothing to gather).
        self._slot_rows = [None if bool(k.all()) else k.nonzero().squeeze(-1).to(self.rows.device) for k in keep]

    def select(self, index: Sequence[int] | Tensor, cache=None) -> None:
        """Keep these rows of the batch (in this order), and with `cache` (a
        `DynamicCache` of this batch) its rows too: with sparse slots each position's
        entry keeps those of its own rows that stay."""
        if cache is not None:
            self._select_cache(cache, index)
        self.rows.select(index)
        if self.row_slots is not None:
            index = index.tolist() if isinstance(index, Tensor) else [int(i) for i in index]
            self.row_slots = [self.row_slots[i] for i in index]
            self._rebuild_slots()

    def repeat_interleave(self, k: int) -> None:
        self.rows.repeat_interleave(k)
        if self.row_slots is not None:
            self.row_slots = [s for s in self.row_slots for _ in range(k)]
            self._rebuild_slots()

    def _select_cache(self, cache, index: Sequence[int] | Tensor) -> None:
        index = torch.as_tensor(index, dtype=torch.long, device=self.rows.device)
        if not self.owns_slot_rows():
            cache.batch_select_indices(index)
            return
        for slot, layer in enumerate(cache.layers):
            runs = self._slot_keep[slot]
            # Where each kept row that runs this position sits among the position's rows.
            at = (runs.cumsum(0) - 1)[index][runs[index]]
            layer.batch_select_indices(at)

    @contextlib.contextmanager
    def restricted(self, rows: Sequence[int]) -> Iterator[None]:
        """The batch is these rows only, for the body (a prefill run in groups)."""
        saved = self.row_slots
        with self.rows.restricted(rows):
            if saved is not None:
                self.row_slots = [saved[r] for r in rows]
                self._rebuild_slots()
            try:
                yield
            finally:
                if saved is not None:
                    self.row_slots = saved
                    self._rebuild_slots()

    def owns_slot_rows(self) -> bool:
        """Whether route positions hold only the rows that run them (sparse slots:
        their KV-cache entries too)."""
        return self.sparse and self.row_slots is not None

    def entry_rows(self, slot: int) -> Bool[Tensor, "batch"] | None:
        """Which batch rows the KV-cache entry of route position `slot` holds (None:
        every row; with sparse slots, the rows whose route runs it)."""
        return self._slot_keep[slot] if self.owns_slot_rows() else None

    def run_slot(self, slot: int, block: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Route position `slot`: the block's output for the rows whose route runs it,
        the unchanged residual stream for the others. Sparse: the block runs on those
        rows alone, every batch-shaped argument (the residual stream, the attention
        mask, positions, rotary tables: tensors whose first axis is the batch) cut to
        them, and the results are scattered back. Dense: every row runs it and the
        others' results are thrown away."""
        before = args[0] if args else kwargs["hidden_states"]
        rows = self._slot_rows[slot]
        if rows is None:
            return block(*args, **kwargs)
        if not self.sparse:
            out = block(*args, **kwargs)
            keep = self._slot_keep[slot].view(-1, 1, 1)
            if isinstance(out, tuple):
                return (torch.where(keep, out[0], before), *out[1:])
            return torch.where(keep, out, before)
        if rows.numel() == 0:
            _hold_length([*args, *kwargs.values()], slot, before)
            return before
        batch = before.shape[0]
        args = tuple(_batch_rows(a, rows, batch) for a in args)
        kwargs = {k: _batch_rows(v, rows, batch) for k, v in kwargs.items()}
        self.rows.running = rows
        try:
            out = block(*args, **kwargs)
        finally:
            self.rows.running = None
        if isinstance(out, tuple):
            return (before.index_copy(0, rows, out[0]), *out[1:])
        return before.index_copy(0, rows, out)

    def row_prefixes(self) -> list[int]:
        """Per row, the leading full-path blocks it runs unchanged before anything of
        its own, so its prefill may replay them from stored states (0: nothing to reuse,
        also for a row that changes nothing). Without a route: the blocks before the
        first one the row's interventions touch (`first_layer`). With one: the blocks
        before the row's route departs from the full path, and none where any row has
        another intervention, since hook masks and route slots would have to agree
        inside the replayed blocks."""
        sets = self.rows.row_sets
        if self.route is None:
            return [first_layer(specs) or 0 for specs in sets]
        if any(sets):
            return [0] * len(sets)
        n = len(self.route.path)
        slots = self.row_slots if self.row_slots is not None else [tuple(range(n))] * len(sets)
        prefixes = [min(shared_prefix(self.route.path), shared_prefix(s)) for s in slots]
        return [p if p < n else 0 for p in prefixes]


def sparse_slots_pay(lm) -> bool:
    """Whether rows on different routes should run only their own route positions
    (`Batch.sparse`) on `lm`'s device, for callers that leave the choice to it. On a
    CPU a block's cost grows with its rows: on the demo model, route batches whose rows
    passed 20-40% of their schedule's positions by generated 1.07-1.40x faster with
    sparse slots (CPU time, 5 to 32 rows; docs/performance.md). On a GPU a block costs
    about the same for 1 row or 40 and the gathers add kernel launches per position, so
    there the union schedule runs dense; that side is not measured yet. Either way the
    generations are the same."""
    return lm.device.type == "cpu"


@contextlib.contextmanager
def batch_applied(
    lm,
    rows: Sequence[Intervention] | Sequence[Sequence[Intervention]] | None = None,
    batch_size: int | None = None,
    sparse_slots: bool | None = None,
) -> Iterator[Batch]:
    """`interventions.applied` for a generation batch, whose rows may carry different
    `Route`s (a row without one runs the full path): the decoder then runs
    `route_schedule` of them, each row passing the residual stream through the positions
    its own route does not run, with its own KV-cache slot per position.
    `sparse_slots` (default: `sparse_slots_pay`): a position runs its block on the rows
    whose route runs it only, rather than on every row (`Batch.run_slot`)."""
    sets, routes, shared = row_sets(lm, rows, batch_size)
    route, row_slots = routes[0] if routes else None, None
    if len(set(routes)) > 1:
        full = tuple(range(lm.n_layers))
        schedule, row_slots = route_schedule([r.path if r is not None else full for r in routes])
        route = Route(schedule)
    sparse = sparse_slots_pay(lm) if sparse_slots is None else sparse_slots
    batch = Batch(BatchRows(sets, lm.device, shared=shared), route=route, row_slots=row_slots, sparse=sparse)
    run_slot = batch.run_slot if row_slots is not None else None
    with installed(lm, batch.rows, route.path if route is not None else None, run_slot=run_slot):
        yield batch


def _batch_rows(value: Any, rows: Tensor, batch: int) -> Any:
    """`value` cut to batch rows `rows` where it is batch-shaped (a tensor of two or
    more axes whose first is the batch; tuples item by item), else unchanged: what a
    block is called with (the residual stream, a [batch, 1, q, kv] mask, [batch, t]
    positions, rotary (cos, sin)) as opposed to what every row shares (the cache
    object, 1-D cache positions, flags)."""
    if isinstance(value, Tensor):
        return value.index_select(0, rows) if value.ndim >= 2 and value.shape[0] == batch else value
    if isinstance(value, tuple):
        return tuple(_batch_rows(v, rows, batch) for v in value)
    return value


def _hold_length(block_args: Sequence[Any], slot: int, hidden: Float[Tensor, "batch pos d"]) -> None:
    """A route position that no row of the batch runs (they left, or a prefill group has
    none) writes an entry of no rows for these positions into the KV cache among the
    block's arguments, if any: an entry must still grow with the sequence, since the
    decoder reads the cache's length (for the masks) from entry 0. Its head axes are
    placeholders: an entry of no rows never gains rows (rows only leave a batch) and is
    never read; `generate._prefill`'s join leaves it out."""
    cache = next((a for a in block_args if isinstance(a, Cache)), None)
    if cache is not None:
        empty = hidden.new_zeros((0, 1, hidden.shape[1], 1))
        cache.update(empty, empty, slot)


class _Replay(nn.Module):
    """Stands for the first p positions of the layer list during a prefill: writes
    their stored keys/values into the cache and returns the stored residual stream
    entering position p, instead of recomputing blocks that are the same as before."""

    def __init__(self, resid: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor], cache, attention_type: str | None):
        super().__init__()
        self.resid, self.keys, self.values, self.cache = resid, keys, values, cache
        if attention_type is not None:
            self.attention_type = attention_type

    def forward(self, hidden_states: Tensor, *args, **kwargs) -> Tensor:
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            self.cache.update(k, v, i)
        return self.resid.to(hidden_states.dtype)


@contextlib.contextmanager
def replaying(lm, resid: Tensor, keys: Sequence[Tensor], values: Sequence[Tensor], cache) -> Iterator[None]:
    """For one prefill forward: replace the first p = len(keys) positions of the
    current layer list (the full path's, or a route's that starts with blocks
    0..p-1) by their stored results. `resid` is the residual entering position p."""
    layers, layer_types = current_layers(lm)
    p = len(keys)
    if not 0 < p < len(layers):
        raise ValueError(f"cannot replay {p} of {len(layers)} layers")
    head = _Replay(resid, keys, values, cache, getattr(layers[p - 1], "attention_type", None))
    types = [layer_types[0], *layer_types[p:]] if layer_types is not None else None
    with layer_list(lm, [head, *layers[p:]], types):
        yield
