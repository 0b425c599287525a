"""Activation patching, the standard attribution sweep: run the clean prompts and the
corrupted ones (equal token lengths, pair by pair), then rerun each corrupted prompt
with one piece of the model's activations taken from its clean run (one attention
head's output, or one layer's activation at a site) and see how much of the clean
answer's lead comes back.

The score of a pair is the logit difference ``logit[answer] - logit[wrong]`` at the last
position; a patched run's `recovered` is ``(patched - corrupted) / (clean - corrupted)``
(1: the patched piece carries the whole difference, 0: none of it; NaN where clean and
corrupted score the same). Patched runs go through the hook registry (`interventions.Patch`),
many cells per batch, each row patching its own.
"""

from __future__ import annotations

from typing import Literal, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from rnr_interp.engine.generate import forward, left_pad
from rnr_interp.interventions import Intervention, Patch, applied, capturing, site_hook
from rnr_interp.models import LoadedModel

#: the site a head-level sweep patches: each head's output before the output projection
HEAD_SITE = "attn.hook_z"
#: the columns of a sweep's table, one row per (pair, layer, head, position)
COLUMNS = ["pair", "site", "layer", "head", "position", "logit_diff", "clean_logit_diff", "corrupted_logit_diff", "recovered"]


def patching_sweep(
    lm: LoadedModel,
    clean: Sequence[str | Sequence[int]],
    corrupted: Sequence[str | Sequence[int]],
    answers: Sequence[tuple[int | str, int | str]],
    level: Literal["head", "layer"] = "head",
    site: str = "hook_resid_pre",
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    rows_per_batch: int = 64,
) -> pd.DataFrame:
    """Patch every head (`level="head"`, at ``attn.hook_z``) or every layer's `site`
    (`level="layer"`) of `layers` (default all) from each clean prompt into its corrupted
    twin. Prompts are token ids or text (encoded as given, `lm.encode`: pass
    `lm.render(question)` for the chat prompt); `answers[i]` = (answer, wrong answer) of
    pair i, token ids or texts of one token each. `positions` (negative, counted from
    the end: -1 is the last token) patches each position apart, else every position at
    once; patching a residual-stream site at every position carries the whole clean run
    (recovered 1 at every layer), so that one wants positions. One row per (pair, layer,
    head, position) in `COLUMNS` (head missing at the layer level, position when every
    position is patched)."""
    clean, corrupted = ([lm.encode(p) if isinstance(p, str) else list(p) for p in ps] for ps in (clean, corrupted))
    answers = [tuple(_one_token(lm, a) for a in pair) for pair in answers]
    _check_pairs(clean, corrupted, answers)
    if level not in ("head", "layer"):
        raise ValueError(f"level must be 'head' or 'layer', got {level!r}")
    if rows_per_batch < 1:
        raise ValueError(f"rows_per_batch must be at least 1, got {rows_per_batch}")
    site = HEAD_SITE if level == "head" else site
    layers = list(range(lm.n_layers)) if layers is None else [int(layer) for layer in layers]
    heads = list(range(lm.bridge.cfg.n_heads)) if level == "head" else [None]
    shortest = min(len(p) for p in clean)
    if positions is not None and not all(-shortest <= int(p) < 0 for p in positions):
        raise ValueError(f"positions count from the end of the prompts: -1..-{shortest} here, got {list(positions)}")
    spots = [None] if positions is None else [int(p) for p in positions]
    cells = [(layer, head, spot) for layer in layers for head in heads for spot in spots]

    ids, mask = left_pad([*clean, *corrupted], lm.pad_id, lm.device)
    n = len(clean)
    names = {layer: site_hook(lm, site, layer) for layer in layers}
    with torch.inference_mode(), capturing(lm, list(names.values())) as got:
        clean_logits = forward(lm, ids[:n], mask[:n], last_only=True)[0][:, -1]
    sources = {layer: got[name][0] for layer, name in names.items()}
    answer = torch.tensor(answers, device=lm.device)
    clean_diff = _logit_diff(clean_logits, answer)
    corrupted_diff = _logit_diff(_last_logits(lm, ids[n:], mask[n:], ()), answer)

    rows = [(pair, cell) for pair in range(n) for cell in cells]
    patched: list[float] = []
    for start in range(0, len(rows), rows_per_batch):
        chunk = rows[start:start + rows_per_batch]
        pairs = torch.tensor([pair for pair, _ in chunk], device=lm.device)
        # One spec per cell of the chunk, its source the clean activations of the chunk's rows.
        specs = {cell: Patch(cell[0], site, sources[cell[0]][pairs], head=cell[1], position=cell[2])
                 for cell in dict.fromkeys(c for _, c in chunk)}
        logits = _last_logits(lm, ids[n:][pairs], mask[n:][pairs], [[specs[cell]] for _, cell in chunk])
        patched += _logit_diff(logits, answer[pairs]).tolist()

    table = pd.DataFrame([
        {"pair": pair, "site": site, "layer": layer, "head": head, "position": spot, "logit_diff": diff,
         "clean_logit_diff": float(clean_diff[pair]), "corrupted_logit_diff": float(corrupted_diff[pair])}
        for (pair, (layer, head, spot)), diff in zip(rows, patched)
    ])
    table[["head", "position"]] = table[["head", "position"]].astype("Int64")
    gap = table["clean_logit_diff"] - table["corrupted_logit_diff"]
    table["recovered"] = (table["logit_diff"] - table["corrupted_logit_diff"]) / gap.where(gap != 0)
    return table[COLUMNS]


def _one_token(lm: LoadedModel, answer: int | str) -> int:
    if not isinstance(answer, str):
        return int(answer)
    ids = lm.tokenizer(answer, add_special_tokens=False).input_ids
    if len(ids) != 1:
        raise ValueError(f"answer {answer!r} is {len(ids)} tokens; the logit difference needs one token each")
    return ids[0]


def _check_pairs(clean: Sequence[Sequence[int]], corrupted: Sequence[Sequence[int]], answers: Sequence[tuple[int, int]]) -> None:
    if not clean or len(clean) != len(corrupted) or len(clean) != len(answers):
        raise ValueError(f"patching needs as many clean prompts, corrupted prompts and answer pairs, at least one "
                         f"(got {len(clean)}, {len(corrupted)}, {len(answers)})")
    for i, (a, b) in enumerate(zip(clean, corrupted)):
        if len(a) != len(b):
            raise ValueError(f"pair {i}: the clean prompt has {len(a)} tokens and the corrupted one {len(b)}; "
                             "patching needs equal lengths")


@torch.inference_mode()
def _last_logits(lm: LoadedModel, ids: Int[Tensor, "b t"], mask: Int[Tensor, "b t"],
                 rows: Sequence[Sequence[Intervention]]) -> Float[Tensor, "b v"]:
    with applied(lm, rows if rows else None, batch_size=ids.shape[0]):
        return forward(lm, ids, mask, last_only=True)[0][:, -1].float()


def _logit_diff(logits: Float[Tensor, "b v"], answer: Int[Tensor, "b 2"]) -> Float[Tensor, "b"]:
    picked = logits.float().gather(-1, answer)
    return picked[:, 0] - picked[:, 1]


def mean_recovered(table: pd.DataFrame) -> pd.DataFrame:
    """The sweep's `recovered`, averaged over pairs: layers as rows, and as columns the
    heads, else the positions, else one column "layer"."""
    axis = next((c for c in ("head", "position") if table[c].notna().any()), None)
    column = table[axis].astype("object") if axis else pd.Series("layer", index=table.index)
    return table.assign(column=column).pivot_table(index="layer", columns="column", values="recovered", aggfunc="mean")
