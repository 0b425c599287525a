"""Task loaders on the real shared splits and on corrupt files; extraction and grading."""

from __future__ import annotations

import bz2
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rnr_interp.tasks as tasks
from rnr_interp.tasks import (
    LETTERS,
    TASKS,
    reload_task,
    BoolQ,
    DataFormatError,
    MultipleChoiceTask,
    arithmetic,
    arithmetic_mc,
    load_gsm8k,
    load_hellaswag,
    load_jsonl,
    load_logiqa,
    load_piqa,
    load_task,
    rotate_options,
)
from rnr_interp.tasks.base import Question
from rnr_interp.tasks.numeric import canonical_number, extract_number, numbers_equal

# -- the real splits ------------------------------------------------------------
REAL = [  # task name, file under shared/data, rows (README)
    ("gsm8k", "gsm8k/test.jsonl", 1319),
    ("arc_challenge", "arc/ARC-Challenge-Test.jsonl", 1172),
    ("arc_easy", "arc/ARC-Easy-Test.jsonl", 2376),
    ("piqa", "piqa/valid.jsonl", 1838),
    ("boolq", "boolq/validation.jsonl", 3270),
    ("logiqa", "logiqa/Test.txt", 651),
    ("hellaswag", "hellaswag/hellaswag_val_full.txt.bz2", 10042),
]


@pytest.mark.shared_data
@pytest.mark.parametrize("name,rel,rows", REAL, ids=[r[0] for r in REAL])
def test_real_split_parses_whole(shared_data: Path, name: str, rel: str, rows: int) -> None:
    task = load_task(name, data=shared_data / rel)
    assert len(task) == rows
    assert len({q.id for q in task.questions}) == rows
    for q in task.questions:
        assert q.text.strip()
        if isinstance(task, MultipleChoiceTask):
            assert q.choices is not None and q.gold_index is not None
            assert 0 <= q.gold_index < len(q.choices)
            # BoolQ grades the option word, every other MC task the option's letter
            expected = q.choices[q.gold_index] if isinstance(task, BoolQ) else LETTERS[q.gold_index]
            assert q.answer == expected
        else:
            assert canonical_number(q.answer) == q.answer
    assert task.describe()["n_questions"] == rows


@pytest.mark.shared_data
def test_real_split_contents(shared_data: Path) -> None:
    gsm = load_task("gsm8k", data=shared_data / "gsm8k/test.jsonl")
    assert (gsm.questions[0].id, gsm.questions[0].answer) == ("gsm8k-0", "18")
    assert gsm.questions[2].answer == "70000"  # "#### 70000" after 80,000 / 50,000 prose
    arc = load_task("arc", data=shared_data / "arc/ARC-Challenge-Test.jsonl")
    assert (arc.questions[0].id, arc.questions[0].answer) == ("Mercury_7175875", "C")
    digit_labelled = [q for q in arc.questions if q.meta["labels"][0] == "1"]
    assert digit_labelled and all(q.answer in "ABCD" for q in digit_labelled)
    assert {len(q.choices or ()) for q in arc.questions} == {3, 4, 5}
    logiqa = load_task("logiqa", data=shared_data / "logiqa/Test.txt")
    # Item 109 (line 865) lists its options as A., C., B., D.: position decides.
    assert logiqa.questions[108].choices == (
        "No.2 valve and No.4 valve.",
        "No.3 valve and No.5 valve.",
        "No.2 valve and No.3 valve.",
        "No.4 valve and No.5 valve.",
    )
    assert logiqa.questions[2].choices[0] == "No dangshen"  # "A No dangshen"
    assert logiqa.questions[15].choices[0] == "A is a male doctor;"  # "A.A is ..." loses one prefix
    hs = load_task("hellaswag", data=shared_data / "hellaswag/hellaswag_val_full.txt.bz2")
    q = hs.questions[0]
    assert q.text == "Roof shingle removal: A man is sitting on a roof. he" and q.answer == "D"
    assert hs.recognition_prompt(q) == q.text
    boolq = load_task("boolq", data=shared_data / "boolq/validation.jsonl")
    assert boolq.questions[0].answer == "no" and boolq.questions[0].context


