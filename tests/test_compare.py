"""Checkpoint audit: alignment, per-question transitions, propensity bins, statistics,
budget control, figures and the command, on hand-written records and on real audits of
tiny models."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from rnr_interp.analyses.audit import run_audit
from rnr_interp.analyses.checkpoints import (
    DEFAULT_BIN_EDGES, REACHABLE, REALIZED, ROLES, RunMismatchError, budget_control, budget_probe, check_aligned,
    compare_runs, propensity, reached, transitions,
)
from rnr_interp.engine.decoding import Decoding
from rnr_interp.metrics import mcnemar
from rnr_interp.models import load_model
from rnr_interp.records import RECORD_COLUMNS, RunDir
from rnr_interp.engine.sampling import Probe
from rnr_interp.tasks.base import Question, Task

K = 8


def config(model="base", k=K, temperature=1.0, task_name="arithmetic", n=12, **over):
    cfg = {
        "kind": "audit", "model": model,
        "task": {"name": task_name, "answer_format": "a number", "n_questions": n},
        "question_ids_hash": "abc",
        "probe": {"k": k, "temperature": temperature, "top_p": 1.0, "seed": 0, "name": "temperature"},
        "deployed": {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 24},
        "interventions": "[]", "batch_size": 8,
    }
    cfg.update(over)
    return cfg


def rows_for(qid: str, d: bool, c: int, model: str) -> list[dict]:
    """A deployed row and K probe rows of which the first c are correct."""
    base = dict(run_id="r", model=model, task="t", question_id=qid, intervention="", seed=0, text="x",
                extracted=None, gold="1", logprob=0.0, n_tokens=1, finish="stop")
    out = [{**base, "probe": "deployed", "candidate": 0, "correct": d, "correct_strict": d, "correct_flexible": d}]
    out += [{**base, "probe": "temperature", "candidate": j, "correct": j < c, "correct_strict": j < c,
             "correct_flexible": j < c} for j in range(K)]
    assert set(out[0]) == set(RECORD_COLUMNS)
    return out


def hand_run(path, outcomes: dict[str, tuple[bool, int]], **cfg) -> RunDir:
    run = RunDir.create(path, config(**cfg))
    for qid, (d, c) in outcomes.items():
        run.write_question_batch(rows_for(qid, d, c, cfg.get("model", "base")))
    return run


@pytest.fixture
def random_pair(tmp_path):
    """Two hand-written runs with random per-question outcomes (seeded), and the
    outcomes themselves for a direct recount."""
    rng = random.Random(3)
    qids = [f"q{i}" for i in range(60)]
    def outcomes():
        return {q: (rng.random() < 0.4, rng.choice([0, 0, 0, 1, 2, 3, 5, 8])) for q in qids}
    base, trained = outcomes(), outcomes()
    return (hand_run(tmp_path / "base", base), hand_run(tmp_path / "trained", trained, model="trained"), base, trained)


def test_every_question_in_one_category_and_counts_match(random_pair, tmp_path):
    base_run, trained_run, base, trained = random_pair
    s = compare_runs(base_run, trained_run, tmp_path / "cmp")
    t = RunDir(tmp_path / "cmp").read_table("transitions")
    assert sorted(t["question_id"]) == sorted(base) and t["question_id"].is_unique
    assert set(t["realized"]) <= set(REALIZED) and set(t["reachable"]) <= set(REACHABLE)
    # direct recount from the outcomes
    expect_realized = {"gained": 0, "lost": 0, "kept": 0, "never": 0}
    expect_reachable = {"entered": 0, "left": 0, "stayed": 0, "never": 0}
    gained_from_reach = 0
    for q in base:
        (d0, c0), (d1, c1) = base[q], trained[q]
        r = "kept" if d0 and d1 else "gained" if d1 else "lost" if d0 else "never"
        o = "stayed" if c0 and c1 else "entered" if c1 else "left" if c0 else "never"
        expect_realized[r] += 1
        expect_reachable[o] += 1
        gained_from_reach += r == "gained" and c0 > 0
        row = t.set_index("question_id").loc[q]
        assert (row["realized"], row["reachable"]) == (r, o)
        assert row["base_hit_rate"] == c0 / K
    assert s.realized == expect_realized and s.reachable == expect_reachable
    assert sum(s.realized.values()) == sum(s.reachable.values()) == len(base)
    assert s.gained_from["base_reachable"] == gained_from_reach
    assert s.gained_from["base_reachable"] + s.gained_from["base_unreachable"] == expect_realized["gained"]
    # McNemar counts are the lost/gained and left/entered counts
    assert s.stats["D"]["mcnemar"] == mcnemar(expect_realized["lost"], expect_realized["gained"])
    assert s.stats["O_K"]["mcnemar"] == mcnemar(expect_reachable["left"], expect_reachable["entered"])
    d_change = (expect_realized["gained"] - expect_realized["lost"]) / len(base)
    assert s.stats["D"]["change"] == pytest.approx(d_change)
    lo, hi = s.stats["D"]["change_ci"]
    assert lo < d_change < hi
    assert json.loads((tmp_path / "cmp" / "summary.json").read_text())["kind"] == "compare"


def test_propensity_bins_recount(random_pair):
    """Default bins are the paper's, (lo, hi] with the top bin "hit rate > 35%";
    finer bins on request, recounted from the outcomes."""
    base_run, trained_run, base, trained = random_pair
    t = transitions(base_run.read_records(), trained_run.read_records())
    assert list(propensity(t)["bin"]) == ["[0, 0.1]", "(0.1, 0.35]", "(0.35, 1]"]
    for edges in (DEFAULT_BIN_EDGES, [0, 0.25, 0.375, 0.65, 1.0]):  # 0.25 = 2/8 and 0.375 = 3/8 sit on edges
        table = propensity(t, edges)
        for _, row in table.iterrows():
            first = row["lo"] == 0
            members = [q for q, (d, c) in base.items() if not d and c > 0
                       and (row["lo"] < c / K or (first and c / K == 0)) and c / K <= row["hi"]]
            assert row["n"] == len(members)
            assert row["n_realized"] == sum(trained[q][0] for q in members)
            if members:
                lo, hi = row["realized_rate_ci"]
                assert lo <= row["realized_rate"] <= hi
        pool = sum(1 for d, c in base.values() if not d and c > 0)
        assert table["n"].sum() == pool  # every base-reachable, unrealized question lands in one bin
    top = propensity(t).iloc[-1]
    assert top["n"] == sum(1 for d, c in base.values() if not d and c / K > 0.35)
    with pytest.raises(ValueError, match="increasing"):
        propensity(t, [0, 0.5, 0.5, 1])


@pytest.mark.parametrize("change, keys", [
    ({"probe": {"k": 16, "temperature": 1.0, "top_p": 1.0, "seed": 0, "name": "temperature"}}, ["probe.k"]),
    ({"probe": {"k": K, "temperature": 0.7, "top_p": 0.9, "seed": 0, "name": "temperature"}}, ["probe.temperature", "probe.top_p"]),
    ({"task": {"name": "gsm8k", "answer_format": "a number", "n_questions": 12}}, ["task"]),
    ({"question_ids_hash": "other"}, ["question_ids_hash"]),
    ({"deployed": {"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 24}}, ["deployed"]),
])
def test_mismatched_runs_are_refused_naming_the_difference(tmp_path, change, keys):
    base = hand_run(tmp_path / "b", {"q0": (True, 1)})
    other = hand_run(tmp_path / "t", {"q0": (True, 1)}, model="trained", **change)
    with pytest.raises(RunMismatchError) as err:
        compare_runs(base, other, tmp_path / "cmp")
    assert err.value.keys == keys
    for key in keys:
        assert key in str(err.value)
    assert not (tmp_path / "cmp").exists()


def test_model_and_probe_seed_may_differ():
    a = config()
    b = config(model="ckpt", probe={**config()["probe"], "seed": 5})
    check_aligned(a, b)


def test_incomplete_run_is_refused(tmp_path):
    base = hand_run(tmp_path / "b", {"q0": (True, 1), "q1": (False, 0)})
    trained = hand_run(tmp_path / "t", {"q0": (True, 1)}, model="trained")
    with pytest.raises(RunMismatchError, match="only in the base run"):
        compare_runs(base, trained, tmp_path / "cmp")


class FirstChar(Task):
    """Correct when the first generated character is one of 30 (a tiny random model
    hits it sometimes, so every category occurs)."""

    name = "first_char"
    max_new_tokens = 3

    def extract(self, generation: str) -> str | None:
        return generation[:1] or None

    def grade(self, extracted, q) -> bool:
        return extracted is not None and extracted in q.answer


def first_char_task(n=16) -> FirstChar:
    pool = [chr(c) for c in range(33, 127)]
    rng = random.Random(0)
    return FirstChar([Question(id=f"fc-{i}", text=f"Say something {i}", answer="".join(rng.sample(pool, 30)))
                      for i in range(n)], source="test")


def test_real_audits_of_tiny_models(tmp_path):
    task = first_char_task()
    probe = Probe(k=4, temperature=1.0)
    runs, models = [], []
    for seed in (0, 1):
        lm = load_model("tiny-llama", seed=seed)
        run_audit(lm, task, tmp_path / f"run{seed}", probe=probe, progress=False)
        runs.append(RunDir(tmp_path / f"run{seed}"))
        models.append(lm)
    s = compare_runs(*runs, tmp_path / "cmp", control_models=dict(zip(ROLES, models)), control_task=task)
    t = RunDir(tmp_path / "cmp").read_table("transitions")
    assert len(t) == len(task) == s.n_questions
    assert sum(s.realized.values()) == sum(s.reachable.values()) == len(task)
    # recount from the records themselves
    for run, who in zip(runs, ("base", "trained")):
        rec = run.read_records()
        dep = rec[rec["probe"] == "deployed"].set_index("question_id")["correct"]
        reach = rec[rec["probe"] == "temperature"].groupby("question_id")["correct"].any()
        assert (t.set_index("question_id")[f"{who}_d"] == dep.loc[t["question_id"]]).all()
        assert (t.set_index("question_id")[f"{who}_o"] == reach.loc[t["question_id"]]).all()
    assert len(set(t["realized"])) > 1 and len(set(t["reachable"])) > 1  # the task does spread outcomes
    # budget control: every question re-probed by both models, 2K fresh samples each
    bc = s.budget_control
    assert bc["k_control"] == 2 * probe.k and set(bc["budgets"]) == {"4", "8"}
    ctrl = RunDir(tmp_path / "cmp").read_records()
    assert set(ctrl["probe"]) == {"temperature_base_k8", "temperature_trained_k8"}
    assert ctrl.groupby(["probe", "question_id"]).size().eq(8).all()
    assert set(ctrl["question_id"]) == set(t["question_id"])
    d = {who: t.set_index("question_id")[f"{who}_d"] for who in ROLES}
    for budget, b in bc["budgets"].items():
        o = {who: ctrl[(ctrl["probe"] == f"temperature_{who}_k8") & (ctrl["candidate"] < int(budget))]
             .groupby("question_id")["correct"].any() for who in ROLES}
        assert b["O_base"] == pytest.approx(o["base"].mean()) and b["O_trained"] == pytest.approx(o["trained"].mean())
        assert b["reachable_change"] == pytest.approx(o["trained"].mean() - o["base"].mean())
        assert b["gap_trained"] == pytest.approx(o["trained"].mean() - d["trained"].mean())
        lo, hi = b["reachable_change_ci"]
        assert lo <= b["reachable_change"] <= hi
        assert b["n_left"] == int((o["base"] & ~o["trained"]).sum())
    assert bc["budgets"]["8"]["O_base"] >= bc["budgets"]["4"]["O_base"]  # the first K are a subset of the 2K
    # the source of gains carries its chance null, from the base control's own samples
    from rnr_interp.grading import derangement_null

    gained = t.loc[t["realized"] == "gained", "question_id"].tolist()
    dep = runs[0].read_records()
    dep = dep[dep["probe"] == "deployed"]
    for point in bc["gained_source"]["curve"]:
        rows = pd.concat([dep, ctrl[(ctrl["probe"] == "temperature_base_k8") & (ctrl["candidate"] < point["k"])]])
        qids = rows.loc[rows["probe"] == "deployed", "question_id"].tolist()
        _, o_null = derangement_null(rows, task, "temperature_base_k8", runs[0].grading)
        expected = pd.Series(o_null, index=qids).reindex(gained).mean() if gained else float("nan")
        assert point["null_share"] == pytest.approx(expected, nan_ok=True)
    # fresh seeds: the control's samples are not the audit's
    audit_rows = runs[1].read_records()
    first = audit_rows[audit_rows["probe"] == "temperature"].set_index(["question_id", "candidate"])["seed"]
    fresh = ctrl[ctrl["probe"] == "temperature_trained_k8"].set_index(["question_id", "candidate"])["seed"]
    assert not set(first.loc[first.index.intersection(fresh.index)]) & set(fresh)


def test_budget_control_samples_fresh_2k(tmp_path):
    task = first_char_task(6)
    lm = load_model("tiny-llama", seed=1)
    cfg = config(k=4)
    probe = budget_probe(cfg, "trained")
    assert (probe.k, probe.seed, probe.name) == (8, 1, "temperature_trained_k8")
    assert budget_probe(cfg, "base").name == "temperature_base_k8"
    ids = ["fc-1", "fc-4"]
    out = budget_control(lm, task, ids, probe, Decoding(max_new_tokens=3))
    assert sorted(set(out["question_id"])) == ids and out.groupby("question_id").size().eq(8).all()
    assert list(reached(out, ids, 8)) == [bool(out[out["question_id"] == q]["correct"].any()) for q in ids]
    with pytest.raises(ValueError, match="fewer than 9"):
        reached(out, ids, 9)
    with pytest.raises(ValueError, match="not in task"):
        budget_control(lm, task, ["nope"], probe, Decoding(max_new_tokens=3))


def test_source_of_gains_is_a_curve_over_the_budgets_the_control_sampled():
    """The share of gained answers the base model reaches, read at 1, 2, 4, ... up to the
    control's budget (K and the largest among them), each with its Wilson interval."""
    from rnr_interp.analyses.checkpoints import control_budget, curve_budgets, gains_source_curve
    from rnr_interp.metrics import wilson_interval

    t = pd.DataFrame({"question_id": ["q0", "q1", "q2", "q3"], "realized": ["gained", "gained", "gained", "never"]})
    hit_at = {"q0": 0, "q1": 5, "q2": None, "q3": 0}  # the candidate where the base model first hits, if any
    rows = pd.DataFrame([{"question_id": q, "candidate": c, "correct": hit_at[q] is not None and c >= hit_at[q]}
                         for q in hit_at for c in range(8)])
    assert curve_budgets(2, 8) == [1, 2, 4, 8] and curve_budgets(3, 12) == [1, 2, 3, 4, 8, 12]
    src = gains_source_curve(t, rows, curve_budgets(2, 8), k=2)
    assert [(c["k"], c["base_reachable"], c["n_gained"]) for c in src["curve"]] == [(1, 1, 3), (2, 1, 3), (4, 1, 3), (8, 2, 3)]
    assert src["curve"][-1]["ci"] == list(wilson_interval(2, 3))
    assert src["trend"].startswith("rises from 0.33 at K=2 to 0.67") and src["trend"].endswith("at K=8")
    cfg = config(k=4)
    assert control_budget(cfg) == 8 and control_budget(cfg, budget_k=20) == 20 and control_budget(cfg, budget_k=5) == 8
    assert budget_probe(cfg, "base", budget_k=20).k == 20


