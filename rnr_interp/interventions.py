"""The hook registry: interventions as data, and the one place that turns them into hooks.

An intervention is a small frozen spec (`Ablate`, `Steer`, `AblateUnits`, `Route`) that
serialises to JSON. A *set* is a tuple of specs; a batch carries one set per row, so a
sweep over every layer and component is one batched forward with row r silencing its own
block. `applied(lm, rows)` installs the hooks (and, for a `Route`, swaps the block list)
and restores the model exactly on exit, also when the body raises.

Hook names come from one table, `SITES` (site -> hook point per architecture family,
`site_hook`), for every write (the specs' `hooks`) and every read (`capturing`, the
registry's read context). Only the bridge engine has hooks; `engine.decoding.check_hooks`
refuses interventions on any other engine.

A route is a list of block indices (skips and repeats). It is applied by replacing the
decoder's layer list with one slot per route position; each slot writes its own KV-cache
entry (attention's ``cycle_offset``), so a repeated block does not overwrite the keys of
its first pass and cached generation stays exact. Rows on different routes share one
list (`route_schedule`); with sparse slots (`sparse_slots_pay`) each position runs its
block on the rows whose route runs it only, and its cache entry holds those rows only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Literal, Sequence, Union

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn
from transformers.cache_utils import Cache

Component = Literal["mlp", "attn", "layer"]

# -- the site table ---------------------------------------------------------------
#
# Every hook name the package reads or writes comes from this table. Keys are the
# HookedTransformer names a spec or an analysis asks for; values are the bridge's hook
# point ("{layer}" filled in) in each architecture family. The TransformerLens bridge
# already aliases the standard names onto each family's modules, so most families share
# the default; a family differs where its block has extra structure. Gemma-2/3 and OLMo 2
# put an RMSNorm after the MLP (``post_feedforward_layernorm``, the bridge's ``ln2_post``):
# there ``hook_mlp_out`` is the norm's output (what reaches the residual stream) and
# ``mlp.hook_out`` the MLP's own output before it; ``post_mlp_norm`` names the norm
# module, for analyses that need its weight.

_DEFAULT_SITES: dict[str, str] = {
    "hook_resid_pre": "blocks.{layer}.hook_resid_pre",
    "hook_resid_post": "blocks.{layer}.hook_resid_post",
    "hook_attn_out": "blocks.{layer}.hook_attn_out",
    "hook_mlp_out": "blocks.{layer}.hook_mlp_out",
    # The MLP's own output: the same point as hook_mlp_out without a post-MLP norm.
    "mlp.hook_out": "blocks.{layer}.hook_mlp_out",
    # MLP units: the input of the down projection.
    "mlp.hook_post": "blocks.{layer}.mlp.hook_post",
}
_POST_MLP_NORM_SITES = {**_DEFAULT_SITES, "mlp.hook_out": "blocks.{layer}.mlp.hook_out",
                        "post_mlp_norm": "blocks.{layer}.ln2_post"}
#: architecture family (the HF config's ``model_type``) -> site -> hook name template
SITES: dict[str, dict[str, str]] = {
    "default": _DEFAULT_SITES,
    "gemma2": _POST_MLP_NORM_SITES,
    "gemma3": _POST_MLP_NORM_SITES,
    "gemma3_text": _POST_MLP_NORM_SITES,
    "olmo2": _POST_MLP_NORM_SITES,
}
#: the site where each block component writes into the residual stream
COMPONENT_SITE: dict[str, str] = {"mlp": "hook_mlp_out", "attn": "hook_attn_out", "layer": "hook_resid_post"}


def family(lm) -> str:
    """The site-table family of a loaded model ("default" unless the table has its own)."""
    model_type = getattr(lm.hf_model.config, "model_type", "")
    return model_type if model_type in SITES else "default"


def site_hook(lm, site: str, layer: int) -> str:
    """The hook name of `site` at `layer` in `lm`'s architecture family."""
    table = SITES[family(lm)]
    if site not in table:
        raise ValueError(f"unknown site {site!r} for {family(lm)} models; known: {', '.join(table)}")
    return table[site].format(layer=layer)


# -- intervention specs --------------------------------------------------------------
#
# Each spec type says, as methods, what it is called in records (`label`), which layers
# it names (`layers`, checked against the model), and which hooks write it (`hooks`,
# given the batch's `Active` for the per-row masks). A new intervention type is one
# class here plus its entry in KINDS.

