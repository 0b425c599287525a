"""The hook registry: interventions as data, and the one place that turns them into hooks.

An intervention is a small frozen spec (`Ablate`, `Steer`, `AblateUnits`, `Route`) that
serialises to JSON. A *set* is a tuple of specs; a batch carries one set per row, so a
sweep over every layer and component is one batched forward with row r silencing its own
block. `applied(lm, rows)` installs the hooks (and, for a `Route`, swaps the block list)
and restores the model exactly on exit, also when the body raises.

Hook points are the HookedTransformer names the bridge keeps:
``blocks.{l}.hook_mlp_out``, ``blocks.{l}.hook_attn_out``, ``blocks.{l}.hook_resid_pre``,
``blocks.{l}.hook_resid_post``, ``blocks.{l}.mlp.hook_post``.

A route is a list of block indices (skips and repeats). It is applied by replacing the
decoder's layer list with one slot per route position; each slot writes its own KV-cache
entry (attention's ``cycle_offset``), so a repeated block does not overwrite the keys of
its first pass and cached generation stays exact.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Literal, Sequence, Union

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn

Component = Literal["mlp", "attn", "layer"]


@dataclass(frozen=True)
class Ablate:
    """Silence one block's MLP output, attention output, or the whole layer (the
    residual stream passes through that layer unchanged)."""

    component: Component
    layer: int
    mode: Literal["zero"] = "zero"

    def __post_init__(self):
        if self.component not in ("mlp", "attn", "layer"):
            raise ValueError(f"Ablate.component must be 'mlp', 'attn' or 'layer', got {self.component!r}")
        if self.mode != "zero":
            raise ValueError(f"Ablate.mode {self.mode!r} is not supported (only 'zero')")


@dataclass(frozen=True)
class Steer:
    """Add ``alpha * vector`` at hook point ``blocks.{layer}.{site}`` at every position."""

    layer: int
    vector: tuple[float, ...]
    alpha: float
    site: str = "hook_resid_post"

    def __post_init__(self):
        object.__setattr__(self, "vector", tuple(float(x) for x in self.vector))


@dataclass(frozen=True)
class AblateUnits:
    """Zero chosen MLP neurons (``blocks.{layer}.mlp.hook_post``, the input of the
    down projection)."""

    layer: int
    units: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "units", tuple(sorted(int(u) for u in self.units)))


@dataclass(frozen=True)
class Route:
    """Run the blocks in this order (indices into the model's blocks)."""

    path: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "path", tuple(int(i) for i in self.path))
        if not self.path:
            raise ValueError("Route.path is empty")


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
    parts = []
    for s in specs:
        if isinstance(s, Ablate):
            parts.append(f"ablate:{s.component}:{s.layer}")
        elif isinstance(s, Steer):
            digest = hashlib.sha1(json.dumps(s.vector).encode()).hexdigest()[:8]
            parts.append(f"steer:{s.layer}:{s.site}:{s.alpha:g}:{digest}")
        elif isinstance(s, AblateUnits):
            digest = hashlib.sha1(json.dumps(s.units).encode()).hexdigest()[:8]
            parts.append(f"units:{s.layer}:{len(s.units)}:{digest}")
        elif isinstance(s, Route):
            parts.append("route:" + "-".join(map(str, s.path)))
    return "|".join(parts)


# -- application -----------------------------------------------------------------