def test_the_source_of_gains_is_read_against_what_the_base_samples_reach_by_chance():
    """Planted: each question's first three base samples name the three other questions'
    golds, the fourth its own. By chance (graded against a deranged gold) the share is 1
    from K=3 on, whatever the derangement, and below 1 at K=1; the curve carries it per
    budget, averaged over the gained questions."""
    from rnr_interp.analyses.checkpoints import gains_source_curve, gains_source_null
    from rnr_interp.tasks import load_task

    task = load_task("arithmetic", n=4)
    golds = [q.answer for q in task.questions]
    assert len(set(golds)) == 4
    ids = [q.id for q in task.questions]
    deployed = pd.DataFrame([{"question_id": q, "probe": "deployed", "candidate": 0, "text": "Answer: 0",
                              "finish": "stop", "correct": False} for q in ids])
    control = pd.DataFrame([{"question_id": q, "probe": "temperature_base_k4", "candidate": j,
                             "text": f"Answer: {golds[(i + 1 + j) % 4]}", "finish": "stop", "correct": j == 3}
                            for i, q in enumerate(ids) for j in range(4)])
    null = gains_source_null(control, deployed, task, "strict", [1, 2, 3, 4])
    assert (null[3] == 1.0).all() and (null[4] == 1.0).all()
    assert (null[1] < 1.0).all() and (null[1] > 0.0).all() and (null[2] >= null[1]).all()
    t = pd.DataFrame({"question_id": ids, "realized": ["gained", "gained", "never", "never"]})
    src = gains_source_curve(t, control, [1, 2, 3, 4], k=2, null=null)
    assert [c["share"] for c in src["curve"]] == [0.0, 0.0, 0.0, 1.0]
    assert [c["null_share"] for c in src["curve"]] == pytest.approx([null[b].iloc[:2].mean() for b in (1, 2, 3, 4)])
    assert src["trend"].endswith("(by chance: " + f"{null[2].iloc[:2].mean():.3f} and 1.000)")


