"""Our extraction against independent references, on stored real generations.

`fixtures/smollm2_generations.jsonl` holds every candidate (deployed and K=8 samples,
T=1.0) of the demo model on the first 40 GSM8K test questions and the first 40
ARC-Easy test questions, as written by

    rnr audit --model smollm2 --task gsm8k --n 40 --k 8
    rnr audit --model smollm2 --task arc_easy --n 40 --k 8

(question id, candidate, gold, generated text and, for ARC, the option count only; no
benchmark text). References: lm-eval-harness's GSM8K strict and flexible filters and its
generative multiple-choice filter (verbatim copies in `grading_references.py`), and
math-verify. Each test prints its agreement rate (pytest -s) and fails on any
disagreement that is not one of the kinds explained in the README ("Grading").
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

import grading_references as ref
from rnr_interp.tasks import GSM8K, LETTERS, Question, load_task
from rnr_interp.tasks.letter import extract_letter
from rnr_interp.tasks.numeric import NUMBER_RE, canonical_number, numbers_equal

FIXTURE = Path(__file__).parent / "fixtures" / "smollm2_generations.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


def _rows(task: str) -> list[dict]:
    return [r for r in ROWS if r["task"] == task]


def _report(name: str, agree: int, n: int, reasons: Counter) -> None:
    detail = ", ".join(f"{why}: {count}" for why, count in reasons.most_common())
    print(f"\n{name}: grades agree on {agree}/{n} = {agree / n:.1%} of candidates; disagreements: {detail or 'none'}")


def test_fixture_is_the_stored_runs() -> None:
    for task, n_questions in (("gsm8k", 40), ("arc_easy", 40)):
        rows = _rows(task)
        assert len({r["question_id"] for r in rows}) == n_questions
        assert len(rows) == n_questions * 9  # the deployed candidate and K = 8 samples each


# -- numbers: lm-eval GSM8K filters and math-verify -------------------------------------

def _ours(row: dict) -> tuple[str | None, bool]:
    task, q = GSM8K([]), Question(id=row["question_id"], text="", answer=row["gold"])
    extracted = task.read_answer(row["text"], q)
    return extracted, task.grade(extracted, q)


def _marked_is_not_last(text: str, ours: str | None) -> bool:
    """Ours read a marked answer, and a different number comes after it (a further,
    invented question and answer, or working after the answer)."""
    numbers = [canonical_number(n) for n in NUMBER_RE.findall(text)]
    return ours is not None and bool(numbers) and numbers[-1] != ours


def _same_value_other_spelling(ref_text: str, gold: str, ours_correct: bool) -> bool:
    """The reference's string is the gold value written otherwise ("18.00", "$18.50.")."""
    return ours_correct and numbers_equal(re.sub(r"[$,]", "", ref_text).rstrip("."), gold)


def _explain_lm_eval(row: dict, ours: str | None, ours_ok: bool, ref_text: str, strict: bool) -> str | None:
    text = row["text"]
    if strict and ref_text == ref.FALLBACK:
        return "no 'The answer is N.' sentence (strict reads nothing; ours another marker or the last number)"
    if not strict and _marked_is_not_last(text, ours):
        return "ours the first marked answer, flexible the last number"
    if _same_value_other_spelling(ref_text, row["gold"], ours_ok):
        return "same value, other spelling (exact string match fails)"
    if strict and re.search(r"answer\b[*_\s]*(?:is|:)", text[: text.find("The answer is")], re.I):
        return "an earlier marked answer (ours) than strict's 'The answer is'"
    return None


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "flexible"])
def test_numbers_against_lm_eval_gsm8k_filters(strict: bool) -> None:
    rows, agree, reasons, unexplained = _rows("gsm8k"), 0, Counter(), []
    for row in rows:
        ours, ours_ok = _ours(row)
        ref_text = ref.gsm8k_strict(row["text"]) if strict else ref.gsm8k_flexible(row["text"])
        ref_ok = ref.exact_match(ref_text, row["gold"])
        if ref_ok == ours_ok:
            agree += 1
            continue
        why = _explain_lm_eval(row, ours, ours_ok, ref_text, strict)
        reasons[why or "UNEXPLAINED"] += 1
        if why is None:
            unexplained.append((ours, ref_text, row["gold"], row["text"][:200]))
    _report(f"lm-eval gsm8k {'strict-match' if strict else 'flexible-extract'}", agree, len(rows), reasons)
    assert not unexplained, unexplained[:5]