class Active:
    """The interventions in force during an `applied` block. `select` and
    `repeat_interleave` keep the per-row assignment aligned when the caller
    reorders the batch (dropping finished rows, expanding a prompt to K samples)."""

    def __init__(self, row_sets: list[InterventionSet], device: torch.device, shared: bool = False,
                 route: Route | None = None):
        self.row_sets = row_sets
        self.device = device
        #: the Route every row runs (applied by swapping the layer list), or None
        self.route = route
        # One set for every row, whatever the batch size: no per-row masks needed.
        self.shared = shared
        # Fixed at entry: hooks stay registered even when select() drops every row of a spec.
        self._specs = list(dict.fromkeys(s for r in row_sets for s in r))
        self._masks: dict[Intervention, Bool[Tensor, "batch"]] = {}
        self._resid_pre: dict[int, Tensor] = {}
        self._rebuild()

    def _rebuild(self):
        if self.shared:
            self._masks = {s: None for s in self._specs}
            return
        masks = {s: [False] * len(self.row_sets) for s in self._specs}
        for r, specs in enumerate(self.row_sets):
            for s in specs:
                masks[s][r] = True
        self._masks = {s: torch.tensor(m, device=self.device) for s, m in masks.items()}

    def select(self, index: Sequence[int] | Tensor) -> None:
        if self.shared:
            return
        index = [int(i) for i in index]
        self.row_sets = [self.row_sets[i] for i in index]
        self._rebuild()

    def repeat_interleave(self, k: int) -> None:
        if self.shared:
            return
        self.row_sets = [s for s in self.row_sets for _ in range(k)]
        self._rebuild()

    # Hook functions read the masks at call time, so select() needs no re-registration.
    def _mask(self, spec: Intervention, act: Tensor) -> Tensor:
        mask = self._masks[spec]
        if mask is None:
            return torch.ones((), dtype=torch.bool, device=act.device)
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

        return hook

    def skip_layer(self, spec: Ablate):
        def hook(act: Tensor, hook=None):
            return torch.where(self._mask(spec, act), self._resid_pre.pop(spec.layer), act)

        return hook

    def hooks(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        saved: set[int] = set()
        for spec in self._masks:
            if isinstance(spec, Ablate) and spec.component == "mlp":
                out.append((f"blocks.{spec.layer}.hook_mlp_out", self.zero(spec)))
            elif isinstance(spec, Ablate) and spec.component == "attn":
                out.append((f"blocks.{spec.layer}.hook_attn_out", self.zero(spec)))
            elif isinstance(spec, Ablate):
                if spec.layer not in saved:
                    out.insert(0, (f"blocks.{spec.layer}.hook_resid_pre", self.save_resid_pre(spec.layer)))
                    saved.add(spec.layer)
                out.append((f"blocks.{spec.layer}.hook_resid_post", self.skip_layer(spec)))
            elif isinstance(spec, AblateUnits):
                out.append((f"blocks.{spec.layer}.mlp.hook_post", self.zero_units(spec)))
            elif isinstance(spec, Steer):
                out.append((f"blocks.{spec.layer}.{spec.site}", self.steer(spec)))
        return out


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
        layers = s.path if isinstance(s, Route) else (s.layer,)
        bad = [i for i in layers if not 0 <= i < n]
        if bad:
            raise ValueError(f"{type(s).__name__} names layer {bad[0]}, but the model has layers 0..{n - 1}")
        if isinstance(s, AblateUnits) and s.units:
            d_mlp = lm.bridge.cfg.d_mlp
            if min(s.units) < 0 or max(s.units) >= d_mlp:
                raise ValueError(f"AblateUnits names unit {max(s.units)}, but layer {s.layer} has {d_mlp} units")


@contextlib.contextmanager
def applied(
    lm,
    rows: Sequence[Intervention] | Sequence[Sequence[Intervention]] | None = None,
    batch_size: int | None = None,
) -> Iterator[Active]:
    """Install interventions for the body of the block.

    ``rows`` is either one set (applies to every row) or one set per batch row. All rows
    must share the same `Route` (or none): a route changes depth, so routes are batched
    across questions, not mixed within a batch.
    """
    row_sets, shared = _normalise_rows(rows, batch_size)
    all_specs = {s for r in row_sets for s in r}
    _validate(lm, all_specs)
    routes = {next((s for s in r if isinstance(s, Route)), None) for r in row_sets}
    if len(routes) > 1:
        raise ValueError("rows carry different routes; batch rows by route (one Route per batch)")
    route = routes.pop() if routes else None
    row_sets = [tuple(s for s in r if not isinstance(s, Route)) for r in row_sets]
    active = Active(row_sets, lm.device, shared=shared, route=route)
    with contextlib.ExitStack() as stack:
        if route is not None:
            stack.enter_context(routed(lm, route.path))
        hooks = active.hooks()
        if hooks:
            stack.enter_context(lm.bridge.hooks(fwd_hooks=hooks))
        yield active


# -- routes ------------------------------------------------------------------------


class _RouteSlot(nn.Module):
    """Route position `slot` running block `layer`: the block itself, told to write its
    KV cache at entry `slot` rather than at its own index."""

    def __init__(self, block: nn.Module, layer: int, slot: int, attention_type: str | None):
        super().__init__()
        self.block = block
        self.offset = slot - layer
        if attention_type is not None:
            self.attention_type = attention_type

    def forward(self, *args, **kwargs):
        if self.offset:
            kwargs["cycle_offset"] = self.offset
        return self.block(*args, **kwargs)


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
def routed(lm, path: Sequence[int]) -> Iterator[None]:
    """Swap the decoder's block list for `path`, one KV-cache slot per position."""
    blocks, layer_types = _current_layers(lm)
    slots = []
    for slot, layer in enumerate(path):
        atype = layer_types[layer] if layer_types is not None else None
        slots.append(_RouteSlot(blocks[layer], layer, slot, getattr(blocks[layer], "attention_type", atype)))
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
