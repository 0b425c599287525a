"""Your own questions, one JSON object a line.

Schema (unknown fields are kept in `Question.meta`):

    id        optional  string or int; default: the 1-based line number, as text
    prompt    required  the question text ("question" is accepted instead; not both)
    context   optional  a passage shown before the question
    choices   optional  list of 2-10 option strings -> a multiple-choice task
    answer    required  free-form: the gold answer (string or number)
                        multiple choice: a letter "A".. (any case), a 0-based int
                        index, or the exact text of one choice (a letter wins when
                        both could apply)

Either every row has `choices` or none does. Examples:

    {"prompt": "Capital of France?", "answer": "Paris"}
    {"id": "q7", "question": "2+2?", "answer": 4}
    {"prompt": "Largest planet?", "choices": ["Mars", "Jupiter"], "answer": "B"}

Free-form answers are numbers or text (`answer_type`): "auto" (the default) makes the
task numeric when every gold answer is a number ("1,000", 4, "-2.5"), else free text;
"number" insists (a non-numeric gold is an error naming its line); "text" forces free
text. Numbers are read and graded by `numeric` (the number rule), text by `freetext`
(marked answer, normalised exact match, numeric equivalence when both are numbers).
The model is asked to answer as 'Answer: X'.
Multiple choice: `answer` becomes the option's letter, graded like any MC task.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from ._io import RowError, get_str, iter_jsonl, parse_all
from .base import LETTERS, DataFormatError, MultipleChoiceTask, Question, Task
from .freetext import extract_free_text, extract_free_text_strict, normalise
from .numeric import NumericTask, canonical_number, numbers_equal

_KNOWN = {"id", "prompt", "question", "context", "choices", "answer"}
ANSWER_TYPES = ("auto", "number", "text")
_INSTRUCTION = "Give the final answer as 'Answer: X'."


class JsonlTask(Task):
    """Free-text questions from a user file."""

    name = "jsonl"
    answer_format = "free text after 'Answer:'"
    instruction = _INSTRUCTION
    max_new_tokens = 64

    def extract(self, generation: str) -> str | None:
        return extract_free_text(generation)

    def read_answer_strict(self, generation: str, q: Question, finished: bool) -> str | None:
        return extract_free_text_strict(generation, finished)

    def grade(self, extracted: str | None, q: Question) -> bool:
        if extracted is None:
            return False
        return normalise(extracted) == normalise(q.answer) or numbers_equal(extracted, q.answer)


class JsonlNumberTask(NumericTask):
    """Questions with numeric gold answers from a user file, graded as numbers."""

    name = "jsonl"
    answer_format = "a number after 'Answer:'"
    instruction = _INSTRUCTION
    max_new_tokens = 64


class JsonlMCTask(MultipleChoiceTask):
    """Multiple-choice questions from a user file."""

    name = "jsonl"


def _choice_index(answer: Any, choices: list[str]) -> int:
    if isinstance(answer, int) and not isinstance(answer, bool):
        if 0 <= answer < len(choices):
            return answer
        raise RowError(f"answer index {answer} out of range for {len(choices)} choices")
    if isinstance(answer, str):
        a = answer.strip()
        if len(a) == 1 and a.upper() in LETTERS[: len(choices)]:
            return LETTERS.index(a.upper())
        if a in (c.strip() for c in choices):
            return [c.strip() for c in choices].index(a)
    raise RowError(f"answer {answer!r} is neither a letter, an index nor the text of a choice")


def parse_row(obj: dict[str, Any], index: int) -> Question:
    if "prompt" in obj and "question" in obj:
        raise RowError("give either 'prompt' or 'question', not both")
    if "prompt" not in obj and "question" not in obj:
        raise RowError("missing field 'prompt' (or 'question')")
    text = get_str(obj, "prompt" if "prompt" in obj else "question")
    raw_id = obj.get("id", index + 1)
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        raise RowError(f"field 'id' must be a string or int, got {raw_id!r}")
    context = get_str(obj, "context") if "context" in obj else None
    if "answer" not in obj:
        raise RowError("missing field 'answer'")
    answer = obj["answer"]
    if isinstance(answer, float) and not math.isfinite(answer):  # json reads NaN and Infinity
        raise RowError(f"field 'answer' must be a finite number, got {answer!r}")
    meta = {k: v for k, v in obj.items() if k not in _KNOWN}
    common = dict(id=str(raw_id), text=text, context=context, meta=meta)
    if "choices" in obj:
        choices = obj["choices"]
        if (
            not isinstance(choices, list)
            or not 2 <= len(choices) <= len(LETTERS)
            or not all(isinstance(c, str) for c in choices)
        ):
            raise RowError(f"field 'choices' must be a list of 2 to {len(LETTERS)} strings")
        gold = _choice_index(answer, choices)
        return Question(answer=LETTERS[gold], choices=tuple(choices), gold_index=gold, **common)
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip():
        raise RowError(f"field 'answer' must be a non-empty string or a number, got {answer!r}")
    return Question(answer=str(answer).strip(), **common)


def _as_numbers(path: str | Path, rows: list[tuple[int, dict[str, Any]]], questions: list[Question],
                answer_type: str) -> list[Question] | None:
    """The questions with canonical numeric gold answers when the task is numeric
    (`answer_type` "number", or "auto" and every gold a number), else None."""
    if answer_type == "text":
        return None
    canon = [canonical_number(q.answer) for q in questions]
    if answer_type == "auto" and None in canon:
        return None
    for (line_no, _), q, c in zip(rows, questions, canon):
        if c is None:
            raise DataFormatError(path, line_no, f"answer {q.answer!r} is not a number (--answer-type number)")
    return [dataclasses.replace(q, answer=c) for q, c in zip(questions, canon)]


def load_jsonl(path: str | Path, instruction: str | None = None, answer_type: str = "auto") -> Task:
    """A `JsonlMCTask` when the rows have choices; else a `JsonlNumberTask` or a
    `JsonlTask` by `answer_type` (see the module docstring). `instruction` replaces
    the default answer-format instruction."""
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"answer_type must be one of {', '.join(ANSWER_TYPES)}, got {answer_type!r}")
    rows = list(iter_jsonl(path))
    if not rows:
        raise DataFormatError(path, None, "no rows")
    mc = "choices" in rows[0][1]
    for line_no, obj in rows:
        if ("choices" in obj) != mc:
            raise DataFormatError(path, line_no, "mixes rows with and without 'choices'")
    # A row without an id is named by its line, which blank lines keep apart from its index.
    rows = [(ln, obj if "id" in obj else {**obj, "id": ln}) for ln, obj in rows]
    questions = parse_all(path, rows, parse_row)
    seen: set[str] = set()
    for (line_no, _), q in zip(rows, questions):
        if q.id in seen:
            raise DataFormatError(path, line_no, f"duplicate id {q.id!r}")
        seen.add(q.id)
    numeric = None if mc else _as_numbers(path, rows, questions, answer_type)
    if mc:
        task: Task = JsonlMCTask(questions, source=str(path))
    elif numeric is not None:
        task = JsonlNumberTask(numeric, source=str(path))
    else:
        task = JsonlTask(questions, source=str(path))
    if instruction is not None:
        task.instruction = instruction
    return task
