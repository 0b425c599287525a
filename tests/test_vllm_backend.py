"""The vLLM sampling backend: what runs without vLLM (prompts, refusals, output
conventions) everywhere; a real audit on vLLM only where it is installed with a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rnr_interp.generate import Decoding
from rnr_interp.interventions import Ablate
from rnr_interp.models import load_model
from rnr_interp.sampling import Probe, generator, sample_task
from rnr_interp.tasks import load_task
from rnr_interp.vllm_backend import front_end, to_generation, vllm_available


@pytest.fixture()
def front(tmp_path, monkeypatch):
    monkeypatch.setenv("RNR_CACHE", str(tmp_path))  # the saved tiny checkpoint goes here
    return front_end("tiny-llama:2")


def test_prompts_and_stop_tokens_match_the_transformer_lens_model(front):
    lm = load_model("tiny-llama:2")
    task = load_task("arithmetic", n=3)
    for q in task.questions:
        message = task.user_message(q)
        assert front.encode(front.render(message)) == lm.encode(lm.render(message))
    assert front.stop_token_ids == lm.stop_token_ids
    facts = front.facts()
    # The backend enters the audit config, so TL and vLLM runs never share a run folder.
    assert facts["backend"] == "vllm" and facts["n_layers"] == lm.n_layers and facts["d_vocab"] == lm.facts()["d_vocab"]


def test_interventions_are_refused_before_any_sampling(front):
    with pytest.raises(ValueError, match="interventions need hooks"):
        generator(front, None, [Ablate("mlp", 0)])
    with pytest.raises(ValueError, match="interventions need hooks"):
        sample_task(front, load_task("arithmetic", n=2), probe=Probe(k=2), deployed=Decoding(),
                    interventions=[Ablate("mlp", 0)], progress=False)
    with pytest.raises(ValueError, match="needs a model loaded for it"):
        generator(load_model("tiny-llama:2"), "vllm")
    with pytest.raises(ValueError, match="unknown sampling backend"):
        generator(front, "onnx")


def test_completions_follow_the_engine_conventions(front):
    """A closing stop token is not part of the candidate; text is cut at a stop string."""
    ids = front.tokenizer.encode("12\nQ: x", add_special_tokens=False)
    eos = front.stop_token_ids[0]
    entry = lambda tok, lp: {tok: SimpleNamespace(logprob=lp)}  # noqa: E731 - vLLM's Logprob shape
    stopped = SimpleNamespace(token_ids=ids + [eos], logprobs=[entry(t, -0.5) for t in ids] + [entry(eos, -9.0)], finish_reason="stop")
    g = to_generation(front, stopped, stop_strings=("\nQ:",))
    assert g.tokens == ids and g.text == "12" and g.finish == "stop" and g.logprob == pytest.approx(-0.5 * len(ids))
    cut = SimpleNamespace(token_ids=ids, logprobs=[entry(t, -1.0) for t in ids], finish_reason="length")
    g = to_generation(front, cut, stop_strings=())
    assert g.tokens == ids and g.text == "12\nQ: x" and g.finish == "length" and g.logprob == pytest.approx(-len(ids))


def test_vllm_audit_writes_the_same_record_schema(tmp_path):
    """On a GPU machine with vLLM: an audit through vLLM has the TL run's record schema,
    the same greedy deployed candidates (float32), and reproducible seeded samples."""
    pytest.importorskip("vllm", reason="vLLM is not installed (it needs a CUDA machine): the vLLM backend is untested here")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("vLLM is installed but there is no GPU to run it on")
    from rnr_interp.audit import run_audit
    from rnr_interp.records import RunDir
    from rnr_interp.vllm_backend import load_vllm

    task = load_task("arithmetic", n=4)
    probe = Probe(k=2, temperature=1.0)
    vm = load_vllm("tiny-llama:2", dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True)
    run_audit(vm, task, tmp_path / "vllm", probe=probe, batch_size=2, progress=False)
    run_audit(load_model("tiny-llama:2"), task, tmp_path / "tl", probe=probe, batch_size=2, progress=False)
    got, want = RunDir(tmp_path / "vllm").read_records(), RunDir(tmp_path / "tl").read_records()
    assert list(got.columns) == list(want.columns) and (got.dtypes == want.dtypes).all()
    assert len(got) == len(want)
    deployed = lambda df: df[df["probe"] == "deployed"].set_index("question_id")["text"]  # noqa: E731
    assert deployed(got).equals(deployed(want))
    again = sample_task(vm, task, probe=probe, deployed=Decoding(max_new_tokens=task.max_new_tokens), progress=False)
    samples = got[got["probe"] == "temperature"]["text"].tolist()
    assert sorted(r["text"] for r in again if r["probe"] == "temperature") == sorted(samples)
    assert vllm_available()
