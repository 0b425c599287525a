"""Steering directions and unit silencing against manual computations on tiny models."""

from __future__ import annotations

import pytest
import torch
import typer
from typer.testing import CliRunner

from rnr_interp.engine.generate import generate, last_logits
from rnr_interp.metrics import wilson_interval
from rnr_interp.interventions import Ablate, AblateUnits
from rnr_interp.models import load_model
from rnr_interp.records import RunDir
from rnr_interp.engine.sampling import deployed_decoding
from rnr_interp.engine.sampling import prompt_ids
from rnr_interp.commands.localise import steer as steer_command
from rnr_interp.commands.localise import units as units_command
from rnr_interp.analyses.localise.directions import direction, top_units, unit_scores
from rnr_interp.analyses.localise.steering import random_units, steer_spec, units_sweep
from rnr_interp.tasks import load_task


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama:2")


@pytest.fixture(scope="module")
def task():
    return load_task("arithmetic_mc", n=4)


def halves(task):
    qs = task.questions
    return qs[:2], qs[2:]


def prompts(lm, task):
    return [prompt_ids(lm, task, q) for q in task.questions]


def test_direction_is_difference_of_means(lm, task):
    failure, panel = halves(task)
    out = {}

    def keep(act, hook):
        out.setdefault("acts", []).append(act[0, -1].clone())

    for q in [*failure, *panel]:  # unbatched, unpadded: an independent path
        with torch.inference_mode(), lm.bridge.hooks(fwd_hooks=[("blocks.1.hook_mlp_out", keep)]):
            lm.bridge(torch.tensor([prompt_ids(lm, task, q)]))
    acts = torch.stack(out["acts"])
    v = direction(lm, task, failure, panel, layer=1, component="mlp")
    torch.testing.assert_close(v, acts[:2].mean(0) - acts[2:].mean(0), atol=1e-4, rtol=1e-4)


def test_a_block_is_read_where_the_deployed_answer_starts(lm):
    """With read_at="answer" a reply that writes an opening before its answer is read
    after the opening (the state that chooses the answer's first token), a reply with no
    answer the task reads at the end of the prompt; by default every question is read
    at the end of its prompt."""
    from rnr_interp.analyses.localise.positions import reading_contexts

    arithmetic = load_task("arithmetic", n=3)
    first, second, third = arithmetic.questions
    replies = {first.id: "The final answer is 42.", second.id: "I cannot say.", third.id: "42"}
    contexts = reading_contexts(lm, arithmetic, arithmetic.questions, replies, "answer")
    prompt = prompt_ids(lm, arithmetic, first)
    assert contexts[0][:len(prompt)] == prompt and lm.tokenizer.decode(contexts[0][len(prompt):]).strip() == "The final answer is"
    assert contexts[1] == prompt_ids(lm, arithmetic, second) and contexts[2] == prompt_ids(lm, arithmetic, third)
    assert reading_contexts(lm, arithmetic, [first], replies) == [prompt]
    # read there, v is the difference of the means at those positions, not at the prompts' ends
    at_answer = direction(lm, arithmetic, [first], [second], 1, "mlp", contexts={first.id: contexts[0]})
    at_prompt = direction(lm, arithmetic, [first], [second], 1, "mlp")
    assert not torch.allclose(at_answer, at_prompt)


def test_alpha_zero_changes_nothing(lm, task):
    failure, panel = halves(task)
    v = direction(lm, task, failure, panel, layer=0, component="mlp")
    ps = prompts(lm, task)
    base = last_logits(lm, ps)
    assert torch.equal(last_logits(lm, ps, [steer_spec(0, "mlp", v, 0.0)]), base)
    assert not torch.allclose(last_logits(lm, ps, [steer_spec(0, "mlp", v, 1.0)]), base)
    d = deployed_decoding(task)
    plain = [g[0].text for g in generate(lm, ps, decoding=d)]
    zero = [g[0].text for g in generate(lm, ps, decoding=d, interventions=[steer_spec(0, "mlp", v, 0.0)])]
    assert zero == plain


