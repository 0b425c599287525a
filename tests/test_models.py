"""Model loading: every spec kind, the built-in real models' facts and behaviour, clear errors."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rnr_interp.engine.decoding import Decoding

from rnr_interp.engine.generate import generate, left_pad, forward
from rnr_interp.models import ALIGNMENT, BUILTIN, ModelSpecError, smollm2_dir, build_tiny, load_model


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-qwen2:2", "tiny-gpt2:4", "tiny-gemma:3", "tiny-olmo2:2", "tiny-gemma3:3"])
def test_tiny_models_load_as_bridges(spec):
    lm = load_model(spec)
    facts = lm.facts()
    assert facts["n_layers"] == int(spec.partition(":")[2] or 3)
    assert {"d_model", "n_heads", "n_kv_heads", "d_mlp", "d_vocab", "n_params", "architecture"} <= facts.keys()
    assert not lm.hf_model.training
    assert "blocks.0.hook_mlp_out" in lm.bridge.hook_dict
    assert lm.stop_token_ids


def test_local_checkpoint_folder_round_trip(tmp_path):
    model, tok = build_tiny("tiny-llama", n_layers=2)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    lm = load_model("tiny-llama:2")
    again = load_model(str(tmp_path))
    ids = torch.tensor([lm.encode("abc")])
    assert torch.allclose(lm.bridge(ids), again.bridge(ids), atol=1e-5)


def test_loaded_weights_own_aligned_memory(tmp_path):
    # safetensors loads weights as views into the file at its header's offsets; MKL's
    # matmuls run at half rate on rows that do not start on a 64-byte boundary
    model, tok = build_tiny("tiny-llama", n_layers=2)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    raw = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert any(p.data_ptr() % ALIGNMENT for p in raw.parameters()), "the case this guards against did not arise"
    lm = load_model(str(tmp_path))
    hf = lm.hf_model
    assert not [n for n, p in hf.named_parameters() if p.data_ptr() % ALIGNMENT]
    assert all(torch.equal(p, q) for p, q in zip(raw.parameters(), hf.parameters()))
    if hf.config.tie_word_embeddings:
        assert hf.lm_head.weight is hf.model.embed_tokens.weight


@pytest.mark.parametrize("spec,message", [
    ("nonsense", "'nonsense' is not a built-in model .* so it was tried as a hub name: hub model 'nonsense'"),
    ("/no/such/model.gguf", "GGUF file not found"),
    ("./missing-dir", "not a .gguf file or a checkpoint folder"),
])
def test_bad_specs_fail_with_one_clear_line(spec, message):
    with pytest.raises(ModelSpecError, match=message) as err:
        load_model(spec)
    assert "\n" not in str(err.value)


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(ModelSpecError, match="no config.json"):
        load_model(str(tmp_path))


@pytest.mark.slow
def test_smollm2_facts(smollm2):
    facts = smollm2.facts()
    assert facts["architecture"] == "LlamaForCausalLM"
    assert (facts["n_layers"], facts["d_model"], facts["n_heads"], facts["n_kv_heads"], facts["d_mlp"]) == (30, 576, 9, 3, 1536)
    assert 130e6 < facts["n_params"] < 140e6
    assert smollm2.chat and smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>") in smollm2.stop_token_ids


def max_logit_gap(lm, folder, questions):
    """The largest absolute gap between the bridge's float32 logits and plain
    transformers' on the same checkpoint (the bridge reimplements attention eagerly;
    transformers uses SDPA)."""
    plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids, mask = left_pad([lm.encode(lm.render(q)) for q in questions], lm.pad_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        ours = forward(lm, ids, mask)[0]
        ref = plain(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    real = mask.bool()
    return (ours[real] - ref[real]).abs().max().item()


@pytest.mark.slow
def test_smollm2_bridge_logits_match_plain_transformers(smollm2):
    assert max_logit_gap(smollm2, smollm2_dir(), ["What is the capital of France?", "2+2="]) < 1e-3


@pytest.mark.slow
def test_smollm2_answers_sensibly(smollm2):
    prompt = smollm2.encode(smollm2.render("What is the capital of France? Answer in one word."))
    [[g]] = generate(smollm2, [prompt], decoding=Decoding(max_new_tokens=12))
    assert "paris" in g.text.lower()
    assert g.finish == "stop"


GEMMA_PROMPTS = ["The capital of France is Paris. The capital of Germany is", "Question: What is 12 + 7?\nAnswer:", "def fibonacci(n):",
                 "Roses are red,"]


@pytest.mark.slow
def test_gemma3_facts(gemma3):
    facts = gemma3.facts()
    assert facts["architecture"] == "Gemma3ForCausalLM"
    assert (facts["n_layers"], facts["d_model"], facts["n_heads"], facts["n_kv_heads"], facts["d_mlp"]) == (18, 640, 4, 1, 2048)
    assert 260e6 < facts["n_params"] < 280e6
    # the base model: no chat template; raw prompts start with BOS, as Gemma was trained
    assert not gemma3.chat
    assert gemma3.encode(gemma3.render("Hello"))[0] == gemma3.tokenizer.bos_token_id == 2
    assert {1, gemma3.tokenizer.convert_tokens_to_ids("<end_of_turn>")} <= set(gemma3.stop_token_ids)


@pytest.mark.slow
def test_gemma3_bridge_logits_match_plain_transformers(gemma3):
    assert max_logit_gap(gemma3, BUILTIN["gemma3-270m"].checkpoint_dir(), GEMMA_PROMPTS[:2]) < 1e-3


@pytest.mark.slow
def test_gemma3_greedy_is_sensible_and_the_same_with_and_without_the_kv_cache(gemma3):
    prompts = [gemma3.encode(gemma3.render(q)) for q in GEMMA_PROMPTS]
    cached = generate(gemma3, prompts, decoding=Decoding(max_new_tokens=12), use_cache=True)
    uncached = generate(gemma3, prompts, decoding=Decoding(max_new_tokens=12), use_cache=False)
    assert [row[0].tokens for row in cached] == [row[0].tokens for row in uncached]
    assert "berlin" in cached[0][0].text.lower()
    assert "19" in cached[1][0].text


def test_model_info_cli_prints_one_json_object():
    from typer.testing import CliRunner

    from rnr_interp.cli import app

    result = CliRunner().invoke(app, ["model-info", "tiny-qwen2:2"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout.strip())
    assert facts["n_layers"] == 2 and facts["architecture"] == "Qwen2ForCausalLM"
    bad = CliRunner().invoke(app, ["model-info", "nonsense"])
    assert bad.exit_code == 2 and "tried as a hub name" in bad.output


@pytest.mark.parametrize("spec,architecture,n_kv_heads", [("tiny-olmo2", "Olmo2ForCausalLM", 2),
                                                         ("tiny-gemma3", "Gemma3ForCausalLM", 1)])
def test_model_info_cli_prints_the_new_families(spec, architecture, n_kv_heads):
    from typer.testing import CliRunner

    from rnr_interp.cli import app

    result = CliRunner().invoke(app, ["model-info", spec])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout.strip())
    assert (facts["architecture"], facts["n_layers"], facts["n_kv_heads"]) == (architecture, 3, n_kv_heads)


def test_device_defaults_to_cpu_and_names_bad_devices(monkeypatch):
    from rnr_interp.models import resolve_device

    monkeypatch.delenv("RNR_DEVICE", raising=False)
    assert resolve_device() == "cpu" and load_model("tiny-llama:1").device.type == "cpu"
    monkeypatch.setenv("RNR_DEVICE", "auto")
    assert resolve_device() == ("cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu")
    with pytest.raises(ModelSpecError, match="'gpu0' is not a torch device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ModelSpecError, match="no CUDA device"):
            load_model("tiny-llama:1", device="cuda")


def test_auto_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    from rnr_interp.models import resolve_device

    for cuda, mps, chosen in [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
        assert resolve_device("auto") == chosen
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ModelSpecError, match=r"'cuda:2': torch sees 2 CUDA device\(s\) here, cuda:0 to cuda:1"):
        resolve_device("cuda:2")
    with pytest.raises(ModelSpecError, match="'meta' cannot run a model here"):
        resolve_device("meta")


def test_declared_parameters_count_every_family_exactly(tmp_path):
    from rnr_interp.models import TINY
    from rnr_interp.models.safety import declared_parameters

    for name in TINY:
        model, tok = build_tiny(name, n_layers=3)
        model.save_pretrained(tmp_path / name)
        assert declared_parameters(tmp_path / name) == sum(p.numel() for p in model.parameters()), name


def test_checkpoint_larger_than_its_cuda_device_is_refused_before_loading(tmp_path, monkeypatch):
    import rnr_interp.models.safety as safety

    model, tok = build_tiny("tiny-llama", n_layers=2)
    model.save_pretrained(tmp_path)
    monkeypatch.setattr(safety, "device_memory", lambda device: 2**16 if device == "cuda:0" else None)
    n_params = sum(p.numel() for p in model.parameters())
    with pytest.raises(ModelSpecError, match=rf"declares {n_params:,} parameters, 0.0 GiB in float32, more than the 0.0 GiB of cuda:0"):
        safety.check_declared_size("checkpoint", tmp_path, torch.float32, "cuda:0")
    safety.check_declared_size("checkpoint", tmp_path, torch.float32, "cpu")
    safety.check_declared_size("checkpoint", tmp_path, torch.float16, "cuda:1")


def test_device_option_holds_for_one_invocation(monkeypatch):
    from typer.testing import CliRunner

    from rnr_interp.cli import app

    monkeypatch.delenv("RNR_DEVICE", raising=False)
    ok = CliRunner().invoke(app, ["--device", "cpu", "model-info", "tiny-llama:1"])
    assert ok.exit_code == 0, ok.output
    import os

    assert "RNR_DEVICE" not in os.environ  # the next invocation (tests run many) is not steered
    bad = CliRunner().invoke(app, ["--device", "tpu9", "model-info", "tiny-llama:1"])
    assert bad.exit_code == 2 and "'tpu9' is not a torch device" in bad.output


def test_dtype_is_chosen_recorded_and_named_when_bad(monkeypatch):
    from typer.testing import CliRunner

    from rnr_interp.cli import app
    from rnr_interp.engine.decoding import Decoding
    from rnr_interp.engine.generate import generate
    from rnr_interp.models import resolve_dtype

    monkeypatch.delenv("RNR_DTYPE", raising=False)
    assert resolve_dtype() == torch.float32
    lm = load_model("tiny-llama:2", dtype="bfloat16")
    assert lm.facts()["dtype"] == "bfloat16"  # in every run's config: no resume across dtypes
    [[g]] = generate(lm, [lm.encode(lm.render("2+2="))], decoding=Decoding(max_new_tokens=4))
    assert len(g.tokens) >= 1 and g.logprob <= 0
    out = CliRunner().invoke(app, ["--dtype", "bfloat16", "model-info", "tiny-llama:1"])
    assert out.exit_code == 0 and json.loads(out.stdout.strip())["dtype"] == "bfloat16"
    import os

    assert "RNR_DTYPE" not in os.environ
    bad = CliRunner().invoke(app, ["--dtype", "fp8", "model-info", "tiny-llama:1"])
    assert bad.exit_code == 2 and "dtype 'fp8' is not one of float32, bfloat16, float16" in bad.output


# -- the researcher's own model ------------------------------------------------------------


@pytest.fixture
def offline(monkeypatch):
    """No hub, whatever the machine's network: a hub name fails at once."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_hub_name_without_a_slash_goes_to_the_hub_loader(monkeypatch, offline):
    import rnr_interp.models.specs as specs

    with pytest.raises(ModelSpecError, match="'gpt2' is not a built-in model.*hub model 'gpt2' .*cannot be reached") as err:
        load_model("gpt2")
    assert "\n" not in str(err.value)
    asked = []

    def cached_hub(name, dtype, device):
        asked.append(name)
        return build_tiny("tiny-gpt2", n_layers=1)

    monkeypatch.setattr(specs, "load_hub", cached_hub)
    lm = load_model("gpt2")
    assert asked == ["gpt2"] and lm.spec == "gpt2" and lm.facts()["architecture"] == "GPT2LMHeadModel"


