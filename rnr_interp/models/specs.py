"""Model specs -> a `LoadedModel`: one table from the kind of spec to its loader.

A spec is one string:

- ``smollm2``: the demo model, SmolLM2-135M-Instruct (`demo.py`).
- ``tiny-llama`` / ``tiny-qwen2`` / ``tiny-gpt2`` / ``tiny-gemma`` / ``tiny-gemma2`` / ``tiny-olmo2`` /
  ``tiny-gemma3``: random-weight test models built in-process (`tiny.py`; suffix ``:L``
  sets the depth, e.g. ``tiny-llama:4``).
- a path to a ``.gguf`` file, or to a local Hugging Face checkpoint folder
  (``config.json`` inside; no hub access).
- anything else containing ``/`` is a hub name, for users with weights cached or a network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from rnr_interp.models.demo import smollm2_dir
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


def load_demo(spec: str, device: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    model, tok = load_hf_dir(smollm2_dir(), dtype)
    return wrap(spec, model.to(device=device, dtype=dtype), tok)


def load_gguf_file(spec: str, device: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ModelSpecError(f"model spec {spec!r}: GGUF file not found")
    model, tok = load_gguf(path, dtype)
    return wrap(spec, model.to(device), tok)


def load_folder(spec: str, device: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise ModelSpecError(f"model spec {spec!r}: folder has no config.json (not a Hugging Face checkpoint)")
    refuse_remote_code(path)
    model, tok = load_hf_dir(path, dtype)
    return wrap(spec, model.to(device), tok)


def load_hub_name(spec: str, device: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    model, tok = load_hub(spec, dtype)
    return wrap(spec, model.to(device), tok)


def refuse_missing_path(spec: str, device: str, dtype: torch.dtype, seed: int) -> LoadedModel:
    raise ModelSpecError(f"model spec {spec!r}: not a .gguf file or a checkpoint folder")


#: the kinds of spec, first match wins
SPEC_KINDS: tuple[SpecKind, ...] = (
    SpecKind("tiny test model", lambda spec: spec.partition(":")[0] in TINY, load_tiny),
    SpecKind("demo model", lambda spec: spec == "smollm2", load_demo),
    SpecKind("GGUF file", lambda spec: Path(spec).expanduser().suffix == ".gguf", load_gguf_file),
    SpecKind("checkpoint folder", lambda spec: Path(spec).expanduser().is_dir(), load_folder),
    SpecKind("hub name", lambda spec: "/" in spec and not is_path(spec), load_hub_name),
    SpecKind("missing path", lambda spec: Path(spec).expanduser().exists() or is_path(spec), refuse_missing_path),
)


def load_model(spec: str, *, device: str | None = None, dtype: torch.dtype | str | None = None, seed: int = 0) -> LoadedModel:
    """Load any supported spec (see module docstring) as a `LoadedModel`, on `device`
    (default: `resolve_device()`: RNR_DEVICE, else the CPU) in `dtype` (default:
    `resolve_dtype()`: RNR_DTYPE, else float32)."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    for kind in SPEC_KINDS:
        if kind.matches(spec):
            return kind.load(spec, device, dtype, seed)
    known = ", ".join(["smollm2", *TINY])
    raise ModelSpecError(f"unknown model spec {spec!r}: use one of {known}, a .gguf path, a checkpoint folder or a hub name")
