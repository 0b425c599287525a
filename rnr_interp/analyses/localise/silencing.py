"""How a sweep silences a block: nothing in its place (zero, the paper's), its mean write
over the task's prompts (``--ablation mean``), or, for an MLP, its top units along its
own failure direction alone (``--units``). `repair`'s sweep and the tie rule
(`choice.break_tie`) build their specs here."""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

import torch
from jaxtyping import Float
from torch import Tensor

from rnr_interp.analyses.localise.directions import check_units, mlp_unit_sets
from rnr_interp.engine.generate import forward, left_pad
from rnr_interp.engine.sampling import chunks, prompt_ids
from rnr_interp.interventions import COMPONENT_SITE, Ablate, AblateUnits, Intervention, capturing, check_ablation, site_hook
from rnr_interp.models import LoadedModel
from rnr_interp.tasks.base import Question, Task


@torch.inference_mode()
def block_means(lm: LoadedModel, prompts: Sequence[Sequence[int]], blocks: Sequence[tuple[int, str]],
                batch_size: int = 16) -> dict[tuple[int, str], Float[Tensor, "d"]]:
    """What each block (layer, component) writes into the residual stream, averaged over
    every position of `prompts` (padding left out): the write mean ablation puts in its
    place. A whole layer's write is its output minus its input."""
    sites = {(site, layer) for layer, c in blocks for site in (("hook_resid_pre", "hook_resid_post") if c == "layer"
                                                                  else (COMPONENT_SITE[c],))}
    names = {key: site_hook(lm, *key) for key in sites}
    sums: dict[tuple[str, int], Tensor] = {key: torch.zeros(()) for key in sites}
    count = 0
    for batch in chunks(list(prompts), batch_size):
        ids, mask = left_pad(batch, lm.pad_id, lm.device)
        real = mask.bool()
        with capturing(lm, list(dict.fromkeys(names.values())), keep=lambda act: act[real].float().sum(0).cpu()) as acts:
            forward(lm, ids, mask, last_only=True)  # only the captured sums are kept
        for key, name in names.items():
            sums[key] = sums[key] + acts[name][0]
        count += int(real.sum())
    mean = {key: total / count for key, total in sums.items()}
    return {(layer, c): (mean["hook_resid_post", layer] - mean["hook_resid_pre", layer] if c == "layer"
                         else mean[COMPONENT_SITE[c], layer]) for layer, c in blocks}


def silencers(lm: LoadedModel, task: Task, blocks: Sequence[tuple[int, str]], ablation: str = "zero",
              batch_size: int = 16, units: int | None = None,
              selection: tuple[Sequence[Question], Sequence[Question]] = ((), ()),
              contexts: Mapping[str, Sequence[int]] | None = None) -> dict[tuple[int, str], Intervention]:
    """The spec that silences each block (layer, component) under `ablation`
    (`interventions.ABLATION_MODES`): "zero", or "mean", its mean write over every
    prompt position of the task's questions as deployed (`block_means`: all of them,
    failures and panel alike, so the reference does not depend on the cohort). With
    `units`, an MLP block is silenced in its `units` units alone (`mlp_unit_sets`, read
    at the end of each selection question's context in `contexts`, else its prompt)."""
    check_ablation(ablation)
    check_units(units)
    unit_sets = mlp_unit_sets(lm, task, [layer for layer, c in blocks if c == "mlp"], units, *selection,
                              batch_size=batch_size, contexts=contexts) if units else {}
    out: dict[tuple[int, str], Intervention] = {
        (layer, "mlp"): AblateUnits(layer, chosen) for layer, chosen in unit_sets.items()}
    rest = [(layer, c) for layer, c in blocks if (layer, c) not in out]
    if ablation == "zero" or not rest:  # no block left to silence by its mean: no pass to read means
        return {**out, **{(layer, c): Ablate(c, layer) for layer, c in rest}}
    means = block_means(lm, [prompt_ids(lm, task, q) for q in task.questions], rest, batch_size)
    return {**out, **{(layer, c): Ablate(c, layer, "mean", tuple(means[layer, c].tolist())) for layer, c in rest}}


def units_column(spec: Intervention | None) -> str:
    """A repair table's ``silenced_units`` entry for the spec that silenced its row:
    the units, "|"-joined; "" for a whole block (or no row)."""
    return "|".join(str(u) for u in spec.units) if isinstance(spec, AblateUnits) else ""


def as_swept(lm: LoadedModel, task: Task, table: pd.DataFrame, blocks: Sequence[tuple[int, str]],
             ablation: str = "zero", batch_size: int = 16) -> dict[tuple[int, str], Intervention]:
    """The spec a sweep silenced each block (layer, component) with, read back from its
    repair table: the units a row's ``silenced_units`` names (so they are not chosen
    again), else the block under `ablation` (`silencers`)."""
    named = table.set_index(["layer", "component"])["silenced_units"] if "silenced_units" in table else pd.Series(dtype=str)
    out: dict[tuple[int, str], Intervention] = {
        (layer, c): AblateUnits(layer, tuple(int(u) for u in str(named[layer, c]).split("|")))
        for layer, c in blocks if named.get((layer, c), "")}
    return {**out, **silencers(lm, task, [block for block in blocks if block not in out], ablation, batch_size)}