@pytest.mark.shared_data
def test_default_path_found(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(shared_data)  # found relative to the repository, whatever the CWD
    task = load_task("logiqa", n=5)
    assert len(task) == 5 and task.source == str(shared_data / "logiqa/Test.txt")


# -- registry -------------------------------------------------------------------
def test_registry_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="known tasks: .*gsm8k.*arithmetic"):
        load_task("gsm9k")
    monkeypatch.setattr(tasks, "shared_data_dirs", lambda: [tmp_path])
    with pytest.raises(FileNotFoundError, match=r"gsm8k/test\.jsonl.*--data"):
        load_task("gsm8k")
    with pytest.raises(FileNotFoundError, match="--data"):
        load_task("jsonl")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_task("boolq", data=tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="reads no data file"):
        load_task("arithmetic", data=tmp_path)


def test_registry_names_and_n() -> None:
    for name in ("gsm8k", "arc", "arc_challenge", "arc_easy", "piqa", "boolq", "logiqa",
                 "hellaswag", "jsonl", "arithmetic", "arithmetic_mc"):
        assert name in TASKS
    assert len(load_task("arithmetic")) == 200
    t = load_task("arithmetic", n=7, seed=3, digits=3)
    assert len(t) == 7 and "seed=3" in t.describe()["source"]


# -- corrupt input ----------------------------------------------------------------
def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _raises_at(fn, path: Path, line: int, match: str) -> None:
    with pytest.raises(DataFormatError, match=match) as info:
        fn()
    assert info.value.path == path or Path(info.value.path) == path
    assert info.value.line == line
    assert f"{path}:{line}:" in str(info.value)


GOOD_GSM = json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"})


def test_gsm8k_corrupt(tmp_path: Path) -> None:
    p = _write(tmp_path / "bad.jsonl", GOOD_GSM + "\n{not json\n")
    _raises_at(lambda: load_gsm8k(p), p, 2, "not valid JSON")
    p = _write(tmp_path / "noans.jsonl", GOOD_GSM + "\n\n" + json.dumps({"question": "q"}) + "\n")
    _raises_at(lambda: load_gsm8k(p), p, 3, "missing field 'answer'")
    p = _write(tmp_path / "nohash.jsonl", json.dumps({"question": "q", "answer": "42"}) + "\n")
    _raises_at(lambda: load_gsm8k(p), p, 1, "####")
    p = _write(tmp_path / "list.jsonl", "[1, 2]\n")
    _raises_at(lambda: load_gsm8k(p), p, 1, "JSON object")


def test_arc_corrupt(tmp_path: Path) -> None:
    options = [{"text": "a", "label": "1"}, {"text": "b", "label": "2"}]
    row = {"id": "x", "question": {"stem": "s", "choices": options}, "answerKey": "3"}
    p = _write(tmp_path / "arc.jsonl", json.dumps(row) + "\n")
    _raises_at(lambda: load_task("arc", data=p), p, 1, "answerKey '3'")
    row["answerKey"] = "2"
    p = _write(tmp_path / "arc2.jsonl", json.dumps(row) + "\n")
    q = load_task("arc", data=p).questions[0]
    assert (q.answer, q.gold_index, q.choices) == ("B", 1, ("a", "b"))


def test_piqa_labels(tmp_path: Path) -> None:
    rows = "".join(json.dumps({"goal": f"g{i}", "sol1": "a", "sol2": "b"}) + "\n" for i in range(3))
    p = _write(tmp_path / "valid.jsonl", rows)
    labels = _write(tmp_path / "valid-labels.lst", "0\n1\n")
    _raises_at(lambda: load_piqa(p), labels, 3, "2 labels for 3 rows")
    _write(labels, "0\n1\n1\n0\n")
    _raises_at(lambda: load_piqa(p), labels, 4, "4 labels for 3 rows")
    _write(labels, "0\n2\n1\n")
    _raises_at(lambda: load_piqa(p), labels, 2, "0 or 1")
    _write(labels, "0\n1\n1\n")
    t = load_piqa(p)
    assert [q.answer for q in t.questions] == ["A", "B", "B"] and t.questions[2].id == "piqa-2"
    other = _write(tmp_path / "elsewhere.lst", "1\n1\n1\n")
    assert [q.gold_index for q in load_piqa(p, labels=other).questions] == [1, 1, 1]