Hook = tuple[str, Any]


@dataclass(frozen=True)
class Ablate:
    """Silence one block's MLP output, attention output, or the whole layer (the
    residual stream passes through that layer unchanged)."""

    component: Component
    layer: int
    mode: Literal["zero"] = "zero"

    def __post_init__(self):
        if self.component not in COMPONENT_SITE:
            raise ValueError(f"Ablate.component must be 'mlp', 'attn' or 'layer', got {self.component!r}")
        if self.mode != "zero":
            raise ValueError(f"Ablate.mode {self.mode!r} is not supported (only 'zero')")

    def label(self) -> str:
        return f"ablate:{self.component}:{self.layer}"

    def layers(self) -> tuple[int, ...]:
        return (self.layer,)

    def validate(self, lm) -> None:
        pass

    def hooks(self, active: "Active", lm) -> list[Hook]:
        if self.component != "layer":
            return [(site_hook(lm, COMPONENT_SITE[self.component], self.layer), active.zero(self))]
        # The whole layer: its output is replaced by its input, saved on the way in.
        return [(site_hook(lm, "hook_resid_pre", self.layer), active.save_resid_pre(self.layer)),
                (site_hook(lm, "hook_resid_post", self.layer), active.skip_layer(self))]


@dataclass(frozen=True)
class Steer:
    """Add ``alpha * vector`` at site `site` (a key of the site table, e.g.
    ``hook_mlp_out``) of block `layer`, at every position."""

    layer: int
    vector: tuple[float, ...]
    alpha: float
    site: str = "hook_resid_post"

    def __post_init__(self):
        object.__setattr__(self, "vector", tuple(float(x) for x in self.vector))

    def label(self) -> str:
        digest = hashlib.sha1(json.dumps(self.vector).encode()).hexdigest()[:8]
        return f"steer:{self.layer}:{self.site}:{self.alpha:g}:{digest}"

    def layers(self) -> tuple[int, ...]:
        return (self.layer,)

    def validate(self, lm) -> None:
        site_hook(lm, self.site, self.layer)

    def hooks(self, active: "Active", lm) -> list[Hook]:
        return [(site_hook(lm, self.site, self.layer), active.steer(self))]


@dataclass(frozen=True)
class AblateUnits:
    """Zero chosen MLP neurons (site ``mlp.hook_post``, the input of the down
    projection)."""

    layer: int
    units: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "units", tuple(sorted(int(u) for u in self.units)))

    def label(self) -> str:
        digest = hashlib.sha1(json.dumps(self.units).encode()).hexdigest()[:8]
        return f"units:{self.layer}:{len(self.units)}:{digest}"

    def layers(self) -> tuple[int, ...]:
        return (self.layer,)

    def validate(self, lm) -> None:
        d_mlp = lm.bridge.cfg.d_mlp
        if self.units and (min(self.units) < 0 or max(self.units) >= d_mlp):
            raise ValueError(f"AblateUnits names unit {max(self.units)}, but layer {self.layer} has {d_mlp} units")

    def hooks(self, active: "Active", lm) -> list[Hook]:
        return [(site_hook(lm, "mlp.hook_post", self.layer), active.zero_units(self))]


@dataclass(frozen=True)
class Route:
    """Run the blocks in this order (indices into the model's blocks). Applied by
    swapping the decoder's block list (`routed`), not by hooks."""

    path: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "path", tuple(int(i) for i in self.path))
        if not self.path:
            raise ValueError("Route.path is empty")

    def label(self) -> str:
        return "route:" + "-".join(map(str, self.path))

    def layers(self) -> tuple[int, ...]:
        return self.path

    def validate(self, lm) -> None:
        pass

    def hooks(self, active: "Active", lm) -> list[Hook]:
        return []


def first_layer(specs: Sequence["Intervention"]) -> int | None:
    """The first block a set of specs touches (a spec's hooks sit in the blocks its
    `layers` names); None for an empty set."""
    return min((layer for spec in specs for layer in spec.layers()), default=None)


def shared_prefix(path: Sequence[int]) -> int:
    """How many leading blocks a route runs exactly as the full path does."""
    p = 0
    while p < len(path) and path[p] == p:
        p += 1
    return p


