"""The researcher's own model objects as a `LoadedModel`: a TransformerBridge, or a
Hugging Face causal LM with its tokenizer. Each is deep-copied and the copy is wrapped,
so the user's object is never changed (wrapping rewrites a model's submodules and
patches its attention and linear layers in place); the copy costs the model's memory
once more."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from rnr_interp.models.errors import ModelSpecError
from rnr_interp.models.loaded import LoadedModel
from rnr_interp.models.wrap import prepare, wrap, wrap_bridge


def is_bridge(obj: Any) -> bool:
    from transformer_lens.model_bridge import TransformerBridge

    return isinstance(obj, TransformerBridge)


def adopt(obj: Any, tokenizer: Any = None, *, name: str | None = None, device: str | None = None,
          dtype: torch.dtype | None = None) -> LoadedModel:
    """A copy of `obj` (a TransformerBridge, an HF model, or a `(model, tokenizer)` pair)
    wrapped as a `LoadedModel` named `name` (default: ``object:`` and the checkpoint it
    was loaded from, else its architecture: the name runs record). It stays on its own
    device and dtype unless `device` or `dtype` is given. A `LoadedModel` comes back as
    it is."""
    if isinstance(obj, LoadedModel):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2 and tokenizer is None:
        obj, tokenizer = obj
    if is_bridge(obj):
        tokenizer = tokenizer if tokenizer is not None else obj.tokenizer
        if tokenizer is None:
            raise ModelSpecError("the TransformerBridge has no tokenizer: pass it, load_model(bridge, tokenizer=tok)")
        bridge = moved(copy.deepcopy(obj), device, dtype)
        prepare(bridge.original_model)
        return wrap_bridge(name or object_name(bridge.original_model), bridge, copy.deepcopy(tokenizer))
    if isinstance(obj, nn.Module) and hasattr(obj, "config"):
        if tokenizer is None:
            raise ModelSpecError(f"a {type(obj).__name__} needs its tokenizer: load_model(model, tokenizer=tok)")
        model = moved(copy.deepcopy(obj), device, dtype)
        return wrap(name or object_name(model), model, copy.deepcopy(tokenizer))
    raise ModelSpecError(f"cannot load a {type(obj).__name__} as a model: pass a spec string, a path, a TransformerBridge, "
                         "or a Hugging Face model with its tokenizer")


def moved(module: nn.Module, device: str | None, dtype: torch.dtype | None) -> nn.Module:
    if device is None and dtype is None:
        return module
    return module.to(**{key: value for key, value in (("device", device), ("dtype", dtype)) if value is not None})


def object_name(model: nn.Module) -> str:
    source = getattr(model.config, "_name_or_path", "") or (model.config.architectures or [type(model).__name__])[0]
    return f"object:{source}"
