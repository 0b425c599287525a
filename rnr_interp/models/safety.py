"""What an untrusted checkpoint is checked for before anything of it loads: code it
would run (an `auto_map`), and a declared shape larger than the machine's memory."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import torch

from rnr_interp.models.environment import device_memory, machine_memory
from rnr_interp.models.errors import ModelSpecError

#: files of a checkpoint folder whose `auto_map` points the loader at Python code the
#: checkpoint ships (config, tokenizer, processor)
CODE_MAP_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def refuse_remote_code(folder: Path) -> None:
    """Refuse a checkpoint folder that needs code of its own to load (an `auto_map` in
    its config files): loading it would run that code. Every loader also passes
    trust_remote_code=False, so the library never asks; this says why in one line."""
    for name in CODE_MAP_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ModelSpecError(f"checkpoint {str(folder)!r}: {name} is not readable JSON ({first_line(exc)})") from None
        if isinstance(config, dict) and config.get("auto_map"):
            raise ModelSpecError(
                f"checkpoint {str(folder)!r} needs code of its own to load ({name} has an auto_map naming "
                f"{short_names(config['auto_map'])}); rnr never runs a checkpoint's code, use a checkpoint of a "
                "built-in architecture")


def short_names(auto_map: Any) -> str:
    names = sorted({str(v) for v in auto_map.values()}) if isinstance(auto_map, dict) else [str(auto_map)]
    text = ", ".join(names)
    return text if len(text) <= 80 else text[:77] + "..."


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


#: the share of the machine's memory a model's weights may take by default
MODEL_MEMORY_SHARE = 0.8
#: the environment variable that sets that limit, in GiB
MODEL_MEMORY_VARIABLE = "RNR_MODEL_MEMORY_GB"
#: the names configs give their depth (transformers maps them onto num_hidden_layers)
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def model_memory_limit() -> int:
    """Bytes a model's weights may take: `RNR_MODEL_MEMORY_GB` when set, else
    MODEL_MEMORY_SHARE of the machine's memory."""
    value = os.environ.get(MODEL_MEMORY_VARIABLE, "").strip()
    if not value:
        return int(MODEL_MEMORY_SHARE * machine_memory())
    try:
        gib = float(value)
    except ValueError:
        gib = -1.0
    if not gib > 0:
        raise ModelSpecError(f"{MODEL_MEMORY_VARIABLE} must be a positive number of GiB, got {value!r}")
    return int(gib * 2**30)


def check_declared_size(what: str, source: str | Path, dtype: torch.dtype, device: str = "cpu", **where: Any) -> None:
    """Refuse a checkpoint whose declared shape (its parameters, counted from its config
    before anything is allocated, times `dtype`'s size) exceeds `model_memory_limit()`,
    or the memory of the CUDA `device` it will be moved to: loading it would allocate
    until the machine runs out. A config this count cannot read or build is left to the
    loader, which builds models the same way and so fails on it too, before any weight
    is read."""
    gib = 2**30
    limits = [(model_memory_limit(), "{:,.1f} GiB a model may take here (set " + MODEL_MEMORY_VARIABLE + " to raise the limit)")]
    if (on_device := device_memory(device)) is not None:
        limits.append((on_device, "{:,.1f} GiB of " + device))
    n_params = declared_parameters(source, **where)
    if n_params is None:
        return
    need = n_params * torch.empty((), dtype=dtype).element_size()
    for limit, named in limits:
        if need > limit:
            raise ModelSpecError(f"{what} declares {n_params:,} parameters, {need / gib:,.1f} GiB in "
                                 f"{str(dtype).removeprefix('torch.')}, more than the {named.format(limit / gib)}")


def declared_parameters(source: str | Path, **where: Any) -> int | None:
    """The parameter count a checkpoint's config declares, without allocating a weight:
    the model built on the meta device at depth 1 and at depth 2, extrapolated linearly
    to the declared depth (a count, not an allocation, so a config declaring a million
    layers costs two tiny builds). Models whose layers differ in size (dense and expert
    layers mixed) are estimated from their first two. None when the config cannot be
    read or built here."""
    from transformers import AutoModelForCausalLM, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        raw, _ = PretrainedConfig.get_config_dict(source, trust_remote_code=False, **where)
        config_class = CONFIG_MAPPING[raw["model_type"]]
    except Exception:  # noqa: BLE001 - unreadable or unknown: the loader says why in one line
        return None
    depth = declared_depth(raw)
    counts = []
    for probe_depth in (1, 2) if depth and depth > 1 else (depth or 1,):
        try:
            config = config_class.from_dict(at_depth(raw, depth, probe_depth))
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
        except Exception:  # noqa: BLE001 - a config that does not build: the loader fails on it too
            return None
        counts.append(sum(p.numel() for p in model.parameters()))
    if len(counts) == 1:
        return counts[0]
    return counts[0] + (depth - 1) * (counts[1] - counts[0])


def text_configs(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The config dict and the nested text config of a multimodal model, where present."""
    nested = raw.get("text_config")
    return [raw, nested] if isinstance(nested, dict) else [raw]


def declared_depth(raw: dict[str, Any]) -> int | None:
    for config in reversed(text_configs(raw)):
        for key in DEPTH_KEYS:
            value = config.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def at_depth(raw: dict[str, Any], depth: int | None, new_depth: int) -> dict[str, Any]:
    """A copy of the config dict at `new_depth` layers; per-layer lists (layer types and
    the like, as long as the declared depth) are cut to match."""
    probe = copy.deepcopy(raw)
    for config in text_configs(probe):
        for key, value in config.items():
            if key in DEPTH_KEYS and isinstance(value, int):
                config[key] = new_depth
            elif depth and isinstance(value, list) and len(value) == depth:
                config[key] = value[:new_depth]
    return probe
