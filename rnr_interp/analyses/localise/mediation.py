"""Which of several equally selective blocks the others act through.

A silencing sweep names every block whose removal stops a failure, the blocks that feed
the failing computation included: on a failure that a late MLP writes from features early
MLPs compute, silencing an early one repairs as well as silencing the late one, and both
rank alike. Silencing a block upstream of the writer moves the writer's failure write
back toward the healthy panel's; silencing the writer leaves the upstream blocks as they
were (a block cannot change what an earlier block writes). So among tied blocks the one
every earlier tied block acts through is the proximate one: the block the others' repair
runs through, and the one whose failure direction steering and the units analysis should
read. `choice.break_tie` uses it to break a sweep's ties.

Read at the last prompt position (as `directions` reads v), or at the end of each
question's reading context when the sweep reads there (`read_at`), on the selection part only:
for tied blocks A < B, the share of B's failure-minus-panel write along B's own failure
direction that silencing A removes, beyond what it moves on the panel:

    moved(A -> B) = (((f_B - f_B|A) - (p_B - p_B|A)) . v_B) / ((f_B - p_B) . v_B),   v_B = f_B - p_B

(f, p: mean writes over the failures and the panel; |A: with A silenced). Silencing an
early block shifts a later block's write on every question alike, by far more than the
failure direction's length (SmolLM2, MLP 1 silenced, block 18: 13 times it; a share
read on the failures alone swung from -34 to +12), and only the part it moves the
failures apart from the panel says the failure runs through B. A acts through B when
moved(A -> B) >= `ACTS_THROUGH`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from rnr_interp.analyses.localise.directions import block_outputs, mean_difference, read_ids
from rnr_interp.interventions import Intervention, applied
from rnr_interp.models import LoadedModel
from rnr_interp.tasks.base import Question, Task

#: the share of a later block's failure write that silencing an earlier one must remove
#: for the earlier one to count as acting through it (half the way to the panel)
ACTS_THROUGH = 0.5

RULE = (f"the latest tied block that every earlier tied block acts through (silencing it moves the later block's "
        f"failure write, beyond what it moves the panel's, along its own failure direction at least {ACTS_THROUGH:g} of "
        "the way to the panel's, where the sweep reads: the prompt's end unless read_at says otherwise; selection "
        "part); none: the earliest")


@torch.inference_mode()
def moved_shares(lm: LoadedModel, task: Task, failure: Sequence[Question], panel: Sequence[Question],
                 silence: Mapping[int, Intervention], component: str = "mlp",
                 batch_size: int = 16, contexts: Mapping[str, Sequence[int]] | None = None) -> dict[tuple[int, int], float]:
    """moved(A -> B) for every pair of layers A < B of `silence` (layer -> the spec that
    silences that block, as the sweep did): one forward over the failures and the
    panel, and one more per earlier block with it silenced, each question read at the
    end of its context (`read_ids`: its prompt unless `contexts` says otherwise)."""
    if not failure or not panel:
        raise ValueError(f"reading what tied blocks act through needs failures and a panel (got {len(failure)} and {len(panel)})")
    prompts = read_ids(lm, task, [*failure, *panel], contexts)
    n = len(failure)
    layers = sorted(silence)
    writes = block_outputs(lm, prompts, layers, component, batch_size)
    v = {b: mean_difference(writes[b], n) for b in layers}
    out: dict[tuple[int, int], float] = {}
    for a in layers[:-1]:
        with applied(lm, [silence[a]]):
            silenced = block_outputs(lm, prompts, [b for b in layers if b > a], component, batch_size)
        for b, write in silenced.items():
            gap = float(v[b] @ v[b])
            out[a, b] = float((v[b] - mean_difference(write, n)) @ v[b]) / gap if gap > 0 else float("nan")
    return out


def proximate(layers: Sequence[int], moved: Mapping[tuple[int, int], float]) -> int:
    """The latest of `layers` that every earlier one acts through (`RULE`); the earliest
    when none is (the earliest qualifies with no earlier block to act through it)."""
    ordered = sorted(layers)
    return max(b for b in ordered if all(moved.get((a, b), float("nan")) >= ACTS_THROUGH for a in ordered if a < b))


def tie_break(layers: Sequence[int], moved: Mapping[tuple[int, int], float]) -> dict[str, Any]:
    """The summary's record of a broken tie: the rule, every moved share, the block named."""
    return {"rule": RULE, "tied": sorted(layers), "named": proximate(layers, moved),
            "moved": [{"silenced": a, "block": b, "share": share} for (a, b), share in sorted(moved.items())]}
