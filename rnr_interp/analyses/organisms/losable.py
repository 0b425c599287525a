"""Where a drawn units organism goes: a block whose silencing the base model can bear
(`losable_layer`), since the organism's expectation, repair with damage near 0, cannot
hold in a block the base cannot lose."""

from __future__ import annotations

from typing import Any

from torch import nn

from rnr_interp.analyses.organisms.ablation import mean_ablated, mean_write
from rnr_interp.analyses.organisms.answers import deployed_answers, prompt_format, task_of
from rnr_interp.tasks.base import Task

#: a drawn units block is one whose silencing changes at most this share of the base
#: model's answers (`losable_layer`): the organism's expectation, repair with damage near
#: 0, cannot hold where silencing the block breaks the base (SmolLM2 on copy, mean
#: ablation: MLP 11 changes 24 of its 24 answers, MLP 17 11, MLPs 9, 10, 14 and 18 1 to 3)
LOSABLE_SHARE = 0.25


def answers_silenced(model: nn.Module, tokenizer: Any, task: Task, layer: int | None) -> list[str | None]:
    """The base model's greedy answer to each question as the task reads it (None where
    it states none), with MLP `layer` mean-ablated as the sweep silences it
    (`ablation.mean_ablated`). `layer` None: unsilenced."""
    chat, bos = prompt_format(tokenizer)
    if layer is None:
        return [said for _, said in deployed_answers(model, tokenizer, task, chat, bos)]
    with mean_ablated(model, layer, mean_write(model, tokenizer, task, layer)):
        return [said for _, said in deployed_answers(model, tokenizer, task, chat, bos)]


def losable_layer(model: nn.Module, tokenizer: Any, task: str | Task | None, drawn: int, layers: range
                  ) -> tuple[int, dict[str, Any]]:
    """The block the units kind plants in when the seed draws `drawn` from `layers`:
    `drawn`, or the next of `layers` after it (round the range) whose silencing
    (`answers_silenced`) changes at most `LOSABLE_SHARE` of the base's answers; where
    none does, the one that changes fewest (the first of them in that order). With what
    planted.json records of the choice: the drawn layer and the share each block tried
    changes."""
    questions = task_of(task, "units")
    before = answers_silenced(model, tokenizer, questions, None)
    order = [*range(drawn, layers.stop), *range(layers.start, drawn)]
    shares: dict[int, float] = {}
    for layer in order:
        after = answers_silenced(model, tokenizer, questions, layer)
        shares[layer] = sum(a != b for a, b in zip(after, before)) / len(before)
        if shares[layer] <= LOSABLE_SHARE:
            break
    else:
        layer = min(order, key=shares.__getitem__)
    return layer, {"drawn_layer": drawn, "base_answers_changed_by_silencing": {str(k): v for k, v in shares.items()}}
