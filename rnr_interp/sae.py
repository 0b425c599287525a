"""Sparse autoencoders in SAELens's folder format, read natively: ``cfg.json`` and
``sae_weights.safetensors`` (W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in],
b_dec [d_in]; a JumpReLU SAE adds ``threshold`` [d_sae]). Reading runs no code from the
folder: JSON and safetensors only.

A feature's decoder row is a direction in the activation space of the SAE's hook
(`SAE.hook_name`, a TransformerLens name such as ``blocks.8.hook_resid_pre``):
`interventions.Steer.from_sae` steers along it, `interventions.SAEFeature` clamps or
ablates it, and `feature_loadings` says which features a direction (the failure
direction v, say) loads on.

Accepted configurations: architectures ``standard`` (ReLU), ``jumprelu`` and ``topk``,
in SAELens's current layout (``metadata.hook_name`` or ``meta.hook_name``, ``k``) and
its older one (top-level ``hook_name``, ``activation_fn_str``/``activation_fn``,
``activation_fn_kwargs.k``). Refused with a one-line reason: other architectures
(gated, transcoders), SAEs on per-head ``hook_z`` reshaping or with a head index, and
input normalisation other than ``none``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from rnr_interp.records import read_json_file

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
ARCHITECTURES = ("standard", "jumprelu", "topk")


@dataclass(frozen=True, eq=False)
class SAE:
    """A sparse autoencoder on the activations of one hook point."""

    W_enc: Float[Tensor, "d_in d_sae"]
    b_enc: Float[Tensor, "d_sae"]
    W_dec: Float[Tensor, "d_sae d_in"]
    b_dec: Float[Tensor, "d_in"]
    hook_name: str
    architecture: str = "standard"
    apply_b_dec_to_input: bool = True
    threshold: Float[Tensor, "d_sae"] | None = None
    k: int | None = None

    @property
    def d_in(self) -> int:
        return self.W_dec.shape[1]

    @property
    def d_sae(self) -> int:
        return self.W_dec.shape[0]

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """Feature activations of `x` (computed in float32)."""
        x = x.float()
        b_dec, W_enc, b_enc = (t.to(x.device) for t in (self.b_dec, self.W_enc, self.b_enc))
        pre = (x - b_dec * self.apply_b_dec_to_input) @ W_enc + b_enc
        if self.architecture == "jumprelu":
            return torch.relu(pre) * (pre > self.threshold.to(x.device))
        if self.architecture == "topk":
            top = pre.topk(self.k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))
        return torch.relu(pre)

    def decode(self, f: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        return f @ self.W_dec.to(f.device) + self.b_dec.to(f.device)

    def direction(self, feature: int) -> Float[Tensor, "d_in"]:
        """Feature `feature`'s decoder row."""
        self.check_feature(feature)
        return self.W_dec[feature]

    def check_feature(self, feature: int) -> None:
        if not 0 <= feature < self.d_sae:
            raise ValueError(f"feature {feature} does not exist: the SAE has features 0..{self.d_sae - 1}")


def load_sae(folder: str | Path) -> SAE:
    """The SAE saved in `folder` (SAELens format); kept once read, until its weights file changes."""
    path = Path(folder).expanduser().resolve()
    weights = path / WEIGHTS_FILE
    return _load(str(path), weights.stat().st_mtime_ns if weights.is_file() else 0)


