"""Reading a block at the last position of each prompt: what it writes, the failure
direction v (mean write over the failure set minus over the healthy panel) and each MLP
unit's directional contribution along v. Steering, unit-level repair and the units
silencing sweep all read blocks here (`steering`, `repair`)."""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from rnr_interp.engine.generate import forward, left_pad
from rnr_interp.engine.sampling import chunks, prompt_ids
from rnr_interp.interventions import COMPONENT_SITE, SITES, capturing, family, site_hook
from rnr_interp.models import LoadedModel
from rnr_interp.tasks.base import Question, Task


@torch.inference_mode()
def last_position(lm: LoadedModel, prompts: Sequence[Sequence[int]], sites: Sequence[tuple[str, int]],
                  batch_size: int = 16) -> dict[tuple[str, int], Float[Tensor, "n d"]]:
    """Activations at the last prompt position (left padding puts it at -1) of each
    (site, layer), read through the registry's capture context."""
    names = {key: site_hook(lm, *key) for key in sites}
    got: dict[tuple[str, int], list[Tensor]] = {key: [] for key in sites}
    for batch in chunks(list(prompts), batch_size):
        ids, mask = left_pad(batch, lm.pad_id, lm.device)
        with capturing(lm, list(names.values()), keep=lambda act: act[:, -1].detach().float().cpu()) as acts:
            forward(lm, ids, mask, last_only=True)  # only the captured activations are kept
        for key, name in names.items():
            got[key] += acts[name]
    return {key: torch.cat(v) if v else torch.zeros(0) for key, v in got.items()}


def write_sites(layers: Sequence[int], component: str) -> list[tuple[str, int]]:
    """The sites `block_writes` reads each block (layer, component)'s write from: a
    whole layer's is what it adds between its residual stream's ends."""
    if component == "layer":
        return [(site, layer) for layer in layers for site in ("hook_resid_pre", "hook_resid_post")]
    return [(COMPONENT_SITE[component], layer) for layer in layers]


def block_writes(acts: Mapping[tuple[str, int], Tensor], layers: Sequence[int],
                 component: str) -> dict[int, Float[Tensor, "n d"]]:
    """What block (layer, component) writes, from activations read at `write_sites`."""
    if component == "layer":
        return {layer: acts["hook_resid_post", layer] - acts["hook_resid_pre", layer] for layer in layers}
    return {layer: acts[COMPONENT_SITE[component], layer] for layer in layers}


def block_outputs(lm: LoadedModel, prompts: Sequence[Sequence[int]], layers: Sequence[int], component: str,
                  batch_size: int = 16) -> dict[int, Float[Tensor, "n d"]]:
    """What block (layer, component) writes into the residual stream at the last
    position, for every layer of `layers`, in one pass over `prompts`."""
    return block_writes(last_position(lm, prompts, write_sites(layers, component), batch_size), layers, component)


def block_output(lm: LoadedModel, prompts: Sequence[Sequence[int]], layer: int, component: str,
                 batch_size: int = 16) -> Float[Tensor, "n d"]:
    """What block (layer, component) writes into the residual stream, last position."""
    return block_outputs(lm, prompts, [layer], component, batch_size)[layer]


