"""Strict and flexible grades, the chance null, circular evaluation, regrading old runs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rnr_interp.grading import (circular_null, circular_scores, derangement_null, derangements, graded, letter_null, null_line,
                                null_summary, question_null, regrade, unfinished_rate, unfinished_warning)
from rnr_interp.metrics import question_scores
from rnr_interp.records import DEPLOYED, GRADINGS, RECORD_COLUMNS, RECORD_SCHEMA, ProbeLabel, RunDir
from rnr_interp.tasks import load_task
from rnr_interp.tasks.base import MultipleChoiceTask, Question, rotate_options
from rnr_interp.tasks.gsm8k import GSM8K
from rnr_interp.tasks.jsonl import JsonlTask

from gsm8k40_verify import GSM8K40, regrade_gsm8k40, stored_rows


def gsm(answer: str = "131") -> tuple[GSM8K, Question]:
    q = Question(id="q", text="?", answer=answer)
    return GSM8K([q]), q


@pytest.mark.parametrize("text, finish, flexible, strict", [
    ("She has 131 apples. The answer is 131.", "stop", True, True),       # marked
    ("#### 131", "stop", True, True),                                      # marked, GSM8K's own marker
    ("so the total is \\boxed{131} apples", "stop", True, True),           # boxed
    ("131", "stop", True, True),                                           # the answer alone
    ("She buys 12, sells 9 and keeps 131", "stop", True, False),           # several numbers, unmarked: last one
    ("... 140 - 9 = 131", "length", True, False),                          # cut off, unmarked
    ("The answer is 131", "length", True, False),                          # marked at the very end of a cut one
    ("The answer is 131. Next question: 5", "length", True, True),          # marked, then cut later
    ("The answer is 9. Or 131", "stop", False, False),                     # the first marked answer counts
    ("131", "length", True, False),                                        # a lone number in a cut one
    ("122 + 9 = 131.", "stop", True, True),                                # one calculation and its result alone
    ("122 + 9 = 131", "length", True, False),                              # ... in a cut one
    ("122 + 9 equals 131", "stop", True, False),                           # prose around it
])
def test_numeric_candidates_graded_both_ways(text, finish, flexible, strict):
    task, q = gsm()
    grade = task.grade_candidate(text, q, finish)
    assert (grade.flexible, grade.strict) == (flexible, strict)


def test_thousands_separators_read_the_same_strictly():
    task, q = gsm("1000")
    assert task.grade_candidate("The answer is $1,000.", q, "stop").strict
    assert task.grade_candidate("1,000", q, "stop").strict
    assert not task.grade_candidate("The answer is 1,0000.", q, "stop").flexible


def test_letter_and_free_text_candidates():
    mc = MultipleChoiceTask([Question(id="m", text="?", answer="B", choices=("x", "y", "z"), gold_index=1)])
    q = mc.questions[0]
    for text, finish, expected in [("Answer: B", "stop", (True, True)), ("B", "stop", (True, True)),
                                   ("Option B is right because", "stop", (True, False)),
                                   ("Answer: B", "length", (True, False)), ("Answer: B. It is y", "length", (True, True))]:
        g = mc.grade_candidate(text, q, finish)
        assert (g.flexible, g.strict) == expected, text
    free = JsonlTask([Question(id="f", text="?", answer="Paris")])
    q = free.questions[0]
    assert free.grade_candidate("Answer: Paris\nmore", q, "length").strict
    assert not free.grade_candidate("Answer: Paris", q, "length").strict
    assert free.grade_candidate("Paris", q, "stop").strict
    assert not free.grade_candidate("Paris\nThe capital is Paris", q, "stop").strict
    assert free.grade_candidate("Paris\nThe capital is Paris", q, "stop").flexible


def test_strict_never_exceeds_flexible():
    texts = ["The answer is 131.", "131", "Answer: B", "B", "x 131 y 9", "\\boxed{131} then The answer is 9.",
             "The answer is 9 \\boxed{131}", "Answer: Paris", "paris", "**131**", "The answer is 2 * 3 = 6", "",
             "(B).", "Answer: yes", "no", "The answer is 131", "131 - 9 = "]
    tasks = [gsm()[0], MultipleChoiceTask([Question(id="m", text="?", answer="B", choices=("x", "y"), gold_index=1)]),
             JsonlTask([Question(id="f", text="?", answer="paris")]), load_task("arithmetic", n=3)]
    for task, text, finish in itertools.product(tasks, texts, ("stop", "length")):
        for q in task.questions:
            g = task.grade_candidate(text, q, finish)
            assert g.strict <= g.flexible, (task.name, text, finish)


def test_derangements_have_no_fixed_point_and_are_permutations():
    perms = derangements(5, 200, seed=3)
    assert (perms != np.arange(5)).all()
    assert all(sorted(p) == list(range(5)) for p in perms)
    assert len({tuple(p) for p in perms}) > 10  # not one derangement repeated
    with pytest.raises(ValueError):
        derangements(1, 1)


def records_of(task, texts_by_q: dict[str, list[str]], finish: str = "stop") -> pd.DataFrame:
    """Records of hand-written candidates: the first text of each question is its deployed one."""
    rows = []
    by_id = {q.id: q for q in task.questions}
    for qid, texts in texts_by_q.items():
        for j, text in enumerate(texts):
            g = task.grade_candidate(text, by_id[qid], finish)
            rows.append({"question_id": qid, "probe": DEPLOYED if j == 0 else "temperature", "candidate": max(j - 1, 0),
                         "text": text, "extracted": g.extracted, "gold": by_id[qid].answer, "finish": finish,
                         "correct": g.strict, "correct_strict": g.strict, "correct_flexible": g.flexible})
    return pd.DataFrame(rows)


def test_null_equals_o_k_when_every_gold_is_equal():
    task = GSM8K([Question(id=f"q{i}", text="?", answer="7") for i in range(6)])
    texts = {f"q{i}": ["The answer is 7." if i % 2 else "3", "The answer is 7." if i < 3 else "5", "x 7"] for i in range(6)}
    records = records_of(task, texts)
    for grading in ("strict", "flexible"):
        scores = question_scores(graded(records, grading), "temperature")
        d_null, o_null = derangement_null(graded(records, grading), task, "temperature", grading)
        np.testing.assert_array_equal(o_null, scores["o"].to_numpy(float))
        np.testing.assert_array_equal(d_null, scores["d"].to_numpy(float))


def test_null_of_answers_that_fit_only_their_own_question_is_zero_and_the_line_says_so():
    task = GSM8K([Question(id=f"q{i}", text="?", answer=str(10 + i)) for i in range(8)])
    records = records_of(task, {f"q{i}": ["0", f"The answer is {10 + i}.", "1"] for i in range(8)})
    scores = question_scores(records, "temperature")
    d_null, o_null = derangement_null(records, task, "temperature", "strict")
    assert o_null.sum() == 0
    null = null_summary(scores["d"], scores["o"], d_null, o_null, "derangements")
    assert null["O_K"] == 0 and null["gap_above_null"] == 1.0 and not null["indistinguishable"]
    assert "above chance" in null_line(null, 2)
    # a lottery: each question's samples hit another question's gold as often as its own
    lucky = records_of(task, {f"q{i}": ["0", *(f"{10 + j}" for j in range(8))] for i in range(8)})
    s = question_scores(lucky, "temperature")
    null = null_summary(s["d"], s["o"], *derangement_null(lucky, task, "temperature", "flexible"), "derangements")
    assert null["O_K"] == 1.0 and null["indistinguishable"]
    assert "indistinguishable from chance at this n" in null_line(null, 8)


def test_letter_null_follows_the_models_own_letters():
    task = MultipleChoiceTask([Question(id=f"m{i}", text="?", answer="AB"[i % 2], choices=("x", "y", "z", "w"),
                                        gold_index=i % 2) for i in range(4)])
    records = records_of(task, {f"m{i}": ["A"] * 5 for i in range(4)})
    guess = letter_null(records, task, "temperature", k=4)
    np.testing.assert_allclose(guess["uniform_o"], 1 - 0.75 ** 4)
    np.testing.assert_array_equal(guess["model_o"], [1, 0, 1, 0])  # always "A": right exactly where A is gold
    d_null, o_null, _ = question_null(records, task, "temperature", "strict", 4)
    np.testing.assert_array_equal(o_null, question_scores(records, "temperature")["o"].to_numpy(float))


def test_the_strict_letter_null_counts_only_strictly_stated_answers():
    """A null read under strict grading guesses with the strictly stated answers only: the
    same letters cut off by the token limit, or unmarked in prose, hit nothing strictly."""
    task = MultipleChoiceTask([Question(id=f"m{i}", text="?", answer="AB"[i % 2], choices=("x", "y", "z", "w"),
                                        gold_index=i % 2) for i in range(4)])
    cut = records_of(task, {f"m{i}": ["Answer: A"] * 5 for i in range(4)}, finish="length")
    assert not cut["correct_strict"].any() and cut["correct_flexible"].sum() == 10
    for grading, expected in (("flexible", [1, 0, 1, 0]), ("strict", [0, 0, 0, 0])):
        d_null, o_null, _ = question_null(graded(cut, grading), task, "temperature", grading, 4)
        np.testing.assert_array_equal(o_null, expected)
        np.testing.assert_array_equal(o_null, question_scores(graded(cut, grading), "temperature")["o"].to_numpy(float))
    # a candidate with no answer is a miss for the null too: half the samples unparsed halve p(gold)
    half = records_of(task, {f"m{i}": ["Answer: A", "Answer: A", "Answer: A", "no idea", "no idea"] for i in range(4)})
    guess = letter_null(half, task, "temperature", k=1, grading="strict")
    np.testing.assert_allclose(guess["model_o"], [0.5, 0, 0.5, 0])
    # the summaries' chance block guesses the same way: its D is the null's, under either grading
    from rnr_interp.engine.sampling import chance_summary

    for grading in GRADINGS:
        chance = chance_summary(task, cut, 1, grading)
        null_d = letter_null(cut, task, "temperature", k=1, grading=grading)["model_d"].mean()
        assert chance["deployed_distribution"]["D"] == pytest.approx(null_d)
    assert chance_summary(task, cut, 1, "strict")["deployed_distribution"]["D"] == 0.0
    assert chance_summary(task, cut, 1, "flexible")["deployed_distribution"]["D"] == pytest.approx(0.5)


def circular_records(task: MultipleChoiceTask, texts: list[str]) -> pd.DataFrame:
    """Every question asked under shifts 0..3, answered with the same texts under each."""
    frames = []
    for shift in range(4):
        rotated = MultipleChoiceTask([q if shift == 0 else rotate_options(q, shift) for q in task.questions])
        part = records_of(rotated, {q.id: texts for q in task.questions})
        if shift:
            part["probe"] = [str(ProbeLabel.rotated(ProbeLabel.parse(p), shift)) for p in part["probe"]]
        frames.append(part)
    return pd.concat(frames, ignore_index=True)


def test_the_circular_null_is_zero_for_a_letter_habit_and_the_product_of_guesses_otherwise():
    task = MultipleChoiceTask([Question(id=f"m{i}", text="?", answer="ABCD"[i % 4], choices=("w", "x", "y", "z"),
                                        gold_index=i % 4) for i in range(8)])
    habit = circular_records(task, ["Answer: A"] * 5)
    d_null, o_null = circular_null(graded(habit, "strict"), task, "temperature", range(4), 4, "strict")
    assert d_null.sum() == 0 and o_null.sum() == 0
    # samples spread evenly over the four letters: p(gold) = 1/4 under every shift
    spread = circular_records(task, ["Answer: A", "Answer: A", "Answer: B", "Answer: C", "Answer: D"])
    d_null, o_null = circular_null(graded(spread, "flexible"), task, "temperature", range(4), 4, "flexible")
    np.testing.assert_allclose(o_null, (1 - 0.75 ** 4) ** 4)
    # the deployed answer is always "A": right under one shift of each question, never under all four
    np.testing.assert_allclose(d_null, 0)
    assert circular_scores(graded(spread, "flexible"), "temperature", range(4))["o"].all()


def test_a_model_that_always_answers_a_has_circular_d_zero():
    task = MultipleChoiceTask([Question(id=f"m{i}", text="?", answer="ABCD"[i % 4], choices=("w", "x", "y", "z"),
                                        gold_index=i % 4) for i in range(8)])
    frames = []
    for shift in range(4):
        rotated = MultipleChoiceTask([q if shift == 0 else rotate_options(q, shift) for q in task.questions])
        part = records_of(rotated, {q.id: ["Answer: A"] * 4 for q in task.questions})
        if shift:
            part["probe"] = [str(ProbeLabel.rotated(ProbeLabel.parse(p), shift)) for p in part["probe"]]
        frames.append(part)
    records = pd.concat(frames, ignore_index=True)
    plain = question_scores(records[records["probe"].isin([DEPLOYED, "temperature"])], "temperature")
    assert plain["d"].mean() == 0.25  # right wherever A is gold
    circular = circular_scores(records, "temperature", range(4))
    assert circular["d"].sum() == 0 and circular["o"].sum() == 0


def test_unfinished_rate_and_warning():
    records = pd.DataFrame({"probe": ["deployed", "t", "t", "t"], "finish": ["stop", "length", "length", "stop"]})
    assert unfinished_rate(records, "t") == pytest.approx(2 / 3)
    assert "--max-new-tokens" in unfinished_warning(unfinished_rate(records, "t"), "t")
    assert unfinished_warning(0.3, "t") is None


def test_an_old_run_folder_resumes_flexibly_and_regrades_strictly(tmp_path):
    """A folder written before both grades were recorded: no `grading` in its config, parts
    without the new columns. It resumes (grading unspecified) under its own flexible
    grading, reads back with flexible = its `correct`, and regrades strict from texts."""
    task = load_task("arithmetic", n=2)
    q = task.questions[0]
    config = {"kind": "audit", "model": "m", "task": task.describe()}
    old = RunDir.create(tmp_path / "run", config)
    texts = [f"The answer is {q.answer}.", f"blah {q.answer}"]
    legacy = [{"run_id": old.run_id, "model": "m", "task": task.name, "question_id": q.id, "probe": p, "candidate": 0,
               "intervention": "", "seed": 0, "text": t, "extracted": q.answer, "gold": q.answer, "correct": True,
               "logprob": -1.0, "n_tokens": 3, "finish": "stop"} for p, t in zip((DEPLOYED, "temperature"), texts)]
    old_schema = pa.schema([f for f in RECORD_SCHEMA if f.name not in ("correct_strict", "correct_flexible")])
    pq.write_table(pa.Table.from_pylist(legacy, schema=old_schema), old.records_dir / "part-00000.parquet")
    old.release()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    del manifest["parts_sha256"]  # a manifest from before parts had checksums
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))
    resumed = RunDir.create(tmp_path / "run", {**config, "grading": None})
    assert resumed.grading == "flexible" and resumed.run_id == old.run_id
    records = resumed.read_records()
    assert list(records.columns) == list(RECORD_COLUMNS)
    assert records["correct_flexible"].all() and records["correct_strict"].isna().all()
    with pytest.raises(ValueError, match="regrade"):
        graded(records, "strict")
    assert regrade(records, task)["correct_strict"].tolist() == [True, False]
    resumed.release()
    with pytest.raises(ValueError, match="grading"):
        RunDir.create(tmp_path / "run", {**config, "grading": "strict"})
    new = RunDir.create(tmp_path / "new", {**config, "grading": None})
    assert new.grading == "strict"


def _numbers(obj, prefix=""):
    """Every number in a JSON object, by its path."""
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in _numbers(value, f"{prefix}{key}.").items()}
    if isinstance(obj, list):
        return {k: v for i, value in enumerate(obj) for k, v in _numbers(value, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): obj} if isinstance(obj, (int, float)) and not isinstance(obj, bool) else {}


def _gsm8k40_data_here() -> bool:
    return Path(json.loads((GSM8K40 / "manifest.json").read_text())["config"]["task"]["source"]).is_file()


def _comparable(key: str) -> bool:
    """Whether a summary number kept its definition since the committed GSM8K run was
    summarised: the routing controls changed the exclusion rule (the cross-cell
    aggregates and each cell's `excluded` and `unparsed_rate` depend on it) and made the
    blind searches' selectors votes under other names."""
    top = key.split(".", 1)[0]
    if top in ("excluded_cells", "oracle_at_k", "selectors", "regraded"):
        return False
    if top == "strict" and key.startswith("strict.oracle_at_k"):
        return False
    return not any(part in ("excluded", "unparsed_rate") for part in key.split("."))


def _assert_reproduced(before_dir: Path, after_dir: Path, skip: str | None = None) -> dict:
    """Every number of the old summary and every row of the old tables, as regraded
    (leaving out what names `skip`, when given, what the routing controls redefined, and
    the note of an earlier regrade); returns the regraded summary."""
    before = {k: v for k, v in _numbers(json.loads((before_dir / "summary.json").read_text())).items()
              if (skip is None or skip not in k) and _comparable(k) and "_blind" not in k}
    after = json.loads((after_dir / "summary.json").read_text())
    got = _numbers(after)
    assert len(before) > 100  # per-cell oracles, differences, selectors, curves' endpoints, the temperature probe
    assert {k: got.get(k) for k in before} == pytest.approx(before, nan_ok=True, rel=0, abs=0)
    for name, key in (("route_cells", ["cell", "method"]), ("route_curves", ["cell", "method", "kind", "budget"]),
                      ("selectors", ["cell", "selector", "source"])):
        old, new = RunDir(before_dir).read_table(name), RunDir(after_dir).read_table(name)
        if skip is not None and "selector" in old:
            old = old[old["selector"] != skip]
        if "selector" in old:
            old = old[~old["selector"].str.endswith("_blind")]
        new = old[key].merge(new, on=key, how="left")  # the old rows, in the old order
        shared = [c for c in old.columns if c in new.columns and c not in ("excluded", "unparsed_rate")]
        if name == "route_cells":  # random's difference with itself is no longer written (was 0)
            itself = (old["method"] == "random").to_numpy()
            for c in [c for c in shared if c.startswith("random_minus")]:
                old.loc[itself, c] = new.loc[itself, c] = np.nan
        pd.testing.assert_frame_equal(new[shared].reset_index(drop=True), old[shared].reset_index(drop=True))
    return after


@pytest.mark.slow
def test_regrade_reproduces_the_gsm8k40_route_run_flexibly(tmp_path):
    """`rnr regrade` on the committed GSM8K route run, graded flexibly (the run's own
    grading): every number of its summary and every table as they were written, the
    self-verification selector's too, from the scores SmolLM2 gives its prompts (stored:
    tests/gsm8k40_verify.py; the test below scores a sample again). Strictly, nothing is
    above its flexible value."""
    if not _gsm8k40_data_here():
        pytest.skip("the GSM8K data file is not here")
    stored, asked = stored_rows(), []

    def stored_scores(lm, task, questions, rows, probes):
        asked.append((len(questions), list(probes)))
        return stored

    regrade_gsm8k40(tmp_path / "re", stored_scores)
    assert asked == [(40, ["temperature", "native:random", "polar:random", "skiponly:random"])]
    after = _assert_reproduced(GSM8K40, tmp_path / "re")
    assert after["grading"] == "flexible" and after["strict"]["deployed"] <= after["deployed"]
    assert after["strict"]["temperature_oracle"] <= after["temperature"]["oracle"]
    assert all(after["strict"]["oracle_at_k"][m] <= v for m, v in after["oracle_at_k"].items())
    assert after["null"]["O_K"] <= after["temperature"]["oracle"] + 0.2  # the null is a number of the same samples


@pytest.mark.slow
def test_the_stored_gsm8k40_verification_scores_are_smollm2s(smollm2):
    """Two questions' stored self-verification scores, under every probe, scored again by
    SmolLM2 with the same answers in one batch, as `verify_rows` scored them."""
    from rnr_interp.analyses.routing.evaluator import verify_scores
    from rnr_interp.tasks import reload_task

    if not _gsm8k40_data_here():
        pytest.skip("the GSM8K data file is not here")
    stored = pd.DataFrame(stored_rows())
    assert len(stored) == 1868 and stored["probe"].nunique() == 4 and stored["question_id"].nunique() == 40
    task = reload_task(RunDir(GSM8K40).config["task"])
    by_id = {q.id: q for q in task.questions}
    sample = stored[stored["question_id"].isin(stored["question_id"].unique()[[7, 29]])]
    for (_, qid), g in sample.groupby(["probe", "question_id"], sort=False):
        assert verify_scores(smollm2, task, by_id[qid], list(g["extracted"])) == pytest.approx(list(g["logprob"]), abs=1e-4)


def test_a_circular_audit_asks_every_shift_and_reports_both_gradings(tmp_path):
    from rnr_interp.analyses.audit import run_audit
    from rnr_interp.engine.decoding import Decoding
    from rnr_interp.models import load_model
    from rnr_interp.engine.sampling import Probe

    task = load_task("arithmetic_mc", n=3)
    s = run_audit(load_model("tiny-llama"), task, tmp_path / "c", probe=Probe(k=2, temperature=1.0), circular=True,
                  deployed=Decoding(max_new_tokens=4), progress=False)
    m = len(task.questions[0].choices)
    probes = set(RunDir(tmp_path / "c").read_records()["probe"])
    assert probes == {DEPLOYED, "temperature"} | {f"rotated:{k}:{p}" for k in range(1, m) for p in (DEPLOYED, "temperature")}
    assert s.grading == "strict" and s.circular["shifts"] == list(range(m))
    for g in ("strict", "flexible"):
        assert s.circular[g]["D"] <= s.graded(g)["D"] and s.circular[g]["O_K"] <= s.graded(g)["O_K"]
    assert s.strict["O_K"] <= s.flexible["O_K"] and set(s.unfinished_rate) == probes
    with pytest.raises(ValueError, match="circular"):
        run_audit(load_model("tiny-llama"), load_task("arithmetic", n=2), tmp_path / "n", circular=True, progress=False)


def test_a_bad_grading_option_is_one_error_line(tmp_path):
    from typer.testing import CliRunner

    from rnr_interp.cli import app

    result = CliRunner().invoke(app, ["audit", "--model", "tiny-llama", "--grading", "lenient", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--grading must be one of strict, flexible" in result.output
    assert not (tmp_path / "x").exists()