def test_boolq_corrupt(tmp_path: Path) -> None:
    p = _write(tmp_path / "b.jsonl", json.dumps({"question": "q", "passage": "p", "answer": "true"}) + "\n")
    _raises_at(lambda: load_task("boolq", data=p), p, 1, "true or false")


def _logiqa_record(answer: str = "b") -> str:
    return f"\n{answer}\nSome context.\nWhich follows?\nA.one\nB.two\nC?three\nD four\n"


def test_logiqa_corrupt(tmp_path: Path) -> None:
    p = _write(tmp_path / "ok.txt", _logiqa_record() + _logiqa_record("d"))
    t = load_logiqa(p)
    assert t.questions[0].choices == ("one", "two", "three", "four")
    assert [q.answer for q in t.questions] == ["B", "D"]
    p = _write(tmp_path / "trunc.txt", _logiqa_record() + "\na\ncontext\nquestion\nA.x\n")
    _raises_at(lambda: load_logiqa(p), p, 9, "truncated record: 5 of 8")
    p = _write(tmp_path / "letter.txt", _logiqa_record() + _logiqa_record("e"))
    _raises_at(lambda: load_logiqa(p), p, 9, "letter a-d")
    p = _write(tmp_path / "shift.txt", _logiqa_record() + "x" + _logiqa_record())
    _raises_at(lambda: load_logiqa(p), p, 9, "blank line")


def test_hellaswag_corrupt(tmp_path: Path) -> None:
    good = "ctx one\n2\ne0\ne1\ne2\ne3\n"
    p = tmp_path / "hs.txt.bz2"
    p.write_bytes(bz2.compress((good + "ctx two\n4\na\nb\nc\nd\n").encode()))
    _raises_at(lambda: load_hellaswag(p), p, 7, "option index 0..3")
    p.write_bytes(bz2.compress((good + good).encode()))
    assert [q.answer for q in load_hellaswag(p).questions] == ["C", "C"]
    plain = _write(tmp_path / "hs.txt", good + "ctx\n1\na\nb\n")
    _raises_at(lambda: load_hellaswag(plain), plain, 7, "truncated")


# -- extraction and grading -------------------------------------------------------
@pytest.mark.parametrize(
    "text,canon",
    [("$1,000.", "1000"), ("18.0", "18"), ("-0.50", "-0.5"), (" 70,000 ", "70000"), ("1e5", None), ("abc", None)],
)
def test_canonical_number(text: str, canon: str | None) -> None:
    assert canonical_number(text) == canon


def test_numeric_equivalence() -> None:
    assert numbers_equal("$1,000.", "1000")
    assert numbers_equal("18.0", "18")
    assert not numbers_equal("18.5", "18")
    assert not numbers_equal(None, "18") and not numbers_equal("eighteen", "18")


@pytest.mark.parametrize(
    "generation,expected",
    [
        ("She makes 9 * 2 = $18 a day. The answer is 18.", "18"),
        ("The answer is $1,000.", "1000"),
        ("Answer: **18.0**", "18"),
        ("#### 42", "42"),
        ("First 3 + 4 = 7, then 7 * 2 = 14", "14"),  # no marker: the last number
        ("Answer: 55\n\nQuestion: What is 2 + 2?\nAnswer: 4", "55"),  # first commitment
        ("From 2019-2020 it grew", "2020"),  # a hyphen between numbers is no minus
        ("The answer is -5.", "-5"),
        ("I do not know.", None),
    ],
)
def test_extract_number(generation: str, expected: str | None) -> None:
    assert extract_number(generation) == expected


def test_gsm8k_grade(tmp_path: Path) -> None:
    p = _write(tmp_path / "g.jsonl", json.dumps({"question": "q", "answer": "...\n#### 1,000"}) + "\n")
    task = load_gsm8k(p)
    q = task.questions[0]
    assert q.answer == "1000" and "The answer is N." in task.instruction
    assert task.grade(task.extract("So the total is $1,000."), q)
    assert task.grade(task.extract("The answer is 1000.0"), q)
    assert not task.grade(task.extract("The answer is 100."), q)
    assert not task.grade(None, q)


