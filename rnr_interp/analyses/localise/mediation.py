"""Which of several equally selective blocks writes the failure, and which the others
act through.

A silencing sweep names every block whose removal stops a failure, the blocks that feed
the failing computation included: on a failure that a late MLP writes from features early
MLPs compute, silencing an early one repairs as well as silencing the late one, and both
rank alike. `choice.break_tie` names one of them by `RULE`, in two readings.

What writes it (`direct_shares`, the rule's first reading). A block that writes the
failure repairs through its own write; a block that feeds the writer repairs through the
later blocks. Read on the selection failures at the first answer token on which each
deployed reply leaves the gold (`positions.answer_fork`), as the margin
logit(gold token) - logit(failure's token):

    total(A)  = margin(A silenced) - margin
    direct(A) = margin(final residual + (A's write silenced - A's write)) - margin
    share(A)  = mean direct(A) / mean total(A)

(the final residual read intact, through the final norm and the output embedding,
`directions.unembedded`; the last block's share is 1 by construction). The tied block
with the largest mean direct effect, in nats, is named: the effect, not the share, since a
block whose silencing barely moves the margin there (total near 0) can have any share.
It is named only where its own write moves the margin toward the gold by at least
`WRITES_AT_LEAST` nats and by more than any other tied block's own write moves it either
way: the blocks that repair through later ones show how far a write that is not the
failure's moves the margin, and where no tied block stands out above that and above the
floor, none writes the failure into the logits (all repair through blocks after them) and
the second reading names one.

What acts through what (`moved_shares`, read where no failure's reply parts from its gold
on a token or no tied block's direct effect stands out, and recorded always). Silencing a
block upstream of the writer moves the writer's failure write back toward the healthy
panel's; silencing the writer leaves the upstream blocks as they were (a block cannot
change what an earlier block writes). So among tied blocks the one every earlier tied
block acts through is the proximate one.
Read at the last prompt position (as `directions` reads v), or at the end of each
question's reading context when the sweep reads there (`read_at`), on the selection part
only: for tied blocks A < B, the share of B's failure-minus-panel write along B's own
failure direction that silencing A removes, beyond what it moves on the panel:

    moved(A -> B) = (((f_B - f_B|A) - (p_B - p_B|A)) . v_B) / ((f_B - p_B) . v_B),   v_B = f_B - p_B

(f, p: mean writes over the failures and the panel; |A: with A silenced). Silencing an
early block shifts a later block's write on every question alike, by far more than the
failure direction's length (SmolLM2, MLP 1 silenced, block 18: 13 times it; a share
read on the failures alone swung from -34 to +12), and only the part it moves the
failures apart from the panel says the failure runs through B. A acts through B when
moved(A -> B) >= `ACTS_THROUGH`. On units organisms whose planted block tied with earlier
ones this reading named an earlier block in 4 of 4 ties, the direct effect the planted
one in 4 of 4 (docs/findings.md, "Ties told apart by what writes the failure"); `RULE`
names it in 9 of the 10 ties measured with the planted block among the tied ("The tie
rule on older organisms").
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from rnr_interp.analyses.localise.directions import (
    block_outputs, block_writes, last_position, mean_difference, read_ids, unembedded, write_sites)
from rnr_interp.analyses.localise.positions import answer_fork
from rnr_interp.interventions import Intervention, applied
from rnr_interp.models import LoadedModel
from rnr_interp.tasks.base import Question, Task

#: the share of a later block's failure write that silencing an earlier one must remove
#: for the earlier one to count as acting through it (half the way to the panel)
ACTS_THROUGH = 0.5

#: the least mean direct effect, in nats, that names a tied block as the failure's writer:
#: a write that moves the odds of the gold over the failure's token by under about 10%
#: does not write the failure, however far the other tied blocks' writes sit below it
WRITES_AT_LEAST = 0.1

RULE = ("the tied block whose own write carries the most of its repair straight to the logits (mean direct effect "
        "on logit(gold) - logit(failure's token), nats, at the first answer token each selection failure's deployed "
        f"reply parts from the gold), where that effect is at least {WRITES_AT_LEAST:g} nats and exceeds every other "
        "tied block's direct effect in size; "
        "where no reply parts from its gold on a token, or no tied block's effect stands out so: the latest tied block that every "
        "earlier tied block acts through (silencing it moves the later block's failure write, beyond what it moves "
        f"the panel's, along its own failure direction at least {ACTS_THROUGH:g} of the way to the panel's, where the "
        "sweep reads: the prompt's end unless read_at says otherwise; selection part); none: the earliest")


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


@torch.inference_mode()
def direct_shares(lm: LoadedModel, task: Task, failure: Sequence[Question], replies: Mapping[str, str],
                  silence: Mapping[int, Intervention], component: str = "mlp",
                  batch_size: int = 16) -> dict[int, dict[str, float]]:
    """Per layer of `silence` (layer -> the spec that silences that block, as the sweep
    did): the mean total and direct effect of silencing it on the gold-vs-failure margin
    where each failure's deployed reply (`replies`, by question id) leaves the gold, and
    direct / total (module docstring); {} when no reply parts from its gold on a token."""
    forks = [fork for q in failure if q.id in replies and (fork := answer_fork(lm, task, q, replies[q.id])) is not None]
    if not forks:
        return {}
    ids = [context for context, _, _ in forks]
    rows = torch.arange(len(forks))
    gold, wrong = torch.tensor([g for _, g, _ in forks]), torch.tensor([w for _, _, w in forks])
    final_site = ("hook_resid_post", lm.n_layers - 1)

    def margin(resid: Tensor) -> Tensor:
        logits = unembedded(lm, resid)
        return logits[rows, gold] - logits[rows, wrong]

    layers = sorted(silence)
    acts = last_position(lm, ids, [*write_sites(layers, component), final_site], batch_size)
    final, writes = acts[final_site], block_writes(acts, layers, component)
    intact = margin(final)
    out: dict[int, dict[str, float]] = {}
    for layer in layers:
        with applied(lm, [silence[layer]]):
            acts = last_position(lm, ids, [*write_sites([layer], component), final_site], batch_size)
        silenced_final, silenced_write = acts[final_site], block_writes(acts, [layer], component)[layer]
        total = float((margin(silenced_final) - intact).mean())
        direct = float((margin(final + silenced_write - writes[layer]) - intact).mean())
        out[layer] = {"total": total, "direct": direct, "share": direct / total if total else float("nan"),
                      "n": len(forks)}
    return out


def proximate(layers: Sequence[int], moved: Mapping[tuple[int, int], float]) -> int:
    """The latest of `layers` that every earlier one acts through (`RULE`); the earliest
    when none is (the earliest qualifies with no earlier block to act through it)."""
    ordered = sorted(layers)
    return max(b for b in ordered if all(moved.get((a, b), float("nan")) >= ACTS_THROUGH for a in ordered if a < b))


def writer(direct: Mapping[int, Mapping[str, float]]) -> int | None:
    """The block of `direct` (`direct_shares`) with the largest mean direct effect, when
    that effect is at least `WRITES_AT_LEAST` nats and exceeds every other block's direct
    effect in size; None when none stands out so, two equal ones included (module docstring)."""
    best = max(sorted(direct), key=lambda layer: direct[layer]["direct"])
    others = max((abs(reading["direct"]) for layer, reading in direct.items() if layer != best), default=0.0)
    return best if direct[best]["direct"] > others and direct[best]["direct"] >= WRITES_AT_LEAST else None


def tie_break(layers: Sequence[int], moved: Mapping[tuple[int, int], float],
              direct: Mapping[int, Mapping[str, float]] | None = None) -> dict[str, Any]:
    """The summary's record of a broken tie: the rule, every moved share and direct
    effect read, the block named and by which reading (`RULE`: the direct effect where
    it was read and one block's stands out, else what acts through what)."""
    written = writer(direct) if direct and set(direct) == set(layers) else None
    return {"rule": RULE, "tied": sorted(layers),
            "named": written if written is not None else proximate(layers, moved),
            "named_by": "direct effect" if written is not None else "acts through",
            "moved": [{"silenced": a, "block": b, "share": share} for (a, b), share in sorted(moved.items())],
            **({"direct": [{"block": layer, **reading} for layer, reading in sorted(direct.items())]} if direct else {})}
