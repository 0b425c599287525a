"""Multiple-choice results read against chance: the baselines and answer-change counts."""

from __future__ import annotations

import math

import pytest

from rnr_interp.metrics import answer_changes, chance_baselines
from rnr_interp.report.text import chance_lines

ABCD = ("A", "B", "C", "D")


def test_uniform_chance_per_question_option_count() -> None:
    # The case: four options, K = 8, guessing reaches 1 - 0.75^8 = 0.90.
    c = chance_baselines(["B"] * 4, ["A", "B", "C", "D"], [ABCD] * 4, k=8)
    assert c["uniform"]["D"] == pytest.approx(0.25)
    assert c["uniform"]["O_K"] == pytest.approx(1 - 0.75**8)
    # Three- and five-option questions mixed: the mean of the per-question values.
    mixed = chance_baselines([None, None], ["A", "E"], [ABCD[:3], ABCD + ("E",)], k=2)
    assert mixed["uniform"]["D"] == pytest.approx((1 / 3 + 1 / 5) / 2)
    assert mixed["uniform"]["O_K"] == pytest.approx(((1 - (2 / 3) ** 2) + (1 - 0.8**2)) / 2)
    assert mixed["deployed_counts"]["unparsed"] == 2 and mixed["warning"] is None


def test_guessing_like_the_model_and_the_dominance_warning() -> None:
    # 39 of 40 deployed answers are "A"; 10 questions have gold A.
    gold = ["A"] * 10 + ["B"] * 10 + ["C"] * 10 + ["D"] * 10
    deployed = ["A"] * 39 + ["B"]
    c = chance_baselines(deployed, gold, [ABCD] * 40, k=8)
    p_a, p_b = 39 / 40, 1 / 40
    assert c["deployed_distribution"]["D"] == pytest.approx((10 * p_a + 10 * p_b) / 40)
    expected_o = (10 * (1 - (1 - p_a) ** 8) + 10 * (1 - (1 - p_b) ** 8)) / 40
    assert c["deployed_distribution"]["O_K"] == pytest.approx(expected_o)
    assert c["deployed_counts"] == {"A": 39, "B": 1, "C": 0, "D": 0, "unparsed": 0}
    assert c["dominant"] == "A" and c["dominant_share"] == pytest.approx(0.975)
    assert "'A' is 98% of the parsed deployed answers (39 of 40)" in c["warning"]
    lines = chance_lines(c)
    assert any("O_8 0.900" in line for line in lines) and lines[-1].startswith("warning:")
    # Not renormalised to a question's options: a guess of "C" on a two-option question
    # is a miss, as the model's own "C" would be; an unanswered question's None too.
    two = chance_baselines(["C", "C", "A"], ["A", "B", "C"], [("A", "B"), ("A", "B"), ABCD[:3]], k=None)
    assert two["deployed_distribution"]["D"] == pytest.approx((1 / 3 + 0.0 + 2 / 3) / 3)
    assert two["uniform"]["O_K"] is None
    silent = chance_baselines(["A", None], ["A", "A"], [ABCD] * 2, k=1)
    assert silent["deployed_distribution"]["D"] == pytest.approx(0.5)


def test_chance_rejects_gold_outside_options() -> None:
    with pytest.raises(ValueError, match="gold 'E' is not one of the options"):
        chance_baselines(["A"], ["E"], [ABCD], k=4)
    with pytest.raises(ValueError, match="one deployed answer, gold and option list"):
        chance_baselines(["A"], ["A", "B"], [ABCD], k=4)