def snapshot(model: torch.nn.Module, tokenizer) -> dict:
    """Everything wrapping could change in place: module classes, parameters (values and
    storage), mode, the tokenizer's pad token."""
    return {"types": [type(m) for m in model.modules()], "training": model.training, "pad": tokenizer.pad_token,
            "params": {n: (p.data_ptr(), p.detach().clone()) for n, p in model.named_parameters()}}


def same_snapshot(before: dict, after: dict) -> bool:
    return (before["types"] == after["types"] and before["training"] == after["training"] and before["pad"] == after["pad"]
            and before["params"].keys() == after["params"].keys()
            and all(before["params"][n][0] == after["params"][n][0] and torch.equal(before["params"][n][1], after["params"][n][1])
                    for n in before["params"]))


def tiny_audit(lm, out):
    from rnr_interp.analyses.audit import run_audit
    from rnr_interp.engine.sampling import Probe
    from rnr_interp.tasks import load_task

    run_audit(lm, load_task("arithmetic", n=2), out, probe=Probe(k=2), deployed=Decoding(max_new_tokens=4), progress=False)


def test_users_hf_model_is_wrapped_as_a_copy_and_never_changed(tmp_path):
    model, tok = build_tiny("tiny-llama", n_layers=2)
    model.train()  # a user's model in any mode stays in it
    tok.pad_token = None
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    with torch.no_grad():
        logits = model(ids).logits
    before = snapshot(model, tok)
    lm = load_model(model, tokenizer=tok)
    assert lm.spec.startswith("object:") and lm.hf_model is not model
    tiny_audit(lm, tmp_path / "run")
    assert same_snapshot(before, snapshot(model, tok))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)
    # the copy answers as the same model loaded by its spec does
    reference = load_model("tiny-llama:2")
    assert torch.allclose(lm.bridge(ids), reference.bridge(ids), atol=1e-5)
    paired = load_model((model, tok), name="mine")
    assert paired.spec == "mine" and paired.facts()["n_layers"] == 2


