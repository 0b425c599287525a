"""The three answer kinds' extraction rules, case by case (docs/grading.md).

Each table row is a generation a model could write and what the rule reads from it;
None means no valid answer (the candidate counts as unparsed)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rnr_interp.engine.decoding import Generation
from rnr_interp.engine.sampling import candidate_row
from rnr_interp.metrics import unparsed_rate
from rnr_interp.tasks import ARC, JsonlNumberTask, JsonlTask, Question, load_jsonl
from rnr_interp.tasks.freetext import extract_free_text
from rnr_interp.tasks.letter import extract_letter, extract_yes_no
from rnr_interp.tasks.numeric import canonical_number, extract_number, numbers_equal

NUMBER_CASES = [
    ("The answer is 18.", "18"),
    ("The answer is $1,000.", "1000"),
    ("The answer is 18 dollars.", "18"),  # a unit after the number
    ("The answer is 2 (wheat flour and sugar).", "2"),  # a parenthesis after it
    ("The answer is (42).", "42"),
    ("The answer is '7'.", "7"),  # quotes
    ('Answer: "7"', "7"),
    ("**Answer:** **18.0**", "18"),  # markdown bold
    ("**Answer**: 12", "12"),
    ("The answer is 50%.", "50"),
    ("The answer is approximately 20 apples.", "20"),  # words between marker and number
    ("The answer is: Janet makes $18 every day.", "18"),
    ("To answer this, multiply 5 by 4.\nAnswer: 20", "20"),  # "answer this" is no marker
    ("Answer: 55\n\nQuestion: What is 2 + 2?\nAnswer: 4", "55"),  # several marked: the first
    ("The answer is unclear. 3 + 4 = 7", "7"),  # a marker without a number in its sentence
    ("#### 42", "42"),
    ("So, the answer is N = 2 * 2 * 2 = 8.", "8"),  # a calculation after the marker: its result
    ("The final answer: 1520 + 540 = 7040", "7040"),
    ("The answer is 3 - 1 and more", "3"),  # no "=": the marked number itself
    ("The final answer = -3", "-3"),
    ("The answer is \u22125.", "-5"),  # Unicode minus
    ("First 3 + 4 = 7, then 7 * 2 = 14", "14"),  # no marker: the last number
    ("From 2019-2020 it grew", "2020"),  # a hyphen between numbers is no minus
    ("It costs 9,26 now", "26"),  # "9,26" is two numbers, not 926
    ("It costs 1,0000", "0"),  # no fourth digit in a thousands group
    ("In total 1,234,567.5 people", "1234567.5"),
    ("I do not know.", None),
    ("", None),
]


@pytest.mark.parametrize("generation,expected", NUMBER_CASES)
def test_number_rule(generation: str, expected: str | None) -> None:
    assert extract_number(generation) == expected


@pytest.mark.parametrize(
    "text,canon",
    [("$1,000.", "1000"), ("1,000", "1000"), ("9,26", None), ("1,00,000", None), ("12,3456", None),
     ("18.0", "18"), ("-0.50", "-0.5"), ("\u22122", "-2"), (".5", "0.5"), ("1e5", None), (".", None), ("abc", None)],
)
def test_thousands_separators_only_in_groups_of_three(text: str, canon: str | None) -> None:
    assert canonical_number(text) == canon
    assert numbers_equal("9,26", "926") is False


LETTER_CASES = [
    ("Answer: B", 4, "B"),
    ("The right answer is 'A'.", 4, "A"),  # quotes
    ('The answer is "C".', 4, "C"),
    ("The answer is \u201cD\u201d.", 4, "D"),
    ("**Answer:** d", 4, "D"),  # markdown, lower case after ':'
    ("The answer is **(C)**", 4, "C"),
    ("The answer is (c).", 4, "C"),
    ("The best answer is B", 4, "B"),  # lm-eval's arc_challenge_chat phrasing
    ("The correct answer is option B.", 4, "B"),  # a word between marker and letter
    ("The answer is choice (D): the moon.", 4, "D"),
    ("Answer: A\nAnswer: C", 4, "A"),  # several marked: the first
    ("Option A is wrong, so the answer is B.", 4, "B"),  # a stated answer beats a mention
    ("The correct option is C.", 4, "C"),
    ("B. Planetary years will become longer.", 4, "B"),
    ("(D)", 4, "D"),
    ("'B'", 4, "B"),
    ("Choose D. stormy.", 4, "D"),
    ("I'd suggest: B. minerals.", 4, "B"),  # a letter alone after a colon
    ("Note: A plant needs light.", 4, None),  # ... but not an article after one
    ("To answer this, A is a mammal.", 4, None),  # "answer this" is no marker; "A is" no lead
    ("A dog is running.", 4, None),  # an article, not an option
    ("The answer is a bit unclear.", 4, None),
    ("The answer is A's neighbour.", 4, None),
    ("Answer: E", 4, None),  # beyond the question's four options: not an answer
    ("Answer: E", 5, "E"),
    ("Answer: I think B", 4, None),  # "I" is no option of four, and "think B" marks nothing
    ("", 4, None),
]


@pytest.mark.parametrize("generation,n_options,expected", LETTER_CASES)
def test_letter_rule(generation: str, n_options: int, expected: str | None) -> None:
    assert extract_letter(generation, n_options) == expected


@pytest.mark.parametrize(
    "generation,word",
    [("Answer: yes", "yes"), ("The answer is 'No'.", "no"), ("**Answer:** True", "yes"),
     ("No, the passage says otherwise.", "no"), ("There is no doubt. Answer: yes", "yes"), ("I cannot tell.", None)],
)
def test_yes_no_rule(generation: str, word: str | None) -> None:
    assert extract_yes_no(generation) == word


TEXT_CASES = [
    ("Answer: Paris", "paris"),
    ("The answer is 'Paris'.", "paris"),  # quotes
    ("**Answer:** **Paris**", "paris"),  # markdown
    ("The answer is Paris. It is the capital of France.", "paris"),  # cut at the sentence end
    ("The answer is 2 (wheat flour, sugar and eggs).", "2"),  # a trailing parenthetical
    ("To answer this, multiply 5 by 4.\nAnswer: 20", "20"),  # "answer this" is no marker
    ("Answer:\nParis", "paris"),  # the marker ends its line: the next line
    ("Answer: Paris\nAnswer: Lyon", "paris"),  # several marked: the first
    ("Paris", "paris"),  # unmarked and short: the line itself
    ("Well, I think that the capital city of France is clearly Paris, of course.", None),  # long prose
    ("", None),
]


@pytest.mark.parametrize("generation,expected", TEXT_CASES)
def test_free_text_rule(generation: str, expected: str | None) -> None:
    assert extract_free_text(generation) == expected


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_numeric_by_detection_and_by_request(tmp_path: Path) -> None:
    numeric = _jsonl(tmp_path / "n.jsonl", [{"prompt": "Cost?", "answer": "1,000"}, {"prompt": "Sum?", "answer": 4}])
    task = load_jsonl(numeric)
    assert isinstance(task, JsonlNumberTask) and task.describe()["answer_kind"] == "number"
    cost, total = task.questions
    assert cost.answer == "1000"
    assert task.grade(task.extract("The answer is 1,000 dollars (in cash)."), cost)
    assert task.grade(task.extract("To answer this, add 1 and 3.\nAnswer: 4"), total)
    assert not task.grade(task.extract("Answer: 100"), cost)
    mixed = _jsonl(tmp_path / "m.jsonl", [{"prompt": "City?", "answer": "Paris"}, {"prompt": "Sum?", "answer": 4}])
    assert type(load_jsonl(mixed)) is JsonlTask
    assert type(load_jsonl(numeric, answer_type="text")) is JsonlTask
    with pytest.raises(ValueError, match=r"m\.jsonl:1: answer 'Paris' is not a number"):
        load_jsonl(mixed, answer_type="number")
    with pytest.raises(ValueError, match="answer_type must be one of"):
        load_jsonl(numeric, answer_type="integer")


def test_unparsed_counts_only_invalid_answers_of_the_kind() -> None:
    """A prose line is no number, and "E" is no option of a four-option question."""
    q_num = Question(id="n", text="Sum?", answer="20")
    q_mc = Question(id="m", text="Pick", answer="B", choices=("w", "x", "y", "z"), gold_index=1)
    num, mc = JsonlNumberTask([q_num]), ARC([q_mc])

    def row(task, q, text):
        return candidate_row(task, q, Generation(tokens=[], text=text, logprob=0.0, finish="stop"), "strict")

    rows = [row(num, q_num, "Answer: the sum of the two"), row(num, q_num, "Answer: 20"),
            row(mc, q_mc, "Answer: E"), row(mc, q_mc, "Answer: B")]
    assert [r["extracted"] for r in rows] == [None, "20", None, "B"]
    assert [r["correct"] for r in rows] == [False, True, False, True]
    assert unparsed_rate(pd.DataFrame(rows)) == 0.5
    # The same prose as free text is a (wrong) answer, not an unparsed one.
    assert JsonlTask([q_num]).read_answer("Answer: the sum of the two", q_num) == "the sum of the two"
