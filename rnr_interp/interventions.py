"""The hook registry: interventions as data, and the one place that turns them into hooks.

An intervention is a small frozen spec (`Ablate`, `Steer`, `Clamp`, `AblateUnits`, `Route`, or
your own: subclass `Intervention` and `@register` it) that serialises to JSON. A *set*
is a tuple of specs; a batch carries one set per row, so a sweep over every layer and
component is one batched forward with row r silencing its own block: each spec's hooks
change its own rows only (`RowMask`). `applied(lm, rows)` installs the hooks (and, for a
`Route`, swaps the block list) and restores the model exactly on exit, also when the
body raises.

Hook names come from one table, `SITES` (site -> hook point per architecture family,
`site_hook`), for every write (the specs' `edits`) and every read (`capturing`, the
registry's read context). Only the bridge engine has hooks; `engine.decoding.check_hooks`
refuses interventions on any other engine.

A route is a list of block indices (skips and repeats). It is applied by replacing the
decoder's layer list with one slot per route position; each slot writes its own KV-cache
entry (attention's ``cycle_offset``), so a repeated block does not overwrite the keys of
its first pass and cached generation stays exact. Rows on different routes in one batch
are the engine's business (`engine.batch`): which rows run which position, and which
rows each cache entry holds.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import dataclasses
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence, get_args

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from rnr_interp.sae import SAE, load_sae

Component = Literal["mlp", "attn", "layer"]
#: how `Ablate` silences a block: it writes nothing, or its mean write
AblationMode = Literal["zero", "mean"]
ABLATION_MODES: tuple[str, ...] = get_args(AblationMode)


def check_ablation(mode: str, what: str = "ablation") -> None:
    if mode not in ABLATION_MODES:
        raise ValueError(f"{what} must be one of {', '.join(ABLATION_MODES)}, got {mode!r}")

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
    """The hook name of `site` at block `layer` in `lm`'s architecture family. `site` is
    a key of the site table (`SITES`), any hook point of a block in TransformerLens's own
    names (``hook_resid_mid``, ``attn.hook_z``, ``ln1.hook_normalized``, ...: the bridge's
    names, which differ by family where the blocks do, as Gemma's ``ln2_post``), or a full
    hook name (``blocks.2.hook_resid_pre``), whose block must be `layer`."""
    table = SITES[family(lm)]
    if site in table:
        return table[site].format(layer=layer)
    named, within = split_hook_name(site)
    if named is not None and named != layer:
        raise ValueError(f"site {site!r} is in block {named}, but the intervention names layer {layer}")
    name = f"blocks.{layer}.{within}"
    if name not in lm.bridge.hook_dict:
        raise ValueError(f"unknown site {site!r} for {family(lm)} models: no hook point {name!r}; known: "
                         f"{', '.join(table)}, or a block's TransformerLens hook name ({', '.join(block_hook_names(lm)[:6])}, ...)")
    return name


def split_hook_name(name: str) -> tuple[int | None, str]:
    """``blocks.{l}.rest`` -> (l, rest); a name below a block (``attn.hook_z``) -> (None,
    name): a SAELens ``hook_name``, say, as a block and a site."""
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit():
        return int(parts[1]), parts[2]
    return None, name


def block_hook_names(lm) -> list[str]:
    """Every hook point below block 0 of `lm`'s bridge, without the block prefix (the
    sites `site_hook` takes besides the table's)."""
    return sorted(n.removeprefix("blocks.0.") for n in lm.bridge.hook_dict if n.startswith("blocks.0."))


# -- intervention specs --------------------------------------------------------------
#
# A spec says what it is called in records (`label`), which blocks its hooks sit in
# (`layers`, checked against the model; the engine may replay the blocks before the
# first of them from a stored prefill), and what it does to an activation (`edits`).
# The registry runs each edit on the spec's own batch rows only (`RowMask.edit`), so a
# batched sweep can give every row its own set.

#: an edit: (the activation at a hook point, the hook point) -> the activation that replaces it
Edit = Callable[[Tensor, Any], Tensor]
#: (hook name, hook function), as `bridge.hooks(fwd_hooks=...)` takes them
Hook = tuple[str, Callable[..., Tensor]]


class Intervention(abc.ABC):
    """The base of every intervention spec, and the extension point for your own.

    A new intervention is one frozen dataclass that subclasses this and carries
    `@register` (records store it as JSON under its class name; `from_json` reads it
    back), with:

    - `label()`: its short text in the records' `intervention` column;
    - `layers()`: every block its hooks sit in (the engine replays the blocks before
      the first of them from a stored prefill, so leaving one out changes results);
    - `validate(lm)` (optional): raise ValueError for a model it cannot apply to;
    - `edits(lm)`: ``[(hook name, edit)]``, each edit ``(act, hook) -> new act`` over
      the whole batch; hook names from `site_hook` or any TransformerLens hook name.

    The registry applies each edit to the rows whose set holds this spec and keeps every
    other row's activation as it was, also in a batched sweep where each row carries its
    own set. A spec that needs more than an edit per hook point (state between two hook
    points, as `Ablate` of a whole layer) overrides `hooks(lm, rows)` and builds its hooks
    with the `RowMask` it is given (`rows.edit`, `rows.where`). A worked example (a spec
    scaling the residual stream) is in docs/how-it-works.md, "Your own intervention", and
    runs as a test in tests/test_custom_interventions.py.
    """

    @abc.abstractmethod
    def label(self) -> str:
        """The spec in the records' `intervention` column."""

    @abc.abstractmethod
    def layers(self) -> tuple[int, ...]:
        """Every block the spec's hooks sit in."""

    def validate(self, lm) -> None:
        """Raise ValueError when the spec cannot apply to `lm`."""

    def edits(self, lm) -> list[tuple[str, Edit]]:
        """(hook name, edit) pairs; `hooks` confines each edit to the spec's rows."""
        return []

    def hooks(self, lm, rows: "RowMask") -> list[Hook]:
        """The spec's hooks, changing the rows `rows` selects only."""
        return [(name, rows.edit(edit)) for name, edit in self.edits(lm)]


def digest(values: Sequence[float] | Sequence[int]) -> str:
    """A short stable digest of a spec's numbers, for its label (vectors enter labels by hash)."""
    return hashlib.sha1(json.dumps(list(values)).encode()).hexdigest()[:8]


#: kind (class name, as records hold it) -> spec class; filled by `register`
KINDS: dict[str, type[Intervention]] = {}


def register(cls: type[Intervention]) -> type[Intervention]:
    """Class decorator: make a spec class a known intervention kind (by class name), so
    records that hold it read back (`from_json`). It must be a frozen dataclass that
    subclasses `Intervention`."""
    if not (isinstance(cls, type) and issubclass(cls, Intervention)):
        raise TypeError(f"{getattr(cls, '__name__', cls)!r} is not a subclass of Intervention")
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):
        raise TypeError(f"{cls.__name__} must be a frozen dataclass (@dataclass(frozen=True)): specs are hashed and stored as JSON")
    known = KINDS.get(cls.__name__)
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"intervention kind {cls.__name__!r} is already registered by {known.__module__}.{known.__qualname__}")
    KINDS[cls.__name__] = cls
    return cls