def test_users_transformer_bridge_is_wrapped_as_a_copy_and_never_changed(tmp_path):
    from transformer_lens.model_bridge import TransformerBridge

    model, tok = build_tiny("tiny-qwen2", n_layers=2)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    bridge = TransformerBridge.boot_transformers(str(tmp_path / "ckpt"), device="cpu")
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    with torch.no_grad():
        logits = bridge(ids)
    before = snapshot(bridge, bridge.tokenizer)
    lm = load_model(bridge)
    assert lm.bridge is not bridge and lm.tokenizer is not bridge.tokenizer
    tiny_audit(lm, tmp_path / "run")
    assert same_snapshot(before, snapshot(bridge, bridge.tokenizer))
    with torch.no_grad():
        assert torch.equal(bridge(ids), logits)
        assert torch.allclose(lm.bridge(ids), logits, atol=1e-5)


def test_objects_that_are_not_models_are_refused_in_one_line():
    model, tok = build_tiny("tiny-llama", n_layers=1)
    with pytest.raises(ModelSpecError, match="a LlamaForCausalLM needs its tokenizer"):
        load_model(model)
    with pytest.raises(ModelSpecError, match="cannot load a dict as a model"):
        load_model({"not": "a model"})
    with pytest.raises(ModelSpecError, match="tokenizer= and name= go with a model object"):
        load_model("tiny-llama:1", tokenizer=tok)


def test_bos_is_read_from_what_the_tokenizer_does(tmp_path):
    # a tokenizer converted from a GGUF (Gemma 3's) adds BOS in its post-processor while
    # add_bos_token says False; prompts must still start with BOS
    from tokenizers.processors import TemplateProcessing

    from rnr_interp.models import char_tokenizer, tokenizer_adds_bos

    model, _ = build_tiny("tiny-llama", n_layers=2)
    tok = char_tokenizer(chat=False)
    assert not tokenizer_adds_bos(tok) and tok("ab").input_ids == tok("ab", add_special_tokens=False).input_ids
    tok.backend_tokenizer.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", tok.bos_token_id)])
    assert not getattr(tok, "add_bos_token", False) and tokenizer_adds_bos(tok)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path))
    assert lm.encode(lm.render("ab")) == [tok.bos_token_id, *tok("ab", add_special_tokens=False).input_ids]