def route_schedule(paths: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """One layer list that holds every path as a subsequence, and the positions each
    path takes in it. Each step appends the smallest layer that some unfinished path
    runs next: a route space's routes (the full path with skips and in-place repeats)
    then share one list, the full path with each distinct repeated block inserted once."""
    heads = [0] * len(paths)
    schedule: list[int] = []
    slots: list[list[int]] = [[] for _ in paths]
    while True:
        wanted = [p[h] for p, h in zip(paths, heads) if h < len(p)]
        if not wanted:
            return tuple(schedule), [tuple(s) for s in slots]
        layer = min(wanted)
        for i, p in enumerate(paths):
            if heads[i] < len(p) and p[heads[i]] == layer:
                slots[i].append(len(schedule))
                heads[i] += 1
        schedule.append(layer)


Intervention = Union[Ablate, Steer, AblateUnits, Route]
InterventionSet = tuple[Intervention, ...]
KINDS: dict[str, type] = {cls.__name__: cls for cls in (Ablate, Steer, AblateUnits, Route)}


# -- serialisation ---------------------------------------------------------------


def to_json(spec: Intervention) -> dict[str, Any]:
    return {"kind": type(spec).__name__, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(spec).items()}}


def from_json(obj: dict[str, Any]) -> Intervention:
    obj = dict(obj)
    kind = obj.pop("kind", None)
    if kind not in KINDS:
        raise ValueError(f"unknown intervention kind {kind!r}; known: {sorted(KINDS)}")
    return KINDS[kind](**obj)


def dumps(specs: Sequence[Intervention]) -> str:
    return json.dumps([to_json(s) for s in specs])


def loads(text: str) -> InterventionSet:
    return tuple(from_json(o) for o in json.loads(text)) if text else ()


def set_id(specs: Sequence[Intervention]) -> str:
    """A short, stable, readable id for a set ("" for none): used as the
    `intervention` column of records. Steering vectors enter by hash."""
    return "|".join(s.label() for s in specs)


# -- application -----------------------------------------------------------------


