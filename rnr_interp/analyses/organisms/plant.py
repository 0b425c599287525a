"""An organism written as an ordinary checkpoint folder (or a base/trained pair of
them) with its ``planted.json``: the kinds (`KINDS`), `plant` and `read_planted`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from rnr_interp.analyses.organisms.bias import plant_answer_bias
from rnr_interp.analyses.organisms.layer import plant_layer
from rnr_interp.analyses.organisms.losable import losable_layer
from rnr_interp.analyses.organisms.units import plant_units
from rnr_interp.interventions import decoder_blocks
from rnr_interp.models import BUILTIN, TINY_ARCHITECTURES, ModelSpecError, build_tiny, refuse_remote_code
from rnr_interp.records import read_json_file
from rnr_interp.tasks.base import Task

PLANTED_FILE = "planted.json"
#: the weights file `save_pretrained` writes (one shard at these sizes)
WEIGHTS_FILE = "model.safetensors"
#: the most torch threads a planted.json may record (a rebuild runs under that count)
MAX_TORCH_THREADS = 4096


@dataclass(frozen=True)
class Planted:
    """The ground truth of one organism, as written to ``planted.json``."""

    kind: str
    base: str
    strength: float
    seed: int
    #: where the effect sits: {"layer": L} for the layer kinds
    location: dict[str, Any]
    n_layers_base: int
    n_layers: int
    #: what each analysis should report on this organism
    expected: dict[str, Any]
    task: str | None = None
    #: planted units or direction, for the kinds that have them
    detail: dict[str, Any] = field(default_factory=dict)
    #: sha256 of the weights file, so a rebuild from the seed can be checked bit for bit
    weights_sha256: str = ""
    #: how the seed's draw led to `location` where a kind steps past the drawn layer (units:
    #: ``drawn_layer``, ``base_answers_changed_by_silencing`` at each block tried); not part
    #: of the organism (two seeds that end in one layer plant one organism)
    drawn: dict[str, Any] = field(default_factory=dict)
    #: torch's CPU threads while planting: the fits sum in another order under another
    #: count, and the weights differ in their last bits (a rebuild plants under this count)
    torch_threads: int | None = None

    def __post_init__(self):
        # a rebuild sets torch's thread count from this: a handed planted.json must not ask for a million threads
        t = self.torch_threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= MAX_TORCH_THREADS):
            raise ValueError(f"torch_threads must be a whole number from 1 to {MAX_TORCH_THREADS}, got {t!r}")


def load_base(spec: str) -> tuple[nn.Module, Any]:
    """The plain HF model and tokenizer of `spec`, in float32 on the CPU, without the
    bridge (an organism edits and saves the weights themselves): the demo model, a tiny
    test model (the weights `--model` gives it) or a local checkpoint folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name, _, arg = spec.partition(":")
    if name in TINY_ARCHITECTURES:
        return build_tiny(name, n_layers=int(arg) if arg.isdigit() else 3)
    folder = BUILTIN[spec].checkpoint_dir() if spec in BUILTIN else Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        raise ModelSpecError(f"model spec {spec!r}: plant takes a built-in model ({', '.join(BUILTIN)}), a tiny test model "
                             "or a local checkpoint folder "
                             "(config.json inside)")
    refuse_remote_code(folder)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32, trust_remote_code=False)
    return model.eval(), tok