def test_prompt_formats_stated_warned_and_shared_prompt_share(tmp_path):
    """Runs asked in different prompt formats are compared with a warning naming both;
    a shared-prompt run (the trained model in the base format) gives the share of the
    gain retained, and must really be in the base format."""
    chat = {"template": "<|im_start|>user\n{user_message}<|im_end|>\n<|im_start|>assistant\n", "add_bos": False}
    plain = {"template": "{user_message}", "add_bos": True}
    qids = [f"q{i}" for i in range(10)]
    base = hand_run(tmp_path / "b", {q: (i < 2, 1) for i, q in enumerate(qids)}, prompt_format=plain)
    trained = hand_run(tmp_path / "t", {q: (i < 6, 1) for i, q in enumerate(qids)}, model="trained", prompt_format=chat)
    shared = hand_run(tmp_path / "s", {q: (i < 3, 1) for i, q in enumerate(qids)}, model="trained", prompt_format=plain)
    s = compare_runs(base, trained, tmp_path / "cmp", shared_prompt=shared)
    pf = s.prompt_formats
    assert pf["base"] == plain and pf["trained"] == chat and pf["same"] is False and "--shared-prompt" in pf["warning"]
    sp = s.shared_prompt["D"]
    assert (sp["native_change"], sp["shared_change"]) == (pytest.approx(0.4), pytest.approx(0.1))
    assert sp["share_retained"] == pytest.approx(0.25)
    assert s.shared_prompt["O_K"]["share_retained"] is None  # every question reachable both ways: no change to share
    same = compare_runs(base, hand_run(tmp_path / "t2", {q: (True, 1) for q in qids}, model="trained", prompt_format=plain),
                        tmp_path / "cmp2")
    assert same.prompt_formats["same"] is True and same.prompt_formats["warning"] is None
    with pytest.raises(ValueError, match="base run's prompt format"):
        compare_runs(base, trained, tmp_path / "cmp3", shared_prompt=trained)
    with pytest.raises(ValueError, match="must audit the trained model"):
        compare_runs(base, trained, tmp_path / "cmp4", shared_prompt=base)