def test_answer_changes_separate_repairs_from_bias_shifts() -> None:
    # Ten failures answered "A"; an intervention moves all to "D"; three have gold D.
    gold = ["D", "D", "D", "B", "B", "C", "C", "C", "B", "C"]
    moved = answer_changes(["A"] * 10, ["D"] * 10, gold)
    assert (moved["changed"], moved["to_gold"], moved["to_other"], moved["unchanged"]) == (10, 3, 7, 0)
    assert moved["after_counts"] == {"D": 10}
    assert moved["to_gold_by_chance"] == pytest.approx(3.0)  # all three repairs are the shift itself
    # A targeted repair: only the gold-D questions move, each to its gold.
    fixed = answer_changes(["A"] * 10, ["D", "D", "D"] + ["A"] * 7, gold)
    assert (fixed["changed"], fixed["to_gold"], fixed["to_other"]) == (3, 3, 0)
    lost = answer_changes(["A", "B"], [None, "B"], ["C", "B"])
    assert (lost["to_other"], lost["unchanged"], lost["after_counts"]) == (1, 1, {})
    assert not math.isnan(lost["to_gold_by_chance"])


def test_audit_summary_reports_chance_for_multiple_choice_only(tmp_path) -> None:
    from rnr_interp.analyses.audit import run_audit
    from rnr_interp.engine.decoding import Decoding
    from rnr_interp.models import load_model
    from rnr_interp.records import RunDir
    from rnr_interp.engine.sampling import Probe
    from rnr_interp.tasks import load_task

    lm = load_model("tiny-llama")
    task = load_task("arithmetic_mc", n=5, n_choices=3)
    s = run_audit(lm, task, tmp_path / "mc", probe=Probe(k=3, temperature=1.0), deployed=Decoding(max_new_tokens=4),
                  progress=False)
    dep = RunDir(tmp_path / "mc").read_records().query("probe == 'deployed'")
    assert s.chance["uniform"] == {"D": pytest.approx(1 / 3), "O_K": pytest.approx(1 - (2 / 3) ** 3)}
    assert sum(s.chance["deployed_counts"].values()) == len(dep) == 5
    assert s.chance["deployed_counts"]["unparsed"] == int(dep["extracted"].isna().sum())
    numeric = run_audit(lm, load_task("arithmetic", n=2), tmp_path / "num", probe=Probe(k=2, temperature=1.0),
                        deployed=Decoding(max_new_tokens=4), progress=False)
    assert numeric.chance is None
    # The report shows the baselines on the multiple-choice page only.
    from rnr_interp.report.html import build_page

    mc_page, _ = build_page(RunDir(tmp_path / "mc"))
    assert "chance baseline" in mc_page and "O_K (K=3)" in mc_page and f"{1 - (2 / 3) ** 3:.3f}" in mc_page
    assert "chance baseline" not in build_page(RunDir(tmp_path / "num"))[0]
    assert "questions (reachable, not realized: " in mc_page  # counts read apart from the names


def test_localisation_summaries_carry_chance_and_answer_changes(tmp_path) -> None:
    """failures, repair and steer summaries (and their pages) read MC results against
    chance; the answer changes of each best block recount from the records."""
    from rnr_interp.models import load_model
    from rnr_interp.records import RunDir
    from rnr_interp.analyses.localise.repair import ablation_probe, run_failures, run_repair
    from rnr_interp.report.html import build_page
    from rnr_interp.analyses.localise.steering import run_steer
    from rnr_interp.tasks import load_task

    lm, task = load_model("tiny-llama"), load_task("arithmetic_mc", n=8)
    failures = run_failures(lm, task, tmp_path / "f", panel=3, progress=False)
    repair = run_repair(lm, task, tmp_path / "r", panel=3, layers=[0, 1], batch_size=8, progress=False)
    for s in (failures, repair):
        assert s.chance["uniform"]["D"] == pytest.approx(0.25) and s.chance["uniform"]["O_K"] is None
        assert sum(s.chance["deployed_counts"].values()) == 8
    best_probes = [ablation_probe(c, b["layer"]) for c, b in repair.best.items() if b is not None]
    assert list((repair.answer_changes or {})) == best_probes
    page, _ = build_page(RunDir(tmp_path / "r"))
    assert page.index("best block") < page.index("chance baseline") < page.index("Other artefacts")
    failures_page, _ = build_page(RunDir(tmp_path / "f"))
    assert failures_page.index("failure set (recognised, answered wrong)") < failures_page.index("recognition</h3>")
    # The random tiny model answers nothing right: steering is skipped, the baselines stay.
    steer = run_steer(lm, task, tmp_path / "s", layer=1, repair_run=tmp_path / "r", alphas=(1.0,), panel=3,
                      progress=False)
    assert steer.chance == repair.chance


