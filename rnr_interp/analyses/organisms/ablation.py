"""A block's MLP silenced on the plain Hugging Face model as `rnr repair --ablation mean`
silences it on the bridge: writing its mean write over every prompt position of the
task's questions at every position (`localise.silencing.block_means`). The organisms
work on HF modules before any bridge exists; a test holds the two to the same answers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from rnr_interp.analyses.organisms.answers import prompt_format, view_of
from rnr_interp.interventions import decoder_blocks
from rnr_interp.tasks.base import Task


def post_mlp_norm(block: nn.Module) -> nn.Module | None:
    """The norm between the block's MLP and the residual stream (Gemma 2/3, OLMo 2), if any."""
    return getattr(block, "post_feedforward_layernorm", None)


def mlp_write(model: nn.Module, layer: int) -> nn.Module:
    """The module whose output is what block `layer`'s MLP writes into the stream: past
    the norm after it where there is one (the bridge's ``hook_mlp_out`` is there too)."""
    block = decoder_blocks(model)[layer]
    norm = post_mlp_norm(block)
    return block.mlp if norm is None else norm


@torch.no_grad()
def mean_write(model: nn.Module, tokenizer: Any, task: Task, layer: int) -> Float[Tensor, " d"]:
    """Block `layer`'s mean MLP write (`mlp_write`) over every prompt position of the task's questions."""
    chat, bos = prompt_format(tokenizer)
    view = view_of(tokenizer, chat, bos)
    writes: list[Tensor] = []
    hook = mlp_write(model, layer).register_forward_hook(lambda m, a, out: writes.append(out[0].float()))
    try:
        for q in task.questions:
            model(input_ids=torch.tensor([view.encode(view.render(task.user_message(q)))]))
    finally:
        hook.remove()
    return torch.cat(writes).mean(0)


@contextmanager
def mean_ablated(model: nn.Module, layer: int, mean: Float[Tensor, " d"]) -> Iterator[None]:
    """Inside it, block `layer`'s MLP writes `mean` (`mean_write`) at every position."""
    hook = mlp_write(model, layer).register_forward_hook(lambda m, a, out: mean.to(out.dtype).expand_as(out))
    try:
        yield
    finally:
        hook.remove()
