"""The layer organism: a copy of a decoder layer inserted beside it, its writes to the
residual stream scaled by the strength (``layer``; ``null`` is strength 0 at a drawn
layer). Skipping or silencing the copy gives back the base model exactly.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from rnr_interp.interventions import decoder_blocks
from rnr_interp.models import ModelSpecError
from rnr_interp.tasks.base import Task


def _residual_writers(block: nn.Module) -> list[tuple[nn.Module, str]]:
    """The modules through which a decoder block writes to the residual stream, and how
    to scale each: "linear" (an output projection: weight and bias), "gain" (a
    post-norm's weight) or "gemma_gain" (Gemma's post-norm, which multiplies by
    1 + weight)."""
    post = [getattr(block, name, None) for name in ("post_attention_layernorm", "post_feedforward_layernorm")]
    if post[1] is not None:  # OLMo 2 / Gemma 2-3: the norm after each sublayer sets its output's scale
        # (OLMo 2 calls its post-attention norm post_attention_layernorm as well)
        return [(norm, "gemma_gain" if "Gemma" in type(norm).__name__ else "gain") for norm in post]
    for attn, mlp in (("self_attn.o_proj", "mlp.down_proj"), ("attn.c_proj", "mlp.c_proj")):
        try:
            return [(block.get_submodule(attn), "linear"), (block.get_submodule(mlp), "linear")]
        except AttributeError:
            continue
    raise ModelSpecError(f"cannot plant in {type(block).__name__}: no attention/MLP output projection found")


@torch.no_grad()
def scale_writes(block: nn.Module, strength: float) -> None:
    """Scale everything `block` adds to the residual stream by `strength` (0: the block
    adds exactly zero and is the identity)."""
    for module, how in _residual_writers(block):
        if how == "linear":
            module.weight.mul_(strength)
            if getattr(module, "bias", None) is not None:
                module.bias.mul_(strength)
        elif how == "gain":
            module.weight.mul_(strength)
        else:  # (1 + w) * s = 1 + (s (1 + w) - 1)
            module.weight.copy_(strength * (1 + module.weight) - 1)


def _set_layer_count(model: nn.Module, blocks: nn.ModuleList, layer_types: list[str] | None) -> None:
    config = model.config.get_text_config()
    config.num_hidden_layers = len(blocks)
    if layer_types is not None:
        config.layer_types = layer_types
    for index, block in enumerate(blocks):  # the KV cache index of each attention
        for module in block.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = index


def insert_layer(model: nn.Module, layer: int, strength: float) -> None:
    """Insert a copy of decoder layer `layer` at position `layer` (in place), its
    residual writes scaled by `strength`."""
    blocks = decoder_blocks(model)
    if not 0 <= layer < len(blocks):
        raise ValueError(f"--layer must be in 0..{len(blocks) - 1} (the base model's layers), got {layer}")
    extra = copy.deepcopy(blocks[layer])
    scale_writes(extra, strength)
    blocks.insert(layer, extra)
    types = getattr(model.config.get_text_config(), "layer_types", None)
    _set_layer_count(model, blocks, None if types is None else [*types[:layer], types[layer], *types[layer:]])


def remove_layer(model: nn.Module, layer: int) -> None:
    """Delete decoder layer `layer` (in place): undoes `insert_layer`."""
    blocks = decoder_blocks(model)
    del blocks[layer]
    types = getattr(model.config.get_text_config(), "layer_types", None)
    _set_layer_count(model, blocks, None if types is None else [*types[:layer], *types[layer + 1:]])


def _layer_expectations(layer: int, strength: float) -> dict[str, Any]:
    if strength == 0:
        return {"effect": False}
    # at strength 1 the copy and the original are the same block: removing either is the base
    equivalent = [layer, layer + 1] if strength == 1 else [layer]
    return {"effect": True, "repair": {"component": "layer", "layers": equivalent},
            "route": {"space": "skiponly", "skip": equivalent}}


def plant_layer(model: nn.Module, tokenizer: Any, *, layer: int, strength: float, scale: float, seed: int,
                task: str | Task | None) -> dict[str, Any]:
    """(`scale` is in `strength` already: `plant` applies it to a fixed strength.)"""
    insert_layer(model, layer, strength)
    return {"location": {"layer": layer}, "expected": _layer_expectations(layer, strength)}
