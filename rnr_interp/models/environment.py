"""What the environment decides about models: the device and dtype they load in
(`RNR_DEVICE`, `RNR_DTYPE`), the cache folder (`RNR_CACHE`) and the machine's memory."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from rnr_interp.models.errors import ModelSpecError


#: what `--device` and `RNR_DEVICE` accept, as the refusals say it
DEVICE_CHOICES = "cpu, cuda, cuda:N, mps or auto"


def resolve_device(device: str | None = None) -> str:
    """The torch device models load on: `device`, else `RNR_DEVICE`, else "cpu".
    "auto" means the first CUDA device when one is visible, else Apple's MPS when
    available, else the CPU. CPU is the default so that a run's records do not depend
    on which machine happened to start it. Any other device (meta, a CUDA index past
    the visible ones, a device this torch cannot run on) is refused in one line."""
    name = (device or os.environ.get("RNR_DEVICE") or "cpu").strip()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    try:
        parsed = torch.device(name)
    except RuntimeError as exc:
        raise ModelSpecError(f"device {name!r} is not a torch device (use {DEVICE_CHOICES})") from exc
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelSpecError(f"device {name!r}: no CUDA device is visible to torch here (use cpu or auto)")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ModelSpecError(f"device {name!r}: torch sees {torch.cuda.device_count()} CUDA device(s) here, "
                                 f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    elif parsed.type == "mps":
        if not mps_available():
            raise ModelSpecError(f"device {name!r}: Apple's MPS is not available to torch here (use cpu or auto)")
    elif parsed.type != "cpu":
        raise ModelSpecError(f"device {name!r} cannot run a model here (use {DEVICE_CHOICES})")
    return name


def device_memory(device: str) -> int | None:
    """Bytes of memory on a CUDA device (None for the CPU and MPS, which share the
    machine's memory)."""
    parsed = torch.device(device)
    if parsed.type != "cuda":
        return None
    return torch.cuda.get_device_properties(parsed.index if parsed.index is not None else torch.cuda.current_device()).total_memory


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: torch.dtype | str | None = None) -> torch.dtype:
    """The weights' dtype: `dtype`, else `RNR_DTYPE`, else float32. Recorded in every
    run's model facts, so runs in another dtype never resume into each other. bfloat16
    runs the matrix products on a CPU's AMX units (several times float32's rate where
    there are some: README, "Engine speed") at the cost of bfloat16's rounding."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = (dtype or os.environ.get("RNR_DTYPE") or "float32").strip().removeprefix("torch.")
    if name not in DTYPES:
        raise ModelSpecError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


def cache_dir() -> Path:
    root = os.environ.get("RNR_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rnr_interp"
    return Path(root)


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit when lower."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total
