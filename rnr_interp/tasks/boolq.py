"""BoolQ yes/no reading comprehension (HF google/boolq export, JSON lines).

Row: {"question": str, "passage": str, "answer": bool}. The passage is `context`.

BoolQ is a two-option multiple-choice task whose options are the words themselves:
`choices` = ("yes", "no"), `gold_index` the gold word's position, and `answer` is the
WORD "yes"/"no" (not a letter), since that is what a model writes. The user turn lists
no lettered options; recognition ranks " yes" against " no" after
"<passage>\\n\\nQuestion: <question>?\\nAnswer:". Ids are `boolq-<row index>`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ._io import RowError, get_str, iter_jsonl, parse_all
from .base import MultipleChoiceTask, Question
from .letter import extract_yes_no, extract_yes_no_strict

CHOICES = ("yes", "no")


class BoolQ(MultipleChoiceTask):
    name = "boolq"
    answer_format = "yes or no"
    instruction = "Answer with yes or no, as 'Answer: yes' or 'Answer: no'."
    max_new_tokens = 16
    answer_kind = "word"

    def extract(self, generation: str) -> str | None:
        return extract_yes_no(generation)

    def read_answer_strict(self, generation: str, q: Question, finished: bool) -> str | None:
        return extract_yes_no_strict(generation, finished)

    def options(self, q: Question) -> tuple[str, ...] | None:
        return CHOICES


    def user_message(self, q: Question) -> str:
        # The options are the answer words themselves; lettering them would invite "A".
        return super().user_message(dataclasses.replace(q, choices=None))

    def recognition_prompt(self, q: Question) -> str:
        return f"{(q.context or '').strip()}\n\nQuestion: {q.text.strip()}\nAnswer:".strip()


def parse_row(obj: dict[str, Any], index: int) -> Question:
    answer = obj.get("answer")
    if not isinstance(answer, bool):
        raise RowError(f"field 'answer' must be true or false, got {answer!r}")
    question = get_str(obj, "question").strip()
    if not question.endswith("?"):  # the export has lower-case questions without '?'
        question += "?"
    word = "yes" if answer else "no"
    return Question(
        id=f"boolq-{index}",
        text=question,
        answer=word,
        choices=CHOICES,
        gold_index=CHOICES.index(word),
        context=get_str(obj, "passage"),
    )


def load_boolq(path: str | Path) -> BoolQ:
    return BoolQ(parse_all(path, iter_jsonl(path), parse_row), source=str(path))