@pytest.mark.parametrize(
    "generation,letter",
    [
        ("Answer: B", "B"),
        ("The answer is (C).", "C"),
        ("**Answer:** d", "D"),
        ("answer: c", "C"),
        ("B. Planetary years will become longer.", "B"),
        ("(D)", "D"),
        ("**B**", "B"),
        ("I think the correct answer is B because of rotation.", "B"),
        ("The correct option is C.", "C"),
        ("Option A is wrong, so the answer is B.", "B"),
        ("A dog is running.", None),  # an article, not an option
        ("The answer is a bit unclear.", None),
        ("", None),
    ],
)
def test_mc_letter_extraction(generation: str, letter: str | None) -> None:
    assert MultipleChoiceTask([]).extract(generation) == letter


@pytest.mark.parametrize(
    "generation,word",
    [("Answer: yes", "yes"), ("No, the passage says otherwise.", "no"), ("True.", "yes"),
     ("There is no doubt. Answer: yes", "yes"), ("I cannot tell.", None)],
)
def test_boolq_extraction(generation: str, word: str | None) -> None:
    assert BoolQ([]).extract(generation) == word


def test_boolq_prompts(tmp_path: Path) -> None:
    p = _write(tmp_path / "b.jsonl", json.dumps({"question": "is it", "passage": "It is.", "answer": True}) + "\n")
    task = load_task("boolq", data=p)
    q = task.questions[0]
    assert (q.answer, q.choices, q.gold_index, q.text) == ("yes", ("yes", "no"), 0, "is it?")
    msg = task.user_message(q)
    assert msg.startswith("It is.") and "A. yes" not in msg and "yes or no" in msg
    assert task.recognition_prompt(q).endswith("Question: is it?\nAnswer:")
    assert task.grade(task.extract("Yes."), q)


# -- synthetic --------------------------------------------------------------------
def test_arithmetic_deterministic() -> None:
    a, b = arithmetic(n=50, seed=1), arithmetic(n=50, seed=1)
    assert [q.text for q in a.questions] == [q.text for q in b.questions]
    assert [q.text for q in a.questions] != [q.text for q in arithmetic(n=50, seed=2).questions]
    for q in arithmetic(n=100, seed=0, digits=3, ops="+-*").questions:
        x, op, y = q.meta["a"], q.meta["op"], q.meta["b"]
        assert int(q.answer) == eval(f"{x} {op} {y}") >= 0
        assert len(str(x)) == (2 if op == "*" else 3) and len(str(y)) <= len(str(x))
    sums = arithmetic(n=200).questions
    assert {len(str(q.meta["b"])) for q in sums} == {1, 2} and {q.meta["op"] for q in sums} == {"+"}
    t = arithmetic(n=3)
    assert t.max_new_tokens <= 32 and "Answer: N" in t.user_message(t.questions[0])
    assert t.grade(t.extract("Answer: 57"), t.questions[0]) == (t.questions[0].answer == "57")
    with pytest.raises(ValueError):
        arithmetic(ops="/")


def test_copy_asks_to_repeat_a_number_and_reloads_from_its_source() -> None:
    t = load_task("copy", n=40, seed=3, digits=3)
    assert [q.text for q in t.questions] == [q.text for q in load_task("copy", n=40, seed=3, digits=3).questions]
    assert all(q.text == f"Repeat this number: {q.answer}" and len(q.answer) == 3 for q in t.questions)
    assert len({q.answer for q in t.questions}) > 30
    assert t.grade(t.extract("The final answer is " + t.questions[0].answer), t.questions[0])
    assert reload_task(t.describe()).questions == t.questions
    with pytest.raises(ValueError, match="digits"):
        load_task("copy", digits=0)


def test_arithmetic_mc() -> None:
    plain, mc = arithmetic(n=60, seed=4), arithmetic_mc(n=60, seed=4)
    assert [q.text for q in plain.questions] == [q.text for q in mc.questions]
    assert [q.answer for q in mc.questions] == [q.answer for q in arithmetic_mc(n=60, seed=4).questions]
    for p, q in zip(plain.questions, mc.questions):
        assert q.choices is not None and len(set(q.choices)) == 4
        assert q.choices[q.gold_index] == p.answer and q.answer == LETTERS[q.gold_index]
    assert len({q.gold_index for q in mc.questions}) == 4  # the gold position varies