@register
@dataclass(frozen=True)
class Ablate(Intervention):
    """Silence one block's MLP output, attention output, or the whole layer: "zero"
    writes nothing in its place (the residual stream passes a silenced layer
    unchanged), "mean" writes the block's mean write instead (`mean`, measured by the
    caller on a reference set: `localise.silencing.block_means`), so what is removed is
    only the block's deviation from its usual output."""

    component: Component
    layer: int
    mode: AblationMode = "zero"
    #: mode "mean": what the block writes instead (one value per residual dimension)
    mean: tuple[float, ...] = ()

    def __post_init__(self):
        if self.component not in COMPONENT_SITE:
            raise ValueError(f"Ablate.component must be 'mlp', 'attn' or 'layer', got {self.component!r}")
        check_ablation(self.mode, "Ablate.mode")
        object.__setattr__(self, "mean", tuple(float(x) for x in self.mean))
        if (self.mode == "mean") != bool(self.mean):
            raise ValueError("Ablate.mode 'mean' needs the block's mean write (mean=...), and only it carries one")

    def label(self) -> str:
        if self.mode == "zero":
            return f"ablate:{self.component}:{self.layer}"
        return f"ablate:{self.component}:{self.layer}:mean:{digest(self.mean)}"

    def layers(self) -> tuple[int, ...]:
        return (self.layer,)

    def _written(self, act: Float[Tensor, "batch pos d"]) -> Tensor:
        """What the silenced block writes: nothing, or its mean write."""
        if not self.mean:
            return torch.zeros_like(act)
        mean = torch.tensor(self.mean, device=act.device, dtype=act.dtype)
        if mean.shape[-1] != act.shape[-1]:
            raise ValueError(f"Ablate mean has size {mean.shape[-1]} but block {self.layer} writes {act.shape[-1]}")
        return mean.expand_as(act)

    def edits(self, lm) -> list[tuple[str, Edit]]:
        return [(site_hook(lm, COMPONENT_SITE[self.component], self.layer), lambda act, hook: self._written(act))]

    def hooks(self, lm, rows: "RowMask") -> list[Hook]:
        if self.component != "layer":
            return super().hooks(lm, rows)
        # The whole layer: its output is its input (saved on the way in) plus what it writes instead.
        saved: list[Tensor] = []

        def save(act: Float[Tensor, "batch pos d"], hook=None) -> Tensor:
            saved.append(act)
            return act

        save.saves_input = True  # registered before every writing hook
        return [(site_hook(lm, "hook_resid_pre", self.layer), save),
                (site_hook(lm, "hook_resid_post", self.layer), rows.edit(lambda act, hook: (kept := saved.pop()) + self._written(kept)))]