def unembedded(lm: LoadedModel, resid: Float[Tensor, "n d"]) -> Float[Tensor, "n vocab"]:
    """The logits final residual states give: through the bridge's final norm
    (``ln_final``) and unembedding (``unembed``), then the logit soft cap where the
    model's config has one (the HF model applies it after its output embedding)."""
    norm, unembed = lm.bridge.ln_final, lm.bridge.unembed
    dtype = next(unembed.parameters()).dtype
    with torch.inference_mode():
        logits = unembed(norm(resid.to(lm.device, dtype)[:, None]))[:, 0].float().cpu()
    cap = getattr(lm.hf_model.config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def mean_difference(out: Float[Tensor, "n d"], n_failure: int) -> Float[Tensor, "d"]:
    """v from a block's writes over the failures (the first `n_failure` rows) and then
    the panel: the failures' mean write minus the panel's."""
    return out[:n_failure].mean(0) - out[n_failure:].mean(0)


def read_ids(lm: LoadedModel, task: Task, questions: Sequence[Question],
             contexts: Mapping[str, Sequence[int]] | None) -> list[Sequence[int]]:
    """The token ids each question is read at the last position of: its context
    (`positions.reading_contexts`, by question id), else its prompt."""
    return [contexts[q.id] if contexts is not None and q.id in contexts else prompt_ids(lm, task, q) for q in questions]


def direction(lm: LoadedModel, task: Task, failure: Sequence[Question], panel: Sequence[Question], layer: int,
              component: str, batch_size: int = 16, contexts: Mapping[str, Sequence[int]] | None = None,
              ) -> Float[Tensor, "d"]:
    """v = mean block output over the failure set - mean over the panel, each read at
    the last position of its context (`read_ids`)."""
    if not failure or not panel:
        raise ValueError(f"the steering direction needs a non-empty failure set and panel (got {len(failure)} and {len(panel)})")
    out = block_output(lm, read_ids(lm, task, [*failure, *panel], contexts), layer, component, batch_size)
    return mean_difference(out, len(failure))


def unit_sites(lm: LoadedModel, layer: int) -> list[tuple[str, int]]:
    """The sites `contributions` reads at MLP `layer`: the units' activations, and with
    a post-MLP norm the norm's input and output."""
    norm_site = "post_mlp_norm" in SITES[family(lm)]
    return [("mlp.hook_post", layer)] + ([("mlp.hook_out", layer), ("hook_mlp_out", layer)] if norm_site else [])


def contributions(lm: LoadedModel, acts: Mapping[tuple[str, int], Tensor], layer: int, v: Tensor) -> Float[Tensor, "n d_mlp"]:
    """`unit_contributions` from activations already read at `unit_sites` (a
    `last_position` result holding them)."""
    w_out = lm.bridge.blocks[layer].mlp.W_out.detach().float().cpu()  # (d_mlp, d_model)
    post = acts[("mlp.hook_post", layer)]
    v = v.float().cpu()
    if "post_mlp_norm" not in SITES[family(lm)]:
        return post * (w_out @ v)
    norm = lm.bridge.get_submodule(site_hook(lm, "post_mlp_norm", layer))
    ones = torch.ones(1, 1, w_out.shape[1], dtype=next(norm.parameters()).dtype, device=lm.device)
    with torch.inference_mode():
        gain: Float[Tensor, "d"] = norm(ones)[0, 0].float().cpu()
    m, y = acts[("mlp.hook_out", layer)], acts[("hook_mlp_out", layer)]
    gm = gain * m
    c: Float[Tensor, "n"] = (y * gm).sum(-1) / (gm * gm).sum(-1).clamp_min(1e-30)
    return (post * c[:, None]) * ((w_out * gain) @ v)


def unit_contributions(lm: LoadedModel, prompts: Sequence[Sequence[int]], layer: int, v: Tensor,
                       batch_size: int = 16) -> Float[Tensor, "n d_mlp"]:
    """Per prompt (last position) and MLP unit i of `layer`: how far the unit's write
    moves the residual stream along v, in the basis the block writes to the stream.
    Without a post-MLP norm that is ``act_i * (W_out[i] . v)``. With one (the site
    table's ``post_mlp_norm``, Gemma-2/3) the stream receives ``norm(m)``, m = sum_i
    act_i W_out[i]; an RMSNorm is ``c(m) * (g * m)`` with g its gain (the norm of a
    vector of ones, up to a constant) and c a scalar per prompt, found exactly by least
    squares from the norm's input and output, so unit i writes ``act_i * c * (g *
    W_out[i])``. The contributions of a prompt sum to ``(block output - bias) . v``."""
    return contributions(lm, last_position(lm, prompts, unit_sites(lm, layer), batch_size), layer, v)


def unit_scores(lm: LoadedModel, task: Task, failure: Sequence[Question], layer: int, v: Tensor,
                batch_size: int = 16, contexts: Mapping[str, Sequence[int]] | None = None) -> Float[Tensor, "d_mlp"]:
    """Directional contribution of each MLP unit of `layer` along v (`unit_contributions`),
    averaged over the failure set at the last position of each context (`read_ids`)."""
    return unit_contributions(lm, read_ids(lm, task, failure, contexts), layer, v, batch_size).mean(0)


def top_units(scores: Tensor, k: int) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.argsort(scores, descending=True, stable=True)[:k])


def check_units(units: int | None) -> None:
    if units is not None and (isinstance(units, bool) or not isinstance(units, int) or units < 1):
        raise ValueError(f"units must be a whole number of at least 1 (units silenced per MLP block), got {units!r}")


def mlp_unit_sets(lm: LoadedModel, task: Task, layers: Sequence[int], k: int, failure: Sequence[Question],
                  panel: Sequence[Question], batch_size: int = 16,
                  contexts: Mapping[str, Sequence[int]] | None = None) -> dict[int, tuple[int, ...]]:
    """Per MLP block of `layers`: its k units with the largest directional contribution
    along that block's own failure direction (as `direction` and `unit_scores` read
    them, at the last position of each context, `read_ids`: the prompt's end unless
    `contexts` says otherwise, as `rnr units --read-at` scores the chosen block), every
    block read in one pass over the questions. `failure` and `panel` are the selection
    parts: the sets are chosen without the held-out questions they are scored on."""
    if not failure or not panel:
        raise ValueError(f"silencing units needs a failure set and a panel in the selection part to score them "
                         f"(got {len(failure)} and {len(panel)}): silence whole blocks instead, or ask more questions")
    site = COMPONENT_SITE["mlp"]
    sites = list(dict.fromkeys(key for layer in layers for key in [(site, layer), *unit_sites(lm, layer)]))
    acts = last_position(lm, read_ids(lm, task, [*failure, *panel], contexts), sites, batch_size)
    n = len(failure)
    out = {}
    for layer in layers:
        v = mean_difference(acts[site, layer], n)
        on_failures = {key: act[:n] for key, act in acts.items() if key[1] == layer}
        out[layer] = top_units(contributions(lm, on_failures, layer, v).mean(0), k)
    return out