def test_numbers_against_math_verify() -> None:
    math_verify = pytest.importorskip("math_verify")
    rows, agree, reasons, unexplained = _rows("gsm8k"), 0, Counter(), []
    for row in rows:
        ours, ours_ok = _ours(row)
        parsed = math_verify.parse(row["text"])
        ref_ok = bool(math_verify.verify(math_verify.parse(row["gold"]), parsed))
        if ref_ok == ours_ok:
            agree += 1
            continue
        if _marked_is_not_last(row["text"], ours):
            why = "ours the first marked answer, math-verify the last"
        else:
            why = None
        reasons[why or "UNEXPLAINED"] += 1
        if why is None:
            unexplained.append((ours, [str(p) for p in parsed], row["gold"], row["text"][:200]))
    _report("math-verify", agree, len(rows), reasons)
    assert not unexplained, unexplained[:5]


# -- letters: lm-eval's generative multiple-choice filter -------------------------------

def _explain_multi_choice(row: dict, ours: str | None, ref_letter: str | None, step: str | None) -> str | None:
    text, valid = row["text"], LETTERS[: row["n_options"]]
    if step is None and ours is not None:
        return "a bare or marked letter without '(X)' or ': X' (lm-eval reads nothing)"
    if step == "option text":
        return "an option's text elsewhere in the response (lm-eval) vs the letter written (ours)"
    if step == "(X)" and ref_letter not in valid:
        return "'(X)' that is no option letter, e.g. a chemical symbol"
    if step == ": X" and ours is None and re.search(rf":\s*{ref_letter}\s+\w", text):
        return "': X' starting a longer phrase ('A and B')"
    return None


def test_letters_against_lm_eval_multiple_choice(shared_data: Path) -> None:
    rows = _rows("arc_easy")
    questions = {q.id: q for q in load_task("arc_easy", data=shared_data / "arc" / "ARC-Easy-Test.jsonl").questions}
    agree, reasons, unexplained = 0, Counter(), []
    for row in rows:
        q = questions[row["question_id"]]
        assert (q.answer, len(q.choices)) == (row["gold"], row["n_options"])
        ours = extract_letter(row["text"], row["n_options"])
        answer, step = ref.multi_choice_step(row["text"], list(q.choices))
        ref_letter = answer[1] if answer.startswith("(") else None
        agree += (ours == q.answer) == (ref_letter == q.answer)
        if ours == ref_letter:
            continue
        why = _explain_multi_choice(row, ours, ref_letter, step)
        reasons[why or "UNEXPLAINED"] += 1
        if why is None:
            unexplained.append((ours, answer, step, row["text"][:200]))
    _report("lm-eval multi_choice_regex (MMLU generative)", agree, len(rows), reasons)
    assert not unexplained, unexplained[:5]


# -- the copies are lm-eval's own -----------------------------------------------------

def test_references_match_lm_eval_itself(shared_data: Path) -> None:
    """Whenever lm-eval is importable (it is not a test dependency: see
    grading_references), its own filter classes agree with the copies on every row."""
    extraction = pytest.importorskip("lm_eval.filters.extraction")
    gsm = _rows("gsm8k")
    strict = extraction.RegexFilter(regex_pattern=ref.GSM8K_STRICT)
    flexible = extraction.RegexFilter(regex_pattern=ref.GSM8K_FLEXIBLE, group_select=-1)
    texts = [[r["text"]] for r in gsm]
    assert [x[0] for x in strict.apply(texts, [{}] * len(gsm))] == [ref.gsm8k_strict(r["text"]) for r in gsm]
    assert [x[0] for x in flexible.apply(texts, [{}] * len(gsm))] == [ref.gsm8k_flexible(r["text"]) for r in gsm]
    arc = _rows("arc_easy")
    questions = {q.id: q for q in load_task("arc_easy", data=shared_data / "arc" / "ARC-Easy-Test.jsonl").questions}
    docs = [{"choices": list(questions[r["question_id"]].choices)} for r in arc]
    mc = extraction.MultiChoiceRegexFilter(regex_pattern=ref.MC_REGEX, ignore_case=True, ignore_punctuation=True)
    theirs = [x[0] for x in mc.apply([[r["text"]] for r in arc], docs)]
    assert theirs == [ref.multi_choice(r["text"], d["choices"]) for r, d in zip(arc, docs)]