# -- where a forward call sits in its sequence ------------------------------------
#
# A hook sees one call's activations, [batch, pos, d], not where those positions are in
# the sequence: a cached decoding step holds one position, a prefill the whole prompt.
# The engine says so around each call (`sequence_span`): the absolute index of the
# call's first position, and of the prompt's last position (left padding puts every
# row's prompt end at the same index).

_SPAN: contextvars.ContextVar[tuple[int, int | None]] = contextvars.ContextVar("rnr_sequence_span", default=(0, None))


@contextlib.contextmanager
def sequence_span(offset: int, prompt_end: int | None) -> Iterator[None]:
    """Within this block a forward call's first position is sequence position `offset`,
    and the prompt ends at `prompt_end` (None: at the call's last position)."""
    token = _SPAN.set((offset, prompt_end))
    try:
        yield
    finally:
        _SPAN.reset(token)


def _prompt_end_index(n_pos: int) -> int:
    """The prompt's last position as an index among a forward call's `n_pos` positions
    (negative for a decoding step after the prompt). Outside the engine's generation a
    call is read as one whole prompt."""
    offset, end = _SPAN.get()
    return n_pos - 1 if end is None else end - offset


def prompt_end_in_call(n_pos: int) -> int | None:
    """The index, among a forward call's `n_pos` positions, of the prompt's last
    position; None when this call does not hold it (a decoding step after the prompt)."""
    at = _prompt_end_index(n_pos)
    return at if 0 <= at < n_pos else None


def reply_in_call(n_pos: int) -> slice | None:
    """The positions, among a forward call's `n_pos`, that choose the reply's tokens: the
    prompt's last and every one after it; None when the call holds none (a prefill that
    ends before the prompt does)."""
    at = _prompt_end_index(n_pos)
    return slice(max(at, 0), n_pos) if at < n_pos else None


#: where `Steer` adds its vector: at every position, at the prompt's last position alone
#: (the state that chooses the reply's first token), or there and at every generated one
#: (a reply that opens with a preamble, "The answer is", states its answer later)
SteerAt = Literal["every", "prompt", "reply"]
STEER_AT: tuple[str, ...] = get_args(SteerAt)


def check_steer_at(at: str, what: str = "steer_at") -> None:
    if at not in STEER_AT:
        raise ValueError(f"{what} must be one of {', '.join(STEER_AT)}, got {at!r}")