# -- generic jsonl ----------------------------------------------------------------
def _jsonl(tmp_path: Path, rows: list[object], name: str = "u.jsonl", blank_after: int | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    if blank_after is not None:
        lines.insert(blank_after, "")
    return _write(tmp_path / name, "\n".join(lines) + "\n")


def test_jsonl_free_form(tmp_path: Path) -> None:
    p = _jsonl(tmp_path, [
        {"prompt": "Capital of France?", "answer": "Paris"},
        {"id": "q7", "question": "2+2?", "answer": 4, "source": "me"},
        {"prompt": "Cost?", "answer": "1,000", "context": "A price list."},
    ], blank_after=1)
    task = load_jsonl(p)
    a, b, c = task.questions
    assert (a.id, b.id, c.id) == ("1", "q7", "4")  # default ids are line numbers
    assert b.meta == {"source": "me"} and c.context == "A price list."
    assert task.grade(task.extract("Answer: paris."), a)
    assert task.grade(task.extract("**Paris**"), a)
    assert not task.grade(task.extract("Answer: Lyon"), a)
    assert task.grade(task.extract("The answer is 4.0"), b)
    assert task.grade(task.extract("Answer: $1000"), c)
    assert load_jsonl(p, instruction="Reply tersely.").describe()["instruction"] == "Reply tersely."


def test_jsonl_multiple_choice(tmp_path: Path) -> None:
    choices = ["Mars", "Jupiter", "Venus"]
    p = _jsonl(tmp_path, [
        {"prompt": "Largest?", "choices": choices, "answer": "B"},
        {"prompt": "Largest?", "choices": choices, "answer": "b"},
        {"prompt": "Largest?", "choices": choices, "answer": 1},
        {"prompt": "Largest?", "choices": choices, "answer": "Jupiter"},
    ])
    task = load_jsonl(p)
    assert isinstance(task, MultipleChoiceTask)
    assert {(q.answer, q.gold_index) for q in task.questions} == {("B", 1)}
    assert "B. Jupiter" in task.user_message(task.questions[0])


@pytest.mark.parametrize(
    "rows,line,match",
    [
        ([{"prompt": "p"}], 1, "missing field 'answer'"),
        ([{"answer": "x"}], 1, "missing field 'prompt'"),
        ([{"prompt": "p", "question": "q", "answer": "x"}], 1, "not both"),
        ([{"prompt": "p", "answer": "x"}, {"prompt": "p", "choices": ["a", "b"], "answer": "A"}], 2, "mixes"),
        ([{"prompt": "p", "choices": ["a", "b"], "answer": "C"}], 1, "neither a letter"),
        ([{"prompt": "p", "choices": ["a", "b"], "answer": 2}], 1, "out of range"),
        ([{"prompt": "p", "choices": "ab", "answer": "A"}], 1, "list of 2 to"),
        ([{"id": "x", "prompt": "p", "answer": "1"}, {"id": "x", "prompt": "p", "answer": "2"}], 2, "duplicate id"),
        ([{"prompt": "p", "answer": None}], 1, "non-empty string or a number"),
    ],
)
def test_jsonl_corrupt(tmp_path: Path, rows: list[object], line: int, match: str) -> None:
    p = _jsonl(tmp_path, rows)
    _raises_at(lambda: load_jsonl(p), p, line, match)


# -- every task describes itself ------------------------------------------------------
def test_describe_and_prompts(tmp_path: Path) -> None:
    mc = load_jsonl(_jsonl(tmp_path, [{"prompt": "Q?", "context": "C.", "choices": ["x", "y"], "answer": 0}]))
    for task in (arithmetic(n=2), arithmetic_mc(n=2), mc, load_logiqa(_write(tmp_path / "l.txt", _logiqa_record()))):
        d = task.describe()
        assert {"name", "answer_format", "instruction", "max_new_tokens", "source", "n_questions"} <= d.keys()
        json.dumps(d)  # manifests are JSON
    assert mc.recognition_prompt(mc.questions[0]) == "C.\n\nQ?"


# -- Hugging Face ----------------------------------------------------------------------
def test_hf_unknown_name() -> None:
    with pytest.raises(ValueError, match="known: .*gsm8k"):
        tasks.load_hf("nope")


def test_hf_rows_map_like_files(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    rows = {
        "allenai/ai2_arc": [{"id": "a1", "question": "Why?", "answerKey": "2",
                             "choices": {"text": ["x", "y"], "label": ["1", "2"]}}],
        "Rowan/hellaswag": [{"activity_label": "Roof", "ctx": "A man. he", "label": "3",
                             "endings": ["a", "b", "c", "d"]}],
        "lucasmccabe/logiqa": [{"context": "C", "query": "Q", "options": ["A cat", "b", "c", "d"],
                                "correct_option": 0}],
    }
    monkeypatch.setattr(datasets, "load_dataset", lambda repo, *a, **k: rows[repo])
    arc = tasks.load_hf("arc_easy").questions[0]
    assert (arc.id, arc.text, arc.answer, arc.choices) == ("a1", "Why?", "B", ("x", "y"))
    hs = tasks.load_hf("hellaswag").questions[0]
    assert (hs.text, hs.answer) == ("Roof: A man. he", "D")
    lq = tasks.load_hf("logiqa").questions[0]
    assert (lq.answer, lq.choices[0]) == ("A", "A cat")  # HF options carry no prefix to strip


def test_hf_offline_is_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    # A subprocess, since datasets reads the offline switches at import; offline mode
    # fails at once instead of retrying DNS for half a minute.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    code = (
        "from rnr_interp.tasks import load_hf, HFLoadError\n"
        "try:\n    load_hf('gsm8k', cache_dir=%r)\n"
        "except HFLoadError as e:\n    print('ERR', e)\n" % str(tmp_path / "cache")
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "ERR could not load hf://openai/gsm8k/main[test]" in out.stdout, out.stderr
    assert "--data" in out.stdout


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_rotation_moves_each_option_and_the_gold_letter_by_the_shift(n):
    texts = tuple(f"option text {i}" for i in range(n))
    for gold in range(n):
        q = Question(id=f"q{gold}", text="Which?", answer=LETTERS[gold], choices=texts, gold_index=gold)
        r = rotate_options(q, 1)
        # option i is shown at position (i + 1) mod n, the gold letter with it
        assert all(r.choices[(i + 1) % n] == texts[i] for i in range(n))
        assert r.gold_index == (gold + 1) % n and r.answer == LETTERS[(gold + 1) % n]
        assert r.choices[r.gold_index] == texts[gold] and r.answer != q.answer
        assert r.id == q.id and r.meta["rotated_by"] == 1 % n
        # round trips: back by the shift, or n single steps
        assert rotate_options(r, -1) == q and rotate_options(r, -1).meta["rotated_by"] == 0
        again = q
        for _ in range(n):
            again = rotate_options(again, 1)
        assert again == q
        # the prompt lists the rotated options under their new letters
        msg = MultipleChoiceTask([r]).user_message(r)
        assert f"{r.answer}. option text {gold}" in msg and f"{LETTERS[(gold + 2) % n]}. option text {(gold + 1) % n}" in msg


def test_rotated_question_is_graded_against_the_rotated_gold():
    task = load_task("arithmetic_mc", n=3)
    for q in task.questions:
        r = rotate_options(q)
        assert task.grade(task.read_answer(f"Answer: {r.answer}", r), r)
        assert not task.grade(task.read_answer(f"Answer: {q.answer}", r), r)  # the old letter is now another option


def test_rotation_refuses_questions_not_graded_by_letter():
    with pytest.raises(ValueError, match="no options"):
        rotate_options(Question(id="x", text="1+1?", answer="2"))
    yes_no = Question(id="b", text="Is it?", answer="yes", choices=("yes", "no"), gold_index=0)
    with pytest.raises(ValueError, match="not by its gold option's letter"):
        rotate_options(yes_no)


def test_a_seed_draws_a_generated_task_and_is_refused_by_a_file_task_by_name():
    assert load_task("copy", n=4, seed=2).content_hash() != load_task("copy", n=4).content_hash()
    with pytest.raises(ValueError, match="task 'gsm8k' reads its questions from a file"):
        load_task("gsm8k", seed=2)
    with pytest.raises(ValueError, match="unknown task 'nope'"):  # not told it reads a file
        load_task("nope", seed=2)