class Active:
    """The interventions in force during an `applied` block. `select` and
    `repeat_interleave` keep the per-row assignment aligned when the caller
    reorders the batch (dropping finished rows, expanding a prompt to K samples)."""

    def __init__(self, row_sets: list[InterventionSet], device: torch.device, shared: bool = False,
                 route: Route | None = None, row_slots: list[tuple[int, ...]] | None = None, sparse: bool = True):
        self.row_sets = row_sets
        self.device = device
        #: the layer list every row goes through (applied by swapping the decoder's list), or None
        self.route = route
        #: rows with routes of their own: the positions of `route` each row runs (the
        #: others pass its residual stream through); None when every row runs all of it
        self.row_slots = row_slots
        #: with row_slots: a position runs its block on its own rows only (gathered, then
        #: scattered back), and its KV-cache entry holds those rows only. Otherwise every
        #: row runs every position and the rows that skip it keep their input (`run_slot`).
        self.sparse = sparse
        # Rows of the batch a block is running on now (sparse slots), for the hook masks.
        self._running: Tensor | None = None
        # One set for every row, whatever the batch size: no per-row masks needed.
        self.shared = shared
        # Fixed at entry: hooks stay registered even when select() drops every row of a spec.
        self._specs = list(dict.fromkeys(s for r in row_sets for s in r))
        self._masks: dict[Intervention, Bool[Tensor, "batch"]] = {}
        self._resid_pre: dict[int, Tensor] = {}
        self._rebuild()

    def _rebuild(self):
        if self.row_slots is not None:
            keep = torch.zeros((len(self.route.path), len(self.row_slots)), dtype=torch.bool)
            for r, slots in enumerate(self.row_slots):
                keep[list(slots), r] = True
            self._slot_keep = keep.to(self.device)
            # Per position, the rows that run it (None: every row, nothing to gather).
            self._slot_rows = [None if bool(k.all()) else k.nonzero().squeeze(-1).to(self.device) for k in keep]
        if self.shared:
            self._masks = {s: None for s in self._specs}
            return
        masks = {s: [False] * len(self.row_sets) for s in self._specs}
        for r, specs in enumerate(self.row_sets):
            for s in specs:
                masks[s][r] = True
        self._masks = {s: torch.tensor(m, device=self.device) for s, m in masks.items()}

    def select(self, index: Sequence[int] | Tensor, cache=None) -> None:
        """Keep these rows of the batch (in this order), and with `cache` (a
        `DynamicCache` of this batch) its rows too: with sparse slots each position's
        entry keeps those of its own rows that stay."""
        if cache is not None:
            self._select_cache(cache, index)
        if self.shared:
            return
        index = index.tolist() if isinstance(index, Tensor) else [int(i) for i in index]
        self.row_sets = [self.row_sets[i] for i in index]
        if self.row_slots is not None:
            self.row_slots = [self.row_slots[i] for i in index]
        self._rebuild()

    def repeat_interleave(self, k: int) -> None:
        if self.shared:
            return
        self.row_sets = [s for s in self.row_sets for _ in range(k)]
        if self.row_slots is not None:
            self.row_slots = [s for s in self.row_slots for _ in range(k)]
        self._rebuild()

    def _select_cache(self, cache, index: Sequence[int] | Tensor) -> None:
        index = torch.as_tensor(index, dtype=torch.long, device=self.device)
        if not self.owns_slot_rows():
            cache.batch_select_indices(index)
            return
        for slot, layer in enumerate(cache.layers):
            runs = self._slot_keep[slot]
            # Where each kept row that runs this position sits among the position's rows.
            at = (runs.cumsum(0) - 1)[index][runs[index]]
            layer.batch_select_indices(at)

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
        self._running = rows
        try:
            out = block(*args, **kwargs)
        finally:
            self._running = None
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
        if self.route is None:
            return [first_layer(specs) or 0 for specs in self.row_sets]
        if any(self.row_sets):
            return [0] * len(self.row_sets)
        n = len(self.route.path)
        slots = self.row_slots if self.row_slots is not None else [tuple(range(n))] * len(self.row_sets)
        prefixes = [min(shared_prefix(self.route.path), shared_prefix(s)) for s in slots]
        return [p if p < n else 0 for p in prefixes]

    @contextlib.contextmanager
    def restricted(self, rows: Sequence[int]) -> Iterator[None]:
        """The batch is these rows only, for the body (a prefill run in groups)."""
        saved = (self.row_sets, self.row_slots)
        self.select(rows)
        try:
            yield
        finally:
            if not self.shared:
                self.row_sets, self.row_slots = saved
                self._rebuild()

    # Hook functions read the masks at call time, so select() needs no re-registration.
    def _mask(self, spec: Intervention, act: Tensor) -> Tensor:
        mask = self._masks[spec]
        if mask is None:
            return torch.ones((), dtype=torch.bool, device=act.device)
        if self._running is not None:
            mask = mask[self._running]
        if mask.shape[0] != act.shape[0]:
            raise RuntimeError(
                f"intervention rows ({mask.shape[0]}) do not match the batch ({act.shape[0]}); "
                "call Active.select/repeat_interleave when reshaping the batch"
            )
        return mask.view(-1, *([1] * (act.ndim - 1)))

    def zero(self, spec: Intervention):
        def hook(act: Float[Tensor, "batch pos d"], hook=None):
            return torch.where(self._mask(spec, act), torch.zeros_like(act), act)

        return hook

    def zero_units(self, spec: AblateUnits):
        def hook(act: Float[Tensor, "batch pos d_mlp"], hook=None):
            units = torch.tensor(spec.units, device=act.device, dtype=torch.long)
            keep = torch.ones(act.shape[-1], device=act.device, dtype=act.dtype).index_fill(0, units, 0.0)
            return torch.where(self._mask(spec, act), act * keep, act)

        return hook

    def steer(self, spec: Steer):
        def hook(act: Float[Tensor, "batch pos d"], hook=None):
            v = torch.tensor(spec.vector, device=act.device, dtype=act.dtype)
            if v.shape[-1] != act.shape[-1]:
                raise ValueError(f"Steer vector has size {v.shape[-1]} but {hook.name if hook else 'the site'} has {act.shape[-1]}")
            return torch.where(self._mask(spec, act), act + spec.alpha * v, act)

        return hook

    def save_resid_pre(self, layer: int):
        def hook(act: Tensor, hook=None):
            self._resid_pre[layer] = act
            return act

        hook.saves_input = True  # registered before every writing hook
        return hook

    def skip_layer(self, spec: Ablate):
        def hook(act: Tensor, hook=None):
            return torch.where(self._mask(spec, act), self._resid_pre.pop(spec.layer), act)

        return hook

    def hooks(self, lm) -> list[Hook]:
        hooks = [h for spec in self._masks for h in spec.hooks(self, lm)]
        # Inputs are saved before any hook at the same point changes them (stable sort).
        return sorted(hooks, key=lambda h: not getattr(h[1], "saves_input", False))