@register
@dataclass(frozen=True)
class Steer(Intervention):
    """Add ``alpha * vector`` at site `site` (a key of the site table, e.g.
    ``hook_mlp_out``) of block `layer`: at every position (`at` "every"), at the
    prompt's last position alone (`at` "prompt": generated tokens are left as the
    steered prompt makes them), or there and at every generated position (`at` "reply":
    the prompt itself is read unsteered)."""

    layer: int
    vector: tuple[float, ...]
    alpha: float
    site: str = "hook_resid_post"
    at: SteerAt = "every"

    def __post_init__(self):
        object.__setattr__(self, "vector", tuple(float(x) for x in self.vector))
        check_steer_at(self.at, "Steer at")

    def label(self) -> str:
        where = "" if self.at == "every" else f":at-{self.at}"
        return f"steer:{self.layer}:{self.site}:{self.alpha:g}:{digest(self.vector)}{where}"

    def layers(self) -> tuple[int, ...]:
        return (self.layer,)

    @classmethod
    def from_sae(cls, folder: str | Path, feature: int, alpha: float = 1.0) -> "Steer":
        """Steer along feature `feature`'s decoder row of the SAELens SAE in `folder`, at
        the SAE's own hook point (its ``hook_name``, split into block and site)."""
        sae, layer, site = sae_point(folder)
        return cls(layer=layer, vector=tuple(sae.direction(feature).tolist()), alpha=alpha, site=site)

    def validate(self, lm) -> None:
        site_hook(lm, self.site, self.layer)

    def edits(self, lm) -> list[tuple[str, Edit]]:
        def add(act: Float[Tensor, "batch pos d"], hook) -> Tensor:
            v = site_vector(self.vector, act, hook, "Steer")
            return at_positions(act, self.at, lambda x: x + self.alpha * v)

        return [(site_hook(lm, self.site, self.layer), add)]


def site_vector(vector: Sequence[float], act: Tensor, hook, what: str) -> Tensor:
    """`vector` as a tensor beside `act`, checked to fit the site's width."""
    v = torch.tensor(vector, device=act.device, dtype=act.dtype)
    if v.shape[-1] != act.shape[-1]:
        raise ValueError(f"{what} vector has size {v.shape[-1]} but {hook.name if hook else 'the site'} has {act.shape[-1]}")
    return v


def at_positions(act: Float[Tensor, "batch pos d"], at: str, change: Callable[[Tensor], Tensor]) -> Tensor:
    """`act` with `change` applied at the positions `at` names (`STEER_AT`) among this
    forward call's, the others as they were."""
    if at == "every":
        return change(act)
    if at == "prompt":
        end = prompt_end_in_call(act.shape[1])
        where = None if end is None else slice(end, end + 1)
    else:
        where = reply_in_call(act.shape[1])
    if where is None:
        return act
    act = act.clone()
    act[:, where] = change(act[:, where])
    return act


@register
@dataclass(frozen=True)
class Clamp(Intervention):
    """Set ``act . row`` to its value for every row of `basis` (linearly independent;
    with orthonormal rows, the components along them), for the activation at site `site`
    of block `layer`, a `fraction` of the way from where each position has it, moving
    only within the rows' span (for orthonormal B: ``act + fraction * (values - act B^T)
    B``), at the positions `at` names (as `Steer`). Where ``-alpha * v`` moves every
    question by the same vector, a clamp moves each by what it takes to reach `values`: a
    write whose size or direction within the span differs from question to question is
    undone on each (the steer run's clamp control, `localise.steering`)."""

    layer: int
    basis: tuple[tuple[float, ...], ...]
    values: tuple[float, ...]
    site: str = "hook_resid_post"
    at: SteerAt = "every"
    fraction: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "basis", tuple(tuple(float(x) for x in row) for row in self.basis))
        object.__setattr__(self, "values", tuple(float(x) for x in self.values))
        check_steer_at(self.at, "Clamp at")
        rows = torch.tensor(self.basis, dtype=torch.float64)
        if rows.ndim != 2 or len(self.values) != rows.shape[0] or rows.shape[0] == 0:
            raise ValueError(f"Clamp needs one value per basis row, got {len(self.values)} values for {len(self.basis)} rows")
        if not (bool(torch.isfinite(rows).all()) and all(map(math.isfinite, (*self.values, self.fraction)))):
            raise ValueError("Clamp needs a finite basis, values and fraction")
        if int(torch.linalg.matrix_rank(rows)) < rows.shape[0]:
            raise ValueError("Clamp needs linearly independent basis rows (non-zero directions)")

    def label(self) -> str:
        where = "" if self.at == "every" else f":at-{self.at}"
        return (f"clamp:{self.layer}:{self.site}:{len(self.basis)}:{self.fraction:g}:"
                f"{digest([x for row in self.basis for x in row] + list(self.values))}{where}")

    def layers(self) -> tuple[int, ...]:
        return (self.layer,)

    def validate(self, lm) -> None:
        site_hook(lm, self.site, self.layer)

    def orthonormal(self) -> tuple[Float[Tensor, "k d"], Float[Tensor, " k"]]:
        """The basis orthonormalised (QR of its rows, in order) and the values it takes."""
        q, r = torch.linalg.qr(torch.tensor(self.basis, dtype=torch.float64).T)
        # the targets along the new rows: values were given along the old ones, b_i = sum_j r_ji q_j
        targets = torch.linalg.solve_triangular(r.T, torch.tensor(self.values, dtype=torch.float64)[:, None], upper=False)
        return q.T, targets[:, 0]

    def edits(self, lm) -> list[tuple[str, Edit]]:
        basis, targets = self.orthonormal()

        def clamp(act: Float[Tensor, "batch pos d"], hook) -> Tensor:
            if basis.shape[-1] != act.shape[-1]:
                raise ValueError(f"Clamp basis has size {basis.shape[-1]} but {hook.name if hook else 'the site'} has {act.shape[-1]}")
            b, t = basis.to(act.device, act.dtype), targets.to(act.device, act.dtype)
            return at_positions(act, self.at, lambda x: x + self.fraction * (t - x @ b.T) @ b)

        return [(site_hook(lm, self.site, self.layer), clamp)]