def test_large_alpha_moves_logit_difference_as_v_predicts(lm, task):
    # At the last layer's output, a large alpha * v dominates the residual stream, so
    # the final RMSNorm sends it along v and the logits follow W_U (gamma * v): the
    # token pair v favours most (a) over least (b) must open up for +alpha, close for -alpha.
    failure, panel = halves(task)
    last = lm.n_layers - 1
    v = direction(lm, task, failure, panel, layer=last, component="layer")
    hf = lm.hf_model
    direct = hf.lm_head.weight.detach() @ (hf.model.norm.weight.detach() * v)
    a, b = int(direct.argmax()), int(direct.argmin())
    ps = prompts(lm, task)

    def diff(alpha):
        logits = last_logits(lm, ps, [steer_spec(last, "layer", v, alpha)])
        return logits[:, a] - logits[:, b]

    scale = 50.0 / float(v.norm())
    assert (diff(scale) > diff(0.0)).all() and (diff(scale) > 0).all()
    assert (diff(-scale) < diff(0.0)).all() and (diff(-scale) < 0).all()


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen2"])
def test_silencing_all_units_equals_silencing_mlp_output(family, task):
    # (Models whose down projection has a bias, e.g. GPT-2, leave the bias when all units are zero.)
    m = load_model(f"{family}:2")
    ps = prompts(m, task)
    d_mlp = m.bridge.cfg.d_mlp
    for layer in range(m.n_layers):
        units = last_logits(m, ps, [AblateUnits(layer, tuple(range(d_mlp)))])
        torch.testing.assert_close(units, last_logits(m, ps, [Ablate("mlp", layer)]), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(units, last_logits(m, ps))


def test_unit_scores_match_manual_down_proj_contributions(lm, task):
    failure, panel = halves(task)
    v = direction(lm, task, failure, panel, layer=1, component="mlp")
    down = lm.hf_model.model.layers[1].mlp.down_proj
    seen = []
    handle = down.register_forward_hook(lambda mod, inp, out: seen.append(inp[0][0, -1].detach().clone()))
    try:
        for q in failure:
            with torch.inference_mode():
                lm.hf_model(input_ids=torch.tensor([prompt_ids(lm, task, q)]))
    finally:
        handle.remove()
    act = torch.stack(seen).mean(0)
    expected = act * (down.weight.detach().T @ v)  # unit i writes act_i * down_proj.weight[:, i]
    torch.testing.assert_close(unit_scores(lm, task, failure, 1, v), expected, atol=1e-4, rtol=1e-4)
    scores = expected
    assert top_units(scores, 3) == tuple(int(i) for i in scores.argsort(descending=True)[:3])
    assert random_units(128, 8, seed=1) == random_units(128, 8, seed=1) != random_units(128, 8, seed=2)


POST_MLP_NORM = ("tiny-gemma2", "tiny-olmo2")


@pytest.mark.parametrize("family", ["tiny-llama:2", "tiny-gemma2:2", "tiny-olmo2:2"])
def test_unit_contributions_are_in_the_residual_basis(family, task):
    """Per prompt, the units' contributions sum to what the block writes into the
    residual stream along v (after Gemma-2's or OLMo 2's post-MLP norm, when there is one); with a
    non-trivial norm gain the plain W_out . v scores would not."""
    from rnr_interp.analyses.localise.directions import block_output, unit_contributions

    model = load_model(family)
    if family.startswith(POST_MLP_NORM):
        norm = model.hf_model.model.layers[1].post_feedforward_layernorm
        with torch.no_grad():
            norm.weight.copy_(torch.randn(norm.weight.shape, generator=torch.Generator().manual_seed(0)))
    failure, panel = halves(task)
    v = direction(model, task, failure, panel, layer=1, component="mlp")
    ps = prompts(model, task)
    contrib = unit_contributions(model, ps, 1, v)
    written = block_output(model, ps, 1, "mlp") @ v.float()
    torch.testing.assert_close(contrib.sum(-1), written, atol=1e-3, rtol=1e-3)
    if family.startswith(POST_MLP_NORM):
        from rnr_interp.analyses.localise.directions import last_position

        post = last_position(model, ps, [("mlp.hook_post", 1)])[("mlp.hook_post", 1)]
        naive = (post * (model.bridge.blocks[1].mlp.W_out.detach().float() @ v.float())).sum(-1)
        assert not torch.allclose(naive, written, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("family", ["tiny-llama:2", "tiny-gemma2:2"])
def test_the_units_a_sweep_silences_are_each_blocks_own_top_units(family, task):
    """`mlp_unit_sets` reads every block in one pass; per block it gives the top units
    that v and the unit scores of that block alone give (with and without a post-MLP norm)."""
    from rnr_interp.analyses.localise.directions import mlp_unit_sets

    model = load_model(family)
    failure, panel = halves(task)
    got = mlp_unit_sets(model, task, [0, 1], 5, failure, panel)
    for layer in (0, 1):
        v = direction(model, task, failure, panel, layer=layer, component="mlp")
        assert got[layer] == top_units(unit_scores(model, task, failure, layer, v), 5)
    assert got[0] != got[1]


def test_the_units_a_sweep_silences_are_scored_where_each_answer_starts_when_asked(lm):
    """`mlp_unit_sets` with reading contexts (`rnr repair --units K --read-at answer`)
    scores each block's units where `rnr units --read-at answer` scores the chosen
    block's: v and the contributions at the contexts' last positions, not the prompts'."""
    from rnr_interp.analyses.localise.directions import mlp_unit_sets
    from rnr_interp.analyses.localise.positions import reading_contexts

    arithmetic = load_task("arithmetic", n=6)
    failure, panel = arithmetic.questions[:3], arithmetic.questions[3:]
    replies = {q.id: f"Let me add the numbers. The final answer is {q.answer}." for q in arithmetic.questions}
    contexts = dict(zip(replies, reading_contexts(lm, arithmetic, arithmetic.questions, replies, "answer")))
    assert all(contexts[q.id] != prompt_ids(lm, arithmetic, q) for q in arithmetic.questions)
    got = mlp_unit_sets(lm, arithmetic, [0, 1], 5, failure, panel, contexts=contexts)
    for layer in (0, 1):
        v = direction(lm, arithmetic, failure, panel, layer=layer, component="mlp", contexts=contexts)
        assert got[layer] == top_units(unit_scores(lm, arithmetic, failure, layer, v, contexts=contexts), 5)
    assert got != mlp_unit_sets(lm, arithmetic, [0, 1], 5, failure, panel)


def test_all_units_recover_the_whole_block_repair(lm):
    from tests.test_repair import parity_task

    t = parity_task(6)
    d = deployed_decoding(t, max_new_tokens=3)
    base = generate(lm, prompts(lm, t), decoding=d)
    wrong = [q for q, g in zip(t.questions, base) if not t.grade(t.extract(g[0].text), q)]
    assert wrong
    scores = torch.randn(lm.bridge.cfg.d_mlp, generator=torch.Generator().manual_seed(0))
    for layer in range(lm.n_layers):
        table, whole = units_sweep(lm, t, wrong, layer, scores, ks=(4, lm.bridge.cfg.d_mlp), decoding=d)
        full = table[table["k"] == lm.bridge.cfg.d_mlp]
        assert (full["repair_rate"] == whole).all()
        if whole > 0:
            assert (full["recovered_fraction"] == 1.0).all()
        assert set(table["selection"]) == {"top", "random"}


def test_steer_and_units_commands(tmp_path):
    app = typer.Typer()
    app.command("steer")(steer_command)
    app.command("units")(units_command)
    # A random model answers almost nothing right here, so this checks the wiring and
    # the "skipped" path; the split cohort is exercised below.
    common = ["--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "6", "--panel", "3", "--max-new-tokens", "3", "--quiet"]
    res = CliRunner().invoke(app, ["steer", *common, "--layer", "1", "--alphas", "0,4", "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    s = RunDir(tmp_path / "s").read_summary()
    assert s.kind == "steer" and s.permutation_control is None  # off by default
    table = RunDir(tmp_path / "s").read_table("steering")
    if s.skipped is not None:
        assert table.empty and s.skipped in res.output
    else:
        assert set(table["direction"]) == {"rescue", "induction"} and sorted(set(table["alpha"])) == [0.0, 4.0]
        # alpha = 0 is the deployed generation: nothing rescued, nothing induced.
        assert (table[table["alpha"] == 0]["rate"] == 0).all()
    res = CliRunner().invoke(app, ["steer", *common, "--layer", "1", "--alphas", "0,4", "--permute-control",
                                   "--out", str(tmp_path / "sp")])
    assert res.exit_code == 0, res.output
    sp = RunDir(tmp_path / "sp")
    assert sp.config["permutation_control"] == {"shift": 1}
    if sp.read_summary().skipped is None:
        assert set(sp.read_summary().permutation_control["probes"]) == {"steer:rescue:4"}
        assert "permutation control: the same held-out failures" in res.output
    res = CliRunner().invoke(app, ["steer", *common, "--layer", "1", "--alphas", "0,4", "--random-control",
                                   "--steer-at", "prompt", "--out", str(tmp_path / "sr")])
    assert res.exit_code == 0, res.output
    sr = RunDir(tmp_path / "sr")
    assert sr.config["random_control"] == {"seed": 0} and sr.config["steer_at"] == "prompt"
    if sr.read_summary().skipped is None:
        assert "the same along a random direction" in res.output
    res = CliRunner().invoke(app, ["steer", *common, "--steer-at", "answer", "--out", str(tmp_path / "sbad")])
    assert res.exit_code != 0 and "--steer-at must be one of every, prompt, reply" in res.output
    res = CliRunner().invoke(app, ["units", *common, "--layer", "1", "--ks", "2,32", "--out", str(tmp_path / "u")])
    assert res.exit_code == 0, res.output
    u = RunDir(tmp_path / "u")
    assert u.read_summary().kind == "units"
    if u.read_summary().skipped is None:
        assert set(u.read_table("units")["k"]) == {2, 32}


def test_a_block_steering_or_units_choose_for_themselves_breaks_ties_where_they_read(tmp_path, lm, monkeypatch):
    """Without --layer or --repair-run, `rnr units --read-at answer` sweeps the MLP blocks
    itself; a tie among them is broken reading each selection question where it reads v
    (`CohortRun.reading_contexts`), not at the prompt's end."""
    from rnr_interp.analyses.localise import steering
    from rnr_interp.analyses.localise.positions import reading_contexts
    from rnr_interp.records import DEPLOYED
    from tests.test_repair import parity_task

    ties = []
    real = steering.break_tie
    monkeypatch.setattr(steering, "break_tie", lambda *a, **k: ties.append(k["contexts"]) or real(*a, **k))
    t = parity_task(40)
    d = deployed_decoding(t, max_new_tokens=8)
    u = steering.run_units(lm, t, tmp_path / "u", ks=(2,), draws=2, panel=6, decoding=d, read_at="answer", progress=False)
    assert u.skipped is None, u.skipped
    run = RunDir(tmp_path / "u")
    by_id = {q.id: q for q in t.questions}
    ids = [*run.read_json("failure_set")["selection_ids"], *run.read_json("healthy_panel")["selection_ids"]]
    deployed = run.read_records(filters=[("probe", "=", DEPLOYED)])
    replies = dict(zip(deployed["question_id"], deployed["text"]))
    assert ties == [dict(zip(ids, reading_contexts(lm, t, [by_id[i] for i in ids], replies, "answer")))]


def test_steer_and_units_runs_on_a_split_cohort(tmp_path, lm):
    from rnr_interp.analyses.localise.steering import run_steer, run_units
    from tests.test_repair import parity_task

    t = parity_task(40)
    d = deployed_decoding(t, max_new_tokens=3)
    s = run_steer(lm, t, tmp_path / "s", layer=1, alphas=(0.0, 8.0), panel=6, decoding=d, progress=False)
    assert s.skipped is None, s.skipped
    run = RunDir(tmp_path / "s")
    table = run.read_table("steering")
    assert (table[table["alpha"] == 0]["rate"] == 0).all()
    # chosen on the selection parts, scored on the held-out parts, with Wilson intervals
    sp = s.split
    assert (table["n"] == table["direction"].map({"rescue": sp["n_failure_heldout"], "induction": sp["n_panel_heldout"]})).all()
    assert all((lo, hi) == pytest.approx(wilson_interval(k, n)) for lo, hi, k, n in zip(table["lo"], table["hi"], table["k"], table["n"]))
    by_id = {q.id: q for q in t.questions}
    f_sel = [by_id[i] for i in run.read_json("failure_set")["selection_ids"]]
    p_sel = [by_id[i] for i in run.read_json("healthy_panel")["selection_ids"]]
    v = torch.tensor(run.read_json("direction")["vector"])
    assert torch.allclose(v, direction(lm, t, f_sel, p_sel, 1, "mlp"), atol=1e-5)
    held = set(run.read_json("failure_set")["heldout_ids"])
    steered = run.read_records()
    assert set(steered.loc[steered["probe"].str.startswith("steer:rescue"), "question_id"]) == held
    assert s.steer_at == "every" and "steer_at" not in run.config  # a default run's config is what it always was
    # the same run steering the prompt's last position alone: the same v, recorded as such, another sweep
    at_end = run_steer(lm, t, tmp_path / "s-end", layer=1, alphas=(0.0, 8.0), panel=6, decoding=d, progress=False,
                       steer_at="prompt")
    end_run = RunDir(tmp_path / "s-end")
    assert at_end.steer_at == "prompt" and end_run.config["steer_at"] == "prompt"
    assert end_run.read_json("direction")["vector"] == run.read_json("direction")["vector"]
    assert end_run.read_records()["intervention"].str.endswith(":at-prompt").any()
    assert s.random_control is None and "random_control" not in run.config
    # the random-direction control: the same alphas and held-out questions along a seeded random vector as long as u
    ctl = run_steer(lm, t, tmp_path / "s-random", layer=1, alphas=(0.0, 8.0), panel=6, decoding=d, progress=False,
                    random_control=True)
    ctl_run = RunDir(tmp_path / "s-random")
    random_table, steered_table = ctl_run.read_table("steering_random"), ctl_run.read_table("steering")
    assert ctl_run.config["random_control"] == {"seed": 0} and ctl.random_control["seed"] == 0
    assert ctl.random_control["norm"] == pytest.approx(s.steered_norm_per_alpha, rel=1e-5)
    assert abs(ctl.random_control["cosine_with_v"]) < 0.5  # a random direction in 64 dimensions, not v
    assert random_table[["alpha", "direction", "n"]].equals(steered_table[["alpha", "direction", "n"]])
    assert (random_table[random_table["alpha"] == 0]["rate"] == 0).all()
    probes = set(ctl_run.read_records()["probe"])
    assert {"steer:rescue-random:8", "steer:induction-random:8", "steer:rescue:8"} <= probes
    assert table.equals(steered_table.drop(columns=[c for c in steered_table if c not in table]))  # v's sweep unchanged
    with pytest.raises(ValueError, match="steer_at must be one of every, prompt, reply"):
        run_steer(lm, t, tmp_path / "s-bad", layer=1, decoding=d, progress=False, steer_at="answer")
    u = run_units(lm, t, tmp_path / "u", layer=1, ks=(2, 128), panel=6, decoding=d, progress=False)
    ur = RunDir(tmp_path / "u")
    units = ur.read_table("units")
    assert set(units["selection"]) == {"top", "random"} and set(units["k"]) == {2, 128}
    assert u.random_draws >= 20 and (units[units["selection"] == "random"].groupby("k").size() == u.random_draws).all()
    assert units[(units["selection"] == "random") & (units["k"] == 2)]["units"].nunique() > 1  # the draws differ
    spread = ur.read_table("units_spread").set_index("k")
    rnd = units[(units["selection"] == "random") & (units["k"] == 2)]["recovered_fraction"]
    if u.whole_block_repair > 0:
        assert (units[units["k"] == 128]["recovered_fraction"] == 1.0).all()
        assert spread.at[2, "random_mean"] == pytest.approx(rnd.mean()) and spread.at[2, "random_max"] == pytest.approx(rnd.max())
    assert set(ur.read_records().loc[lambda r: r["probe"].str.startswith("units:"), "question_id"]) <= held


def test_the_clamp_control_clamps_the_held_out_writes_to_the_selection_panel_s_mean(tmp_path, lm):
    from rnr_interp.analyses.localise.directions import block_output
    from rnr_interp.analyses.localise.steering import failure_span, run_steer
    from rnr_interp.analyses.validate import RateFound, steering_found
    from tests.test_repair import parity_task

    t = parity_task(40)
    d = deployed_decoding(t, max_new_tokens=3)
    with pytest.raises(ValueError, match="clamp control clamps an MLP or attention block's write"):
        run_steer(lm, t, tmp_path / "bad", layer=1, component="layer", decoding=d, progress=False, clamp_control=True)
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="not with a given vector"):
        run_steer(lm, t, tmp_path / "bad", layer=1, vector=torch.ones(lm.bridge.cfg.d_model), decoding=d, progress=False,
                  clamp_control=True)
    assert not (tmp_path / "bad").exists()
    s = run_steer(lm, t, tmp_path / "c", layer=1, alphas=(0.0, 8.0), panel=6, decoding=d, progress=False,
                  steer_at="prompt", clamp_control=True, random_control=True)
    assert s.skipped is None, s.skipped
    run = RunDir(tmp_path / "c")
    assert run.config["clamp_control"] == {"seed": 0}
    by_id = {q.id: q for q in t.questions}
    f_sel, p_sel = ([by_id[i] for i in run.read_json(name)["selection_ids"]] for name in ("failure_set", "healthy_panel"))
    writes = block_output(lm, [prompt_ids(lm, t, q) for q in [*f_sel, *p_sel]], 1, "mlp").double()
    panel_mean = writes[len(f_sel):].mean(0)
    v = torch.tensor(run.read_json("direction")["vector"], dtype=torch.float64)
    clamp = s.clamp_control
    assert clamp["value_along_v"] == pytest.approx(float(panel_mean @ v / v.norm()), abs=1e-4)
    assert clamp["failure_value_along_v"] - clamp["value_along_v"] == pytest.approx(s.v_norm, rel=1e-5)
    # the span: the fewest singular directions of the failures' deviations holding 99% of their squared length
    shares = torch.linalg.svdvals(writes[:len(f_sel)] - panel_mean) ** 2
    shares = (shares / shares.sum()).tolist()
    assert clamp["spectrum"] == pytest.approx(shares, abs=1e-6)
    assert clamp["rank"] == next(k for k in range(1, len(shares) + 1) if sum(shares[:k]) >= 0.99 - 1e-12)
    table = run.read_table("steering_clamp")
    sp = s.split
    assert sorted(zip(table["clamped"], table["way"])) == [(c, w) for c in ("random", "span", "v") for w in ("damage", "rescue")]
    assert (table["rank"] == table["clamped"].map({"v": 1, "span": clamp["rank"], "random": clamp["rank"]})).all()
    assert (table["n"] == table["way"].map({"rescue": sp["n_failure_heldout"], "damage": sp["n_panel_heldout"]})).all()
    records = run.read_records()
    clamped = records[records["probe"].str.startswith("steer:clamp")]
    assert set(clamped["probe"]) == {f"steer:clamp-{w}-{c}:1" for c in ("v", "span", "random") for w in ("rescue", "damage")}
    assert clamped["intervention"].str.match(r"clamp:1:hook_mlp_out:\d+:1:.*:at-prompt$").all()
    assert set(clamped.loc[clamped["probe"] == "steer:clamp-rescue-span:1", "question_id"]) == set(
        run.read_json("failure_set")["heldout_ids"])
    for r in table.itertuples():
        right = int(records.loc[records["probe"] == f"steer:clamp-{r.way}-{r.clamped}:1", "correct"].sum())
        assert r.k == (right if r.way == "rescue" else r.n - right)
    # a failure span made of two directions: the rank is theirs, whatever the lengths along them
    two = torch.zeros(6, 8, dtype=torch.float64)
    two[:3, 0], two[3:, 1] = torch.tensor([5.0, 7.0, 9.0]), torch.tensor([1.0, 2.0, 1.5])
    basis, spectrum = failure_span(two)
    assert basis.shape == (2, 8) and spectrum[2] == pytest.approx(0.0, abs=1e-12)
    assert torch.allclose(basis.abs().sum(0)[2:], torch.zeros(6, dtype=torch.float64))
    with pytest.raises(ValueError, match="no span to clamp"):
        failure_span(torch.zeros(3, 8))
    # validate scores the span's rescue against the random span's, as steer:clamp
    rescue = table[table["way"] == "rescue"].set_index("clamped")
    found = steering_found(run)
    assert found["steer:clamp"] == RateFound(1, rescue.at["span", "rate"], rescue.at["span", "lo"], rescue.at["random", "rate"])
    plain = run_steer(lm, t, tmp_path / "p", layer=1, alphas=(0.0, 8.0), panel=6, decoding=d, progress=False,
                      steer_at="prompt", random_control=True)
    assert plain.clamp_control is None and "clamp_control" not in RunDir(tmp_path / "p").config
    assert RunDir(tmp_path / "p").read_table("steering").equals(run.read_table("steering"))  # v's sweep unchanged
    assert "steer:clamp" not in steering_found(RunDir(tmp_path / "p"))


def test_steer_permutation_control_rescores_every_nonzero_alpha_rotated(tmp_path, lm):
    from rnr_interp.analyses.localise.circular import rotated_probe
    from rnr_interp.analyses.localise.steering import run_steer
    from rnr_interp.tasks import rotate_options
    from tests.test_repair import letter_hash_task

    t = letter_hash_task(40)
    d = deployed_decoding(t, max_new_tokens=3)
    s = run_steer(lm, t, tmp_path / "s", layer=1, alphas=(0.0, 4.0, 8.0), panel=8, decoding=d, permutation_control=True,
                  progress=False)
    assert s.skipped is None, s.skipped
    run = RunDir(tmp_path / "s")
    held = run.read_json("failure_set")["heldout_ids"]
    control = s.permutation_control
    assert set(control["probes"]) == {"steer:rescue:4", "steer:rescue:8"} and control["n"] == len(held) > 0
    recs = run.read_records()
    by_id = {q.id: q for q in t.questions}
    table = run.read_table("steering").set_index(["alpha", "direction"])
    for probe in ("steer:rescue:4", "steer:rescue:8"):
        mine = recs[recs["probe"] == rotated_probe(probe)]
        assert sorted(mine["question_id"]) == sorted(held)
        assert all(g == rotate_options(by_id[i]).answer for g, i in zip(mine["gold"], mine["question_id"]))
        assert control["probes"][probe]["repair"]["k"] == int(mine["correct"].sum())
        # the unrotated rate beside it is the sweep's own rescue rate
        alpha = float(probe.rsplit(":", 1)[1])
        assert control["probes"][probe]["unrotated_repair"]["k"] == table.loc[(alpha, "rescue"), "k"]
    assert not recs["probe"].eq(rotated_probe("steer:rescue:0")).any()
    parts = len(run.parts())
    run_steer(lm, t, tmp_path / "s", layer=1, alphas=(0.0, 4.0, 8.0), panel=8, decoding=d, permutation_control=True,
              progress=False)
    assert len(RunDir(tmp_path / "s").parts()) == parts  # resumed, nothing generated again


@pytest.mark.parametrize("kind, own_best, message", [
    ("repair", {"mlp": None}, "swept attn only at its chosen MLP layer (--sweep mlp)"),
    ("repair", {"mlp": None, "attn": None}, "found no attn block that repairs"),
    ("steer", None, "is not a repair run (its kind: 'steer')"),
    ("repair", None, "has no chosen blocks in its summary"),
])
def test_block_from_a_repair_run_says_why_there_is_none(tmp_path, kind, own_best, message):
    """A repair run swept with --sweep mlp never had an attention block of its own to
    choose: that is not the same as 'nothing repaired', and the error says which; a
    folder of another kind is named as such."""
    from rnr_interp.analyses.localise.steering import choose_block

    run = RunDir.create(tmp_path / "repair", {"kind": kind})
    cohort = {"model": "m", "task": "t", "n_questions": 4, "n_failure": 2, "n_panel": 2}
    run.write_summary({"kind": kind, **cohort, **({"sweep": "mlp"} if kind == "repair" else {}),
                       **({"own_best": own_best} if own_best is not None else {})})
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        choose_block(None, layer=None, component="attn", repair_run=tmp_path / "repair")


def test_a_steering_run_without_its_alpha_unit_is_refused(tmp_path):
    """Steering runs record their alpha unit; one from before that is refused, never
    read as raw multiples of v."""
    from rnr_interp.records import RunFolderError
    from rnr_interp.reproduce.findings import steer_alpha_unit

    assert steer_alpha_unit(RunDir.create(tmp_path / "rms", {"kind": "steer", "alpha_unit": "rms"})) == "rms"
    with pytest.raises(RunFolderError, match="before runs recorded their alpha unit .* rerun it"):
        steer_alpha_unit(RunDir.create(tmp_path / "old", {"kind": "steer"}))
    # the paper's claim is judged at alphas in rms or raw units; a run in the block's write units is not read as either
    with pytest.raises(RunFolderError, match="alpha unit 'write'; the paper's claim is judged in rms or raw units"):
        steer_alpha_unit(RunDir.create(tmp_path / "write", {"kind": "steer", "alpha_unit": "write"}))


def test_an_induced_answer_takes_the_failure_s_form_only_when_it_is_wrong_and_one_the_failure_set_gave():
    import pandas as pd

    from rnr_interp.analyses.localise.readings import as_failure_count
    from rnr_interp.tasks.base import Question

    qs = [Question(id=f"q{i}", text="?", answer="5") for i in range(6)]
    probe = "steer:induction:0.5"
    rows = [("q0", "100", False),   # the failure's own answer: induced
            ("q1", "7", False),     # wrong, but not an answer the failure set gave
            ("q2", None, False),    # no answer at all: breakage
            ("q3", float("nan"), False),
            ("q4", "100", True)]    # graded right (its gold is 100): not a failure
    records = pd.DataFrame([{"question_id": q, "probe": probe, "extracted": e, "correct": c} for q, e, c in rows]
                           + [{"question_id": "q1", "probe": "steer:induction:1", "extracted": "100", "correct": False}])
    assert as_failure_count(records, qs, probe, {"100"}) == 1  # q5 has no row under this probe
    assert as_failure_count(records, qs, probe, {"100", "7"}) == 2
    assert as_failure_count(records, qs, "steer:induction:1", {"100"}) == 1
    assert as_failure_count(records, qs, probe, set()) == 0


def test_the_write_unit_is_the_rms_norm_of_what_the_block_writes_at_the_last_prompt_position(lm, task):
    from rnr_interp.analyses.localise.directions import direction
    from rnr_interp.analyses.localise.steering import read_block, steering_vector

    writes = []
    handle = lm.hf_model.model.layers[1].mlp.register_forward_hook(lambda m, i, out: writes.append(out[0, -1].detach()))
    try:
        with torch.no_grad():
            for ids in prompts(lm, task):
                lm.hf_model(torch.tensor([list(ids)]))
    finally:
        handle.remove()
    by_hand = float(torch.stack(writes).pow(2).sum(-1).mean().sqrt())
    failure, panel = task.questions[:2], task.questions[2:]
    reading = read_block(lm, task, failure, panel, 1, "mlp")
    assert reading.write_rms == pytest.approx(by_hand, rel=1e-4)
    assert torch.equal(reading.v, direction(lm, task, failure, panel, 1, "mlp"))  # the same reading, in the same pass
    assert torch.allclose(reading.panel_mean, torch.stack(writes[2:]).float().mean(0), atol=1e-4)
    v = torch.tensor([3.0, 4.0] + [0.0] * (writes[0].shape[0] - 2))
    u = steering_vector(v, "write", by_hand)
    assert float(u.norm()) == pytest.approx(by_hand) and float(u @ v) == pytest.approx(by_hand * 5)