def test_multiple_choice_readings_recount_answer_moves() -> None:
    """An ablation that moves every failure from "A" to "D": three repairs, all of them
    the shift itself, counted from the records as stored."""
    import pandas as pd

    from rnr_interp.analyses.localise.readings import multiple_choice_readings
    from rnr_interp.tasks import load_task

    task = load_task("arithmetic_mc", n=6)
    failure = task.questions[:5]
    rows = [{"question_id": q.id, "probe": "deployed", "extracted": "A" if i < 5 else None}
            for i, q in enumerate(task.questions)]
    rows += [{"question_id": q.id, "probe": "ablate:mlp:1", "extracted": "D"} for q in failure]
    out = multiple_choice_readings(task, pd.DataFrame(rows), failure, ["ablate:mlp:1"], grading="flexible")  # no texts to read strictly
    changes = out["answer_changes"]["ablate:mlp:1"]
    n_gold_d = sum(q.answer == "D" for q in failure)
    assert (changes["changed"], changes["to_gold"], changes["to_other"]) == (5, n_gold_d, 5 - n_gold_d)
    assert changes["to_gold_by_chance"] == pytest.approx(n_gold_d)
    assert out["chance"]["deployed_counts"] == {"A": 5, "B": 0, "C": 0, "D": 0, "unparsed": 1}


def test_answer_moves_count_only_the_questions_a_probe_was_asked() -> None:
    """Steering rescues only the held-out failures: the others have no row for the probe
    and are neither changed nor unchanged (they were once counted as changed to none)."""
    import pandas as pd

    from rnr_interp.analyses.localise.readings import multiple_choice_readings
    from rnr_interp.tasks import load_task

    task = load_task("arithmetic_mc", n=6)
    failure = task.questions[:6]
    rows = [{"question_id": q.id, "probe": "deployed", "extracted": "A"} for q in failure]
    rows += [{"question_id": q.id, "probe": "steer:rescue:4", "extracted": "A"} for q in failure[:2]]
    changes = multiple_choice_readings(task, pd.DataFrame(rows), failure, ["steer:rescue:4"], grading="flexible")["answer_changes"]
    assert changes["steer:rescue:4"] == {"n": 2, "changed": 0, "to_gold": 0, "to_other": 0, "unchanged": 2,
                                         "after_counts": {}, "to_gold_by_chance": 0.0}


def test_compare_shows_each_runs_chance(tmp_path) -> None:
    from test_compare import hand_run

    from rnr_interp.analyses.checkpoints import compare_runs
    from rnr_interp.records import RunDir
    from rnr_interp.report.html import build_page

    outcomes = {f"q{i}": (i % 2 == 0, i % 3) for i in range(8)}
    base, trained = hand_run(tmp_path / "base", outcomes), hand_run(tmp_path / "trained", outcomes, model="trained")
    base_chance = chance_baselines(["A"] * 8, list("ABCDABCD"), [ABCD] * 8, k=8)
    base.write_summary({"kind": "audit", "n_questions": 8, "k": 8, "D": 0.5, "O_K": 0.5, "gap": 0.0, "D_ci": [0.2, 0.8],
                        "O_K_ci": [0.2, 0.8], "gap_ci": [-0.1, 0.1], "chance": base_chance})
    s = compare_runs(base, trained, tmp_path / "cmp")
    assert s.chance == {"base": base_chance}  # the trained run has no summary to read one from
    page, _ = build_page(RunDir(tmp_path / "cmp"))
    assert "base: guessing, uniform over each question&#x27;s options" in page and "base: warning" in page