@register
@dataclass(frozen=True)
class AblateUnits(Intervention):
    """Zero chosen MLP neurons (site ``mlp.hook_post``, the input of the down
    projection)."""

    layer: int
    units: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "units", tuple(sorted(int(u) for u in self.units)))

    def label(self) -> str:
        return f"units:{self.layer}:{len(self.units)}:{digest(self.units)}"

    def layers(self) -> tuple[int, ...]:
        return (self.layer,)

    def validate(self, lm) -> None:
        d_mlp = lm.bridge.cfg.d_mlp
        if self.units and (min(self.units) < 0 or max(self.units) >= d_mlp):
            raise ValueError(f"AblateUnits names unit {max(self.units)}, but layer {self.layer} has {d_mlp} units")

    def edits(self, lm) -> list[tuple[str, Edit]]:
        def zero_units(act: Float[Tensor, "batch pos d_mlp"], hook) -> Tensor:
            units = torch.tensor(self.units, device=act.device, dtype=torch.long)
            return act * torch.ones(act.shape[-1], device=act.device, dtype=act.dtype).index_fill(0, units, 0.0)

        return [(site_hook(lm, "mlp.hook_post", self.layer), zero_units)]


@register
@dataclass(frozen=True)
class Route(Intervention):
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


@register
@dataclass(frozen=True)
class AblateHead(Intervention):
    """Zero one attention head's output: its slice of ``attn.hook_z`` ([batch, pos,
    head, d_head], the heads' outputs before the output projection)."""

    layer: int
    head: int

    def label(self) -> str:
        return f"head:{self.layer}:{self.head}"

    def layers(self) -> tuple[int, ...]:
        return (self.layer,)

    def validate(self, lm) -> None:
        check_head(lm, self.head)

    def edits(self, lm) -> list[tuple[str, Edit]]:
        def zero_head(act: Float[Tensor, "batch pos head d_head"], hook) -> Tensor:
            out = act.clone()
            out[:, :, self.head] = 0
            return out

        return [(site_hook(lm, "attn.hook_z", self.layer), zero_head)]