def _normalise_rows(rows: Sequence[Intervention] | Sequence[Sequence[Intervention]] | None, batch_size: int | None):
    if rows is None:
        rows = ()
    rows = list(rows)
    if not rows or not isinstance(rows[0], (list, tuple)):
        # One set for every row.
        return [tuple(rows)] * (batch_size or 1), True
    return [tuple(r) for r in rows], False


def _validate(lm, specs: Sequence[Intervention]) -> None:
    n = lm.n_layers
    for s in specs:
        bad = [i for i in s.layers() if not 0 <= i < n]
        if bad:
            raise ValueError(f"{type(s).__name__} names layer {bad[0]}, but the model has layers 0..{n - 1}")
        s.validate(lm)


def sparse_slots_pay(lm) -> bool:
    """Whether rows on different routes should run only their own route positions
    (`Active.sparse`) on `lm`'s device, for callers that leave the choice to it. On a
    CPU a block's cost grows with its rows: on the demo model, route batches whose rows
    passed 20-40% of their schedule's positions by generated 1.07-1.40x faster with
    sparse slots (CPU time, 5 to 32 rows; docs/performance.md). On a GPU a block costs
    about the same for 1 row or 40 and the gathers add kernel launches per position, so
    there the union schedule runs dense; that side is not measured yet. Either way the
    generations are the same."""
    return lm.device.type == "cpu"


@contextlib.contextmanager
def applied(
    lm,
    rows: Sequence[Intervention] | Sequence[Sequence[Intervention]] | None = None,
    batch_size: int | None = None,
    sparse_slots: bool | None = None,
) -> Iterator[Active]:
    """Install interventions for the body of the block.

    ``rows`` is either one set (applies to every row) or one set per batch row. Rows may
    carry different `Route`s (a row without one runs the full path): the decoder then
    runs `route_schedule` of them, each row passing the residual stream through the
    positions its own route does not run, with its own KV-cache slot per position.
    `sparse_slots` (default: `sparse_slots_pay`): a position runs its block on the rows
    whose route runs it only, rather than on every row (`Active.run_slot`).
    """
    row_sets, shared = _normalise_rows(rows, batch_size)
    all_specs = {s for r in row_sets for s in r}
    _validate(lm, all_specs)
    routes = [next((s for s in r if isinstance(s, Route)), None) for r in row_sets]
    route, row_slots = routes[0] if routes else None, None
    if len(set(routes)) > 1:
        full = tuple(range(lm.n_layers))
        schedule, row_slots = route_schedule([r.path if r is not None else full for r in routes])
        route = Route(schedule)
    row_sets = [tuple(s for s in r if not isinstance(s, Route)) for r in row_sets]
    sparse = sparse_slots_pay(lm) if sparse_slots is None else sparse_slots
    active = Active(row_sets, lm.device, shared=shared, route=route, row_slots=row_slots, sparse=sparse)
    with contextlib.ExitStack() as stack:
        if route is not None:
            stack.enter_context(routed(lm, route.path, run_slot=active.run_slot if row_slots is not None else None))
        hooks = active.hooks(lm)
        if hooks:
            stack.enter_context(lm.bridge.hooks(fwd_hooks=hooks))
        yield active


# -- reads -------------------------------------------------------------------------


@contextlib.contextmanager
def capturing(lm, names: Sequence[str], keep: Callable[[Tensor], Tensor] = lambda act: act,
              ) -> Iterator[dict[str, list[Tensor]]]:
    """Read activations: during the block, each forward appends ``keep(act)`` of every
    hook point in `names` (from `site_hook`) to ``got[name]``; the activations pass on
    unchanged. Combines with `applied` (reads see the interventions in force)."""
    got: dict[str, list[Tensor]] = {name: [] for name in names}  # one reader per distinct point

    def reader(name: str):
        def hook(act: Tensor, hook=None):
            got[name].append(keep(act))
            return act

        return hook

    with lm.bridge.hooks(fwd_hooks=[(name, reader(name)) for name in got]):
        yield got


