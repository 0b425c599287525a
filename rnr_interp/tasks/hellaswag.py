"""HellaSwag sentence completion (text export of the validation split, .bz2 or plain).

Each item is 6 lines: the context ("<activity>: <ctx>"), the gold label 0-3, then the
four endings. `text` = context, `choices` = endings, `answer` = "A".."D",
ids `hellaswag-<item index>`. A .bz2 file is read directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from ._io import get_index, get_str, get_str_list, iter_records, parse_all
from .base import LETTERS, MultipleChoiceTask, Question

RECORD_LINES = 6


class HellaSwag(MultipleChoiceTask):
    name = "hellaswag"
    instruction = (
        "Which ending continues the text most plausibly? "
        "Answer with the letter of the correct option, e.g. 'Answer: A'."
    )


def parse_row(obj: dict[str, Any], index: int) -> Question:
    endings = get_str_list(obj, "endings", 4)
    gold = get_index(obj, "label", len(endings))
    return Question(
        id=f"hellaswag-{index}",
        text=get_str(obj, "ctx"),
        answer=LETTERS[gold],
        choices=tuple(endings),
        gold_index=gold,
    )


def _rows(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for line_no, (ctx, label, *endings) in iter_records(path, RECORD_LINES):
        yield line_no, {"ctx": ctx, "label": label, "endings": endings}


def load_hellaswag(path: str | Path) -> HellaSwag:
    return HellaSwag(parse_all(path, _rows(path), parse_row), source=str(path))