@register
@dataclass(frozen=True)
class SAEFeature(Intervention):
    """Set one feature of a SAELens SAE (the folder `sae`) at the SAE's hook point, every
    position: ``ablate`` takes the feature's contribution out (its activation to 0),
    ``clamp`` sets its activation to `value`. The activation x becomes
    ``x + (target - f(x)) * W_dec[feature]``, f(x) the feature's activation: the rest of
    x, the SAE's reconstruction error included, stays."""

    sae: str
    feature: int
    mode: Literal["ablate", "clamp"] = "ablate"
    value: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "sae", str(self.sae))
        if self.mode not in ("ablate", "clamp"):
            raise ValueError(f"SAEFeature.mode must be 'ablate' or 'clamp', got {self.mode!r}")
        if self.mode == "ablate" and self.value != 0:
            raise ValueError("SAEFeature: an ablation sets the feature to 0; clamp it to set another value")

    def label(self) -> str:
        # the folder's name and the SAE's hook: two SAEs read apart on any machine
        where = f"{Path(self.sae).name}@{load_sae(self.sae).hook_name}"
        return f"sae:{self.mode}:{where}:{self.feature}" + (f":{self.value:g}" if self.mode == "clamp" else "")

    def layers(self) -> tuple[int, ...]:
        return (sae_point(self.sae)[1],)

    def validate(self, lm) -> None:
        sae, layer, site = sae_point(self.sae)
        sae.check_feature(self.feature)
        site_hook(lm, site, layer)

    def edits(self, lm) -> list[tuple[str, Edit]]:
        sae, layer, site = sae_point(self.sae)

        def set_feature(act: Float[Tensor, "batch pos d"], hook) -> Tensor:
            if act.shape[-1] != sae.d_in:
                raise ValueError(f"the SAE in {self.sae} reads {sae.d_in}-dimensional activations, "
                                 f"{hook.name if hook else sae.hook_name} has {act.shape[-1]}")
            f = sae.encode(act)[..., self.feature]
            d = sae.direction(self.feature).to(act.device)
            return (act.float() + (self.value - f)[..., None] * d).to(act.dtype)

        return [(site_hook(lm, site, layer), set_feature)]


def sae_point(folder: str | Path) -> tuple[SAE, int, str]:
    """The SAELens SAE in `folder`, and the block and site of the hook point it reads."""
    sae = load_sae(folder)
    layer, site = split_hook_name(sae.hook_name)
    if layer is None:
        raise ValueError(f"the SAE in {folder} reads {sae.hook_name!r}, not a block's hook point")
    return sae, layer, site


@dataclass(frozen=True, eq=False)
class Patch(Intervention):
    """Activation patching: replace the activation at `site` of block `layer` by
    `source`, the same point's activation in another run of the same batch shape (the
    clean run, patched into the corrupted one). With `head`, only that head's slice of a
    [batch, pos, head, ...] site such as ``attn.hook_z``; with `position`, only that
    position (negative: from the end, where left-padded prompts line up). Not
    registered, since its values live in memory rather than in records; specs compare by
    identity."""

    layer: int
    site: str
    source: Tensor = dataclasses.field(repr=False)
    head: int | None = None
    position: int | None = None

    def label(self) -> str:
        return (f"patch:{self.site}:{self.layer}" + (f":head{self.head}" if self.head is not None else "")
                + (f":pos{self.position}" if self.position is not None else ""))

    def layers(self) -> tuple[int, ...]:
        return (self.layer,)

    def validate(self, lm) -> None:
        site_hook(lm, self.site, self.layer)
        if self.head is not None:
            check_head(lm, self.head)

    def edits(self, lm) -> list[tuple[str, Edit]]:
        def patch(act: Tensor, hook) -> Tensor:
            if self.source.shape != act.shape:
                raise ValueError(f"Patch source has shape {tuple(self.source.shape)} but {hook.name if hook else self.site} "
                                 f"has {tuple(act.shape)}: patch runs of equal token lengths")
            source = self.source.to(act.device, act.dtype)
            if self.head is None and self.position is None:
                return source
            at = (slice(None), slice(None) if self.position is None else self.position,
                  *(() if self.head is None else (self.head,)))
            out = act.clone()
            out[at] = source[at]
            return out

        return [(site_hook(lm, self.site, self.layer), patch)]


def check_head(lm, head: int) -> None:
    n_heads = lm.bridge.cfg.n_heads
    if not 0 <= head < n_heads:
        raise ValueError(f"head {head} does not exist: the model has heads 0..{n_heads - 1}")


def first_layer(specs: Sequence[Intervention]) -> int | None:
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


InterventionSet = tuple[Intervention, ...]


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