# -- routes ------------------------------------------------------------------------


#: `Active.run_slot(slot, block, args, kwargs)`: runs a route position for the rows it applies to
RunSlot = Callable[[int, Callable[..., Any], tuple, dict], Any]


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


class _RouteSlot(nn.Module):
    """Route position `slot` running block `layer`: the block itself, told to write its
    KV cache at entry `slot` rather than at its own index; with `run_slot`, for the rows
    whose own route runs this position only (the others keep the residual stream they
    came in with)."""

    def __init__(self, block: nn.Module, layer: int, slot: int, attention_type: str | None, run_slot: RunSlot | None = None):
        super().__init__()
        self.block = block
        self.slot, self.offset, self.run_slot = slot, slot - layer, run_slot
        if attention_type is not None:
            self.attention_type = attention_type

    def forward(self, *args, **kwargs):
        if self.offset:
            kwargs["cycle_offset"] = self.offset
        if self.run_slot is None:
            return self.block(*args, **kwargs)
        return self.run_slot(self.slot, self.block, args, kwargs)


def _decoder_layers(model: nn.Module) -> tuple[nn.Module, str]:
    """The module holding the block list, and the attribute name of that list."""
    for owner_path, attr in (("model", "layers"), ("transformer", "h"), ("model.decoder", "layers"), ("gpt_neox", "layers")):
        owner = model
        try:
            for part in owner_path.split("."):
                owner = getattr(owner, part)
        except AttributeError:
            continue
        if isinstance(getattr(owner, attr, None), nn.ModuleList):
            return owner, attr
    raise NotImplementedError(f"routing is not supported for {type(model).__name__}: no decoder layer list found")


def decoder_blocks(model: nn.Module) -> nn.ModuleList:
    """The decoder's block list of an HF causal LM (the list routes swap)."""
    owner, attr = _decoder_layers(model)
    return getattr(owner, attr)


@contextlib.contextmanager
def _layer_list(lm, modules: list[nn.Module], layer_types: list[str] | None) -> Iterator[None]:
    """Run the decoder over `modules` instead of its own block list (and matching
    per-position layer types), restoring both on exit."""
    owner, attr = _decoder_layers(lm.hf_model)
    original = getattr(owner, attr)
    config = lm.hf_model.config.get_text_config()
    saved = {"num_hidden_layers": config.num_hidden_layers}
    if layer_types is not None:
        saved["layer_types"] = config.layer_types
    try:
        # nn.Module.__setattr__ registers the new list; the original blocks (and the
        # bridge's hook points inside them) are untouched and shared.
        setattr(owner, attr, nn.ModuleList(modules))
        config.num_hidden_layers = len(modules)
        if layer_types is not None:
            config.layer_types = layer_types
        yield
    finally:
        setattr(owner, attr, original)
        for k, v in saved.items():
            setattr(config, k, v)


def _current_layers(lm) -> tuple[list[nn.Module], list[str] | None]:
    owner, attr = _decoder_layers(lm.hf_model)
    return list(getattr(owner, attr)), getattr(lm.hf_model.config.get_text_config(), "layer_types", None)


@contextlib.contextmanager
def routed(lm, path: Sequence[int], run_slot: RunSlot | None = None) -> Iterator[None]:
    """Swap the decoder's block list for `path`, one KV-cache slot per position
    (`run_slot`: runs each position for the rows it applies to, for rows with routes of
    their own)."""
    blocks, layer_types = _current_layers(lm)
    slots = []
    for slot, layer in enumerate(path):
        atype = layer_types[layer] if layer_types is not None else None
        slots.append(_RouteSlot(blocks[layer], layer, slot, getattr(blocks[layer], "attention_type", atype), run_slot))
    with _layer_list(lm, slots, [layer_types[i] for i in path] if layer_types is not None else None):
        yield


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
    layers, layer_types = _current_layers(lm)
    p = len(keys)
    if not 0 < p < len(layers):
        raise ValueError(f"cannot replay {p} of {len(layers)} layers")
    head = _Replay(resid, keys, values, cache, getattr(layers[p - 1], "attention_type", None))
    types = [layer_types[0], *layer_types[p:]] if layer_types is not None else None
    with _layer_list(lm, [head, *layers[p:]], types):
        yield