def test_audit_records_prompt_format_and_prompt_like_asks_in_it(tmp_path):
    """`rnr audit` records the prompt format; `--prompt-like RUN` asks in RUN's format
    (a chat model asked in a plain model's format prompts with the plain text + BOS)."""
    from typer.testing import CliRunner

    from rnr_interp.cli import app
    from rnr_interp.models import PromptFormat

    args = ["audit", "--task", "arithmetic", "--n", "2", "--k", "1", "--quiet", "--max-new-tokens", "2"]
    res = CliRunner().invoke(app, [*args, "--model", "tiny-gpt2", "--out", str(tmp_path / "plain")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, [*args, "--model", "tiny-llama", "--out", str(tmp_path / "shared"),
                                   "--prompt-like", str(tmp_path / "plain")])
    assert res.exit_code == 0, res.output
    plain_fmt, shared_fmt = (RunDir(tmp_path / x).config["prompt_format"] for x in ("plain", "shared"))
    assert plain_fmt == shared_fmt == {"template": "{user_message}", "add_bos": True}
    lm = load_model("tiny-llama")
    assert lm.prompt_format.describe() != plain_fmt  # its own format is the chat template
    lm.prompt_override = PromptFormat.from_description(plain_fmt)
    assert lm.encode(lm.render("1+1=")) == load_model("tiny-gpt2").encode("1+1=")
    res = CliRunner().invoke(app, [*args, "--model", "tiny-llama", "--out", str(tmp_path / "x"), "--prompt-like", str(tmp_path)])
    assert res.exit_code == 2 and "not a run folder" in res.output


def test_figures_and_command(random_pair, tmp_path):
    from typer.testing import CliRunner

    import typer
    from rnr_interp.commands.compare import compare as compare_command
    from rnr_interp.report.compare_figures import change_figure, gained_lost_figure, propensity_figure

    base_run, trained_run, _, _ = random_pair
    app = typer.Typer()
    app.command("compare")(compare_command)
    app.command("noop")(lambda: None)  # two commands, so "compare" is a subcommand as in rnr
    res = CliRunner().invoke(app, ["compare", str(base_run.path), str(trained_run.path), "--out", str(tmp_path / "cmp")])
    assert res.exit_code == 0, res.output
    assert "gained" in res.output and "McNemar" in res.output
    cmp = RunDir(tmp_path / "cmp")
    s = cmp.read_summary()
    t = cmp.read_table("transitions")
    fig = gained_lost_figure(t)
    heights = {tr.name: list(tr.y) for tr in fig.data}
    assert sum(map(sum, heights.values())) == s.realized["gained"] + s.realized["lost"]
    fig = change_figure([("pair", s)])
    assert [list(tr.y) for tr in fig.data] == [[s.stats["D"]["change"]], [s.stats["O_K"]["change"]]]
    fig = propensity_figure([("pair", cmp.read_table("propensity"))])
    assert len(fig.data) == 1
    res = CliRunner().invoke(app, ["compare", str(base_run.path), str(tmp_path / "cmp"), "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "differ in" in res.output