class BatchRows:
    """Which specs each row of the batch carries, while an `applied` block is in force.
    `select` and `repeat_interleave` keep the assignment aligned when the caller
    reorders the batch (dropping finished rows, expanding a prompt to K samples); hooks
    read it when they run, so nothing is re-registered."""

    def __init__(self, row_sets: list[InterventionSet], device: torch.device, shared: bool = False):
        self.row_sets = row_sets
        self.device = device
        #: one set for every row, whatever the batch size: no per-row masks needed
        self.shared = shared
        #: fixed at entry: hooks stay registered even when select() drops every row of a spec
        self.specs: list[Intervention] = list(dict.fromkeys(s for r in row_sets for s in r))
        #: the batch rows a block is running on now, where it runs on some only (else None)
        self.running: Int[Tensor, "rows"] | None = None
        self._rows: dict[Intervention, Bool[Tensor, "batch"]] = {}
        self._rebuild()

    def _rebuild(self) -> None:
        if self.shared:
            return
        masks = {s: [False] * len(self.row_sets) for s in self.specs}
        for r, specs in enumerate(self.row_sets):
            for s in specs:
                masks[s][r] = True
        self._rows = {s: torch.tensor(m, device=self.device) for s, m in masks.items()}

    def select(self, index: Sequence[int] | Tensor) -> None:
        """Keep these rows of the batch, in this order."""
        if self.shared:
            return
        index = index.tolist() if isinstance(index, Tensor) else [int(i) for i in index]
        self.row_sets = [self.row_sets[i] for i in index]
        self._rebuild()

    def repeat_interleave(self, k: int) -> None:
        """Each row becomes k consecutive rows."""
        if self.shared:
            return
        self.row_sets = [s for s in self.row_sets for _ in range(k)]
        self._rebuild()

    @contextlib.contextmanager
    def restricted(self, rows: Sequence[int]) -> Iterator[None]:
        """The batch is these rows only, for the body (a prefill run in groups)."""
        saved = self.row_sets
        self.select(rows)
        try:
            yield
        finally:
            if not self.shared:
                self.row_sets = saved
                self._rebuild()

    def rows_of(self, spec: Intervention) -> Bool[Tensor, "batch"] | None:
        """Which rows of the batch running now carry `spec` (None: every row)."""
        if self.shared:
            return None
        rows = self._rows[spec]
        return rows if self.running is None else rows[self.running]

    def mask(self, spec: Intervention) -> "RowMask":
        return RowMask(self, spec)


class RowMask:
    """The rows of the batch one spec applies to, read when its hook runs (the batch
    shrinks as rows finish, and a block may run on some rows only). What a spec's
    `hooks` build their hooks from: `edit` turns a whole-batch edit into a hook that
    changes these rows only."""

    def __init__(self, batch: BatchRows, spec: Intervention):
        self.batch, self.spec = batch, spec

    def __call__(self, act: Tensor) -> Bool[Tensor, "batch ..."] | None:
        """A mask that broadcasts against `act` (batch first), or None for every row."""
        rows = self.batch.rows_of(self.spec)
        if rows is None:
            return None
        if rows.shape[0] != act.shape[0]:
            raise RuntimeError(
                f"intervention rows ({rows.shape[0]}) do not match the batch ({act.shape[0]}); "
                "call select/repeat_interleave on the applied batch when reshaping it"
            )
        return rows.view(-1, *([1] * (act.ndim - 1)))

    def where(self, act: Tensor, edited: Tensor) -> Tensor:
        """`edited` in this spec's rows, `act` in every other."""
        mask = self(act)
        return edited if mask is None else torch.where(mask, edited, act)

    def edit(self, edit: Edit) -> Callable[..., Tensor]:
        """A hook applying `edit` to this spec's rows only."""
        def hook(act: Tensor, hook=None) -> Tensor:
            return self.where(act, edit(act, hook))

        return hook


def batch_hooks(lm, batch: BatchRows) -> list[Hook]:
    """Every spec's hooks for `batch`, those that save an input first."""
    hooks = [h for spec in batch.specs for h in spec.hooks(lm, batch.mask(spec))]
    # Inputs are saved before any hook at the same point changes them (stable sort).
    return sorted(hooks, key=lambda h: not getattr(h[1], "saves_input", False))


