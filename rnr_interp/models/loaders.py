"""Real weights through transformers' own loaders (never with `trust_remote_code`): a
checkpoint folder, a GGUF file or a hub name, each failure as one line."""

from __future__ import annotations

import pickle
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from rnr_interp.models.errors import ModelSpecError
from rnr_interp.models.safety import check_declared_size, first_line


def load_failed(what: str, exc: Exception) -> ModelSpecError:
    """A load failure as one line. Whatever the loader raised (a damaged file, a weights
    pickle torch's safe loader refuses, a checkpoint that asks for remote code) is bad
    input, not a bug of ours."""
    text = first_line(exc)
    if isinstance(exc, pickle.UnpicklingError):
        return ModelSpecError(f"{what} did not load: its weights file holds more than tensors, which torch's safe "
                              "loader refuses; rnr never unpickles anything else (convert it to safetensors, or use another)")
    if "trust_remote_code" in text:
        return ModelSpecError(f"{what} needs code of its own to load; rnr never runs a checkpoint's code ({text})")
    return ModelSpecError(f"{what} did not load: {type(exc).__name__}: {text}")


def from_pretrained(what: str, source: str | Path, dtype: torch.dtype, device: str = "cpu",
                    **where: Any) -> tuple[nn.Module, Any]:
    """The causal LM and tokenizer at `source` (a folder or a hub name; `where`: the
    loaders' location arguments, e.g. `local_files_only` or `gguf_file`), loaded on the
    CPU; `what` names it in the one-line error. A declared shape that will not fit here
    or on `device` (where it goes next) is refused before anything is allocated."""
    check_declared_size(what, source, dtype, device, **where)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **where)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=False, **where)
    except Exception as exc:  # noqa: BLE001 - any loader failure: see load_failed
        raise load_failed(what, exc) from exc
    return model, tok


def load_hf_dir(path: Path, dtype: torch.dtype, device: str = "cpu") -> tuple[nn.Module, Any]:
    return from_pretrained(f"checkpoint {str(path)!r}", path, dtype, device, local_files_only=True)


def load_gguf(path: Path, dtype: torch.dtype, device: str = "cpu") -> tuple[nn.Module, Any]:
    return from_pretrained(f"GGUF {str(path)!r}", path.parent, dtype, device, gguf_file=path.name)


def load_hub(name: str, dtype: torch.dtype, device: str = "cpu") -> tuple[nn.Module, Any]:
    """A hub model, from the local Hugging Face cache when the hub cannot be reached (so
    an offline machine fails at once instead of after the client's retries)."""
    host = hub_host()
    if hub_reachable(host):
        return from_pretrained(f"hub model {name!r}", name, dtype, device)
    return from_pretrained(f"hub model {name!r} (not in the local Hugging Face cache, and {host} cannot be reached from "
                           "here)", name, dtype, device, local_files_only=True)


def hub_host() -> str:
    from huggingface_hub import constants

    return urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT


def hub_reachable(host: str, timeout: float = 3.0) -> bool:
    """Whether the hub answers a TCP connection (False in offline mode, `HF_HUB_OFFLINE`)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True