def drawable_layers(n_layers: int) -> range:
    """The layers `draw_layer` draws from: the middle half of the model (a duplicate of
    the first or last layers is not the effect under study, and the sweep runs there too)."""
    return range(n_layers // 4, max(n_layers // 4 + 1, (3 * n_layers) // 4))


def draw_layer(seed: int, n_layers: int) -> int:
    """A layer drawn from `seed`, uniform over `drawable_layers`."""
    layers = drawable_layers(n_layers)
    return int(np.random.default_rng(seed).integers(layers.start, layers.stop))


def seeds_drawing_each_layer(n_layers: int) -> tuple[int, ...]:
    """The smallest seed that draws each layer `draw_layer` can draw, in layer order: one
    organism per layer, where seeds 0..k-1 repeat layers (ten seeds on a 30-layer model
    draw five)."""
    first: dict[int, int] = {}
    seed = 0
    while len(first) < len(drawable_layers(n_layers)):
        first.setdefault(draw_layer(seed, n_layers), seed)
        seed += 1
    return tuple(first[layer] for layer in sorted(first))


@dataclass(frozen=True)
class Kind:
    planter: Callable[..., dict[str, Any]]
    #: the strength when none is given (None: calibrated on the model by the planter)
    strength: float | None
    #: strength 0 at a drawn layer, always (takes neither --layer nor --strength)
    null: bool = False
    takes_layer: bool = True
    #: a checkpoint pair: ``base/`` the planted model, ``trained/`` the model unchanged
    pair: bool = False
    #: takes --units (how many units to plant)
    takes_units: bool = False
    #: sized for the temperature of the probe that audits it (takes --temperature)
    takes_temperature: bool = False
    #: where a drawn layer may be planted: (model, tokenizer, task, drawn, drawable layers)
    #: -> (the layer, what planted.json's ``drawn`` records of the choice); None: the drawn one
    drawn_to: Callable[..., tuple[int, dict[str, Any]]] | None = None


KINDS: dict[str, Kind] = {
    "layer": Kind(plant_layer, 1.0),
    "null": Kind(plant_layer, 0.0, null=True),
    # calibrated: t leads the gold by HEADROOM nats per unit of the probe's temperature
    "gap": Kind(partial(plant_answer_bias, kind="gap"), None, takes_layer=False, takes_temperature=True),
    "sharpen": Kind(partial(plant_answer_bias, kind="sharpen"), None, takes_layer=False, pair=True, takes_temperature=True),
    # 30 nats below: a gold first token with 1 - 1e-7 of the mass keeps under 1e-5 of it,
    # and K = 32 samples reach it with probability under 1e-3
    "new": Kind(partial(plant_answer_bias, kind="new"), 30.0, takes_layer=False, pair=True),
    # calibrated: a lead of `units.UNITS_LEAD` nats through the model
    # drawn: the next block the base can lose (silenced, its answers change little)
    "units": Kind(plant_units, None, takes_units=True, drawn_to=losable_layer),
}


def plant(kind: str, base: str, out: Path, *, layer: int | None = None, strength: float | None = None, seed: int = 0,
          task: str | Task | None = None, scale: float = 1.0, units: int | None = None,
          temperature: float | None = None) -> Planted:
    """Build the organism `kind` from the model `base` and write it to `out` (a new
    folder, made whole or not at all): the checkpoint and its ``planted.json``; for a
    pair kind, the checkpoints ``base/`` (planted) and ``trained/`` (the model unchanged)
    beside the pair's ``planted.json``. `scale` multiplies the strength, given, default or
    calibrated (validate's profiles); `units`: how many units the ``units`` kind plants;
    `temperature`: the probe temperature the ``gap`` and ``sharpen`` kinds are sized for
    (default: `rnr audit`'s)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    spec = KINDS[kind]
    if spec.null and (layer is not None or strength not in (None, 0)):
        raise ValueError(f"kind {kind!r} is strength 0 at a layer drawn from --seed: it takes neither --layer nor --strength")
    if not spec.takes_layer and layer is not None:
        raise ValueError(f"kind {kind!r} is not planted at a layer: it takes no --layer")
    if not spec.takes_units and units is not None:
        raise ValueError(f"kind {kind!r} plants no units: it takes no --units")
    if not spec.takes_temperature and temperature is not None:
        raise ValueError(f"kind {kind!r} is not sized for a probe's temperature: it takes no --temperature")
    if temperature is not None and not (np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"--temperature must be a positive number, got {temperature}")
    if strength is None and spec.strength is not None:
        strength = spec.strength
    if strength is not None:
        strength = scale * float(strength)
        if not np.isfinite(strength):
            raise ValueError(f"--strength must be a finite number, got {strength}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} exists and is not an empty folder (an organism is written to a new folder)")
    threads = torch.get_num_threads()
    model, tokenizer = load_base(base)
    n_base = len(decoder_blocks(model))
    if layer is not None and not 0 <= layer < n_base:
        raise ValueError(f"--layer must be in 0..{n_base - 1} (the base model's layers), got {layer}")
    drawn: dict[str, Any] = {}
    if layer is None:
        layer = draw_layer(seed, n_base)
        if spec.drawn_to is not None:
            layer, drawn = spec.drawn_to(model, tokenizer, task, layer, drawable_layers(n_base))
    unchanged = copy.deepcopy(model) if spec.pair else None
    torch.manual_seed(seed)
    found = spec.planter(model, tokenizer, layer=layer, strength=strength, scale=scale, seed=seed, task=task,
                         **({"units": units} if spec.takes_units else {}),
                         **({"temperature": temperature} if temperature is not None else {}))
    strength = found.pop("strength", strength)
    building = out.with_name(out.name + ".part")
    shutil.rmtree(building, ignore_errors=True)
    planted_folder = building / "base" if spec.pair else building
    model.save_pretrained(planted_folder)
    tokenizer.save_pretrained(planted_folder)
    if unchanged is not None:
        unchanged.save_pretrained(building / "trained")
        tokenizer.save_pretrained(building / "trained")
        found["detail"]["trained_weights_sha256"] = file_sha256(building / "trained" / WEIGHTS_FILE)
    planted = Planted(kind=kind, base=base, strength=strength, seed=seed, n_layers_base=n_base, torch_threads=threads,
                      n_layers=len(decoder_blocks(model)), task=task.name if isinstance(task, Task) else task,
                      weights_sha256=file_sha256(planted_folder / WEIGHTS_FILE), drawn=drawn, **found)
    (building / PLANTED_FILE).write_text(json.dumps(asdict(planted), indent=1) + "\n")
    if out.exists():
        out.rmdir()  # empty, checked above
    os.replace(building, out)
    return planted


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def read_planted(folder: Path) -> Planted:
    """The ground truth of an organism folder."""
    path = Path(folder) / PLANTED_FILE
    try:
        return Planted(**read_json_file(path))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{str(path)!r} is not an organism's {PLANTED_FILE} ({exc})") from None