def row_sets(lm, rows: Sequence[Intervention] | Sequence[Sequence[Intervention]] | None,
             batch_size: int | None) -> tuple[list[InterventionSet], list[Route | None], bool]:
    """`rows` (one set for every row, or one set per row) checked against `lm`: each
    row's set without its `Route`, each row's route (None: the full path), and whether
    one set serves every row."""
    rows = list(rows or ())
    shared = not rows or not isinstance(rows[0], (list, tuple))
    sets = [tuple(rows)] * (batch_size or 1) if shared else [tuple(r) for r in rows]
    _validate(lm, {s for r in sets for s in r})
    routes = [next((s for s in r if isinstance(s, Route)), None) for r in sets]
    return [tuple(s for s in r if not isinstance(s, Route)) for r in sets], routes, shared


def _validate(lm, specs: Iterable[Intervention]) -> None:
    n = lm.n_layers
    for s in specs:
        if not isinstance(s, Intervention):
            raise TypeError(f"{s!r} is not an intervention spec (a subclass of Intervention)")
        bad = [i for i in s.layers() if not 0 <= i < n]
        if bad:
            raise ValueError(f"{type(s).__name__} names layer {bad[0]}, but the model has layers 0..{n - 1}")
        s.validate(lm)


@contextlib.contextmanager
def installed(lm, batch: BatchRows, path: Sequence[int] | None = None, run_slot: "RunSlot | None" = None) -> Iterator[None]:
    """`batch`'s hooks, and the decoder on the layer list `path` (None: its own), for
    the body; the model is restored on exit, also when the body raises."""
    with contextlib.ExitStack() as stack:
        if path is not None:
            stack.enter_context(routed(lm, path, run_slot=run_slot))
        hooks = batch_hooks(lm, batch)
        if hooks:
            stack.enter_context(lm.bridge.hooks(fwd_hooks=hooks))
        yield


@contextlib.contextmanager
def applied(
    lm,
    rows: Sequence[Intervention] | Sequence[Sequence[Intervention]] | None = None,
    batch_size: int | None = None,
) -> Iterator[BatchRows]:
    """Install interventions for the body of the block, restoring the model exactly on
    exit (also when the body raises). Your own `run_with_hooks`, `run_with_cache` and
    `bridge.hooks()` compose with it.

    ``rows`` is either one set (applies to every row) or one set per batch row. Rows may
    share one `Route`; a batch whose rows take different routes runs through the
    engine (`engine.batch.batch_applied`, `engine.generate.generate`), which gives each
    route position its own KV-cache entry and rows."""
    sets, routes, shared = row_sets(lm, rows, batch_size)
    if len(set(routes)) > 1:
        raise ValueError("rows on different routes need the engine's batch: use engine.batch.batch_applied "
                         "or engine.generate.generate")
    batch = BatchRows(sets, lm.device, shared=shared)
    with installed(lm, batch, routes[0].path if routes and routes[0] is not None else None):
        yield batch


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


#: run_slot(slot, block, args, kwargs): runs a route position for the rows it applies to
#: (the engine's batch, `engine.batch.Batch.run_slot`, for rows on routes of their own)
RunSlot = Callable[[int, Callable[..., Any], tuple, dict], Any]


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
def layer_list(lm, modules: list[nn.Module], layer_types: list[str] | None) -> Iterator[None]:
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


def current_layers(lm) -> tuple[list[nn.Module], list[str] | None]:
    """The decoder's block list now (a route's while one is applied) and its layer types."""
    owner, attr = _decoder_layers(lm.hf_model)
    return list(getattr(owner, attr)), getattr(lm.hf_model.config.get_text_config(), "layer_types", None)


@contextlib.contextmanager
def routed(lm, path: Sequence[int], run_slot: RunSlot | None = None) -> Iterator[None]:
    """Swap the decoder's block list for `path`, one KV-cache slot per position
    (`run_slot`: runs each position for the rows it applies to, for rows with routes of
    their own)."""
    blocks, layer_types = current_layers(lm)
    slots = []
    for slot, layer in enumerate(path):
        atype = layer_types[layer] if layer_types is not None else None
        slots.append(_RouteSlot(blocks[layer], layer, slot, getattr(blocks[layer], "attention_type", atype), run_slot))
    with layer_list(lm, slots, [layer_types[i] for i in path] if layer_types is not None else None):
        yield