@functools.lru_cache(maxsize=8)
def _load(folder: str, version: int) -> SAE:
    from safetensors.torch import load_file

    path = Path(folder)
    for name in (CFG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise ValueError(f"{folder} is not a SAELens SAE folder: no {name}")
    cfg = read_json_file(path / CFG_FILE)  # bounded in size and depth; a bad file is a one-line ValueError
    if not isinstance(cfg, dict):
        raise ValueError(f"{path / CFG_FILE} must hold a JSON object")
    weights = load_file(str(path / WEIGHTS_FILE), device="cpu")
    missing = [k for k in ("W_enc", "b_enc", "W_dec", "b_dec") if k not in weights]
    if missing:
        raise ValueError(f"{path / WEIGHTS_FILE} lacks {', '.join(missing)}")
    architecture, k = _architecture(cfg, path)
    if architecture == "jumprelu" and "threshold" not in weights:
        raise ValueError(f"{path / WEIGHTS_FILE}: a jumprelu SAE needs a 'threshold' tensor")
    sae = SAE(W_enc=weights["W_enc"].float(), b_enc=weights["b_enc"].float(), W_dec=weights["W_dec"].float(),
              b_dec=weights["b_dec"].float(), hook_name=_hook_name(cfg, path), architecture=architecture,
              apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)),
              threshold=weights["threshold"].float() if architecture == "jumprelu" else None, k=k)
    d_sae, d_in = sae.W_dec.shape
    shapes = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "b_dec": (d_in,)}
    for name, shape in shapes.items():
        if tuple(getattr(sae, name).shape) != shape:
            raise ValueError(f"{path / WEIGHTS_FILE}: {name} has shape {tuple(getattr(sae, name).shape)}, expected {shape} "
                             f"(W_dec is {d_sae} x {d_in})")
    for name, expected in (("d_in", d_in), ("d_sae", d_sae)):
        if name in cfg and cfg[name] != expected:
            raise ValueError(f"{path / CFG_FILE}: {name} is {cfg[name]} but the weights have {expected}")
    return sae


def _hook_name(cfg: dict, path: Path) -> str:
    meta = cfg.get("metadata") or cfg.get("meta") or {}
    name = meta.get("hook_name") or cfg.get("hook_name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{path / CFG_FILE} names no hook_name (the hook point the SAE reads)")
    head = meta.get("hook_head_index", cfg.get("hook_head_index"))
    if head is not None or cfg.get("reshape_activations", "none") != "none":
        raise ValueError(f"{path / CFG_FILE}: SAEs on single heads or reshaped hook_z activations are not supported")
    return name


def _architecture(cfg: dict, path: Path) -> tuple[str, int | None]:
    norm = cfg.get("normalize_activations", "none")
    if norm not in ("none", None, False):
        raise ValueError(f"{path / CFG_FILE}: normalize_activations {norm!r} is not supported (only 'none')")
    activation = cfg.get("activation_fn_str", cfg.get("activation_fn", "relu"))
    architecture = cfg.get("architecture", "standard")
    if architecture == "standard" and activation == "topk":
        architecture = "topk"
    if architecture not in ARCHITECTURES:
        raise ValueError(f"{path / CFG_FILE}: architecture {architecture!r} is not supported; known: {', '.join(ARCHITECTURES)}")
    if architecture != "topk":
        return architecture, None
    k = cfg.get("k", (cfg.get("activation_fn_kwargs") or {}).get("k"))
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"{path / CFG_FILE}: a topk SAE needs a whole k of at least 1, got {k!r}")
    return architecture, k


def save_sae(sae: SAE, folder: str | Path) -> Path:
    """Write `sae` as a SAELens folder (current layout), readable by `load_sae` and SAELens."""
    from safetensors.torch import save_file

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    weights = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
    if sae.threshold is not None:
        weights["threshold"] = sae.threshold
    save_file({k: v.detach().float().contiguous().cpu() for k, v in weights.items()}, str(path / WEIGHTS_FILE))
    cfg = {"architecture": sae.architecture, "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none",
           "reshape_activations": "none", "metadata": {"hook_name": sae.hook_name}}
    if sae.k is not None:
        cfg["k"] = sae.k
    (path / CFG_FILE).write_text(json.dumps(cfg, indent=2))
    return path


def feature_loadings(sae: SAE, v: Float[Tensor, "d_in"], k: int = 10) -> pd.DataFrame:
    """The `k` features whose decoder rows are most aligned with direction `v`: cosine
    of v with every decoder row, the largest |cosine| first (columns feature, cosine)."""
    v = torch.as_tensor(v, dtype=torch.float32).flatten()
    if v.shape[0] != sae.d_in:
        raise ValueError(f"the direction has size {v.shape[0]} but the SAE reads {sae.d_in}-dimensional activations")
    if not torch.isfinite(v).all() or float(v.norm()) == 0:
        raise ValueError("the direction is zero or not finite: nothing to compare with the decoder rows")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    cosine = torch.nn.functional.cosine_similarity(sae.W_dec, v[None, :], dim=-1)
    top = cosine.abs().topk(min(k, sae.d_sae)).indices
    return pd.DataFrame({"feature": top.tolist(), "cosine": cosine[top].tolist()})
