"""LogiQA logical reasoning (lgw863/LogiQA-dataset text files, e.g. Test.txt).

Each item is 8 lines: a blank line, the answer letter a-d, the context, the question,
then four options prefixed "A." .. "D.". A few items have their prefixes out of order
or written "A?" / "A " (or missing): the option's LINE POSITION is its letter, and the
prefix is only stripped. `context` = passage, `text` = question, `answer` = "A".."D",
ids `logiqa-<item index>`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from ._io import RowError, get_str, get_str_list, iter_records, parse_all
from .base import LETTERS, DataFormatError, MultipleChoiceTask, Question

RECORD_LINES = 8
# "A." "A?" "A:" "A)" or "A " before the option text; applied to file lines only,
# since an unprefixed option may itself start with the word "A".
_PREFIX_RE = re.compile(r"^\s*[A-D]\s*(?:[.?:)．]|\s)\s*")


class LogiQA(MultipleChoiceTask):
    name = "logiqa"


def parse_row(obj: dict[str, Any], index: int) -> Question:
    letter = get_str(obj, "answer").strip().upper()
    if len(letter) != 1 or letter not in LETTERS[:4]:
        raise RowError(f"answer must be a letter a-d, got {obj['answer']!r}")
    gold = LETTERS.index(letter)
    return Question(
        id=f"logiqa-{index}",
        text=get_str(obj, "question"),
        answer=letter,
        choices=tuple(get_str_list(obj, "options", 4)),
        gold_index=gold,
        context=get_str(obj, "context"),
    )


def _rows(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for line_no, (blank, answer, context, question, *options) in iter_records(path, RECORD_LINES):
        if blank.strip():
            # A non-blank separator means the records have slipped out of step.
            raise DataFormatError(path, line_no, f"record should start with a blank line, got {blank[:40]!r}")
        yield line_no, {
            "answer": answer,
            "context": context,
            "question": question,
            "options": [_PREFIX_RE.sub("", o, count=1) for o in options],
        }


def load_logiqa(path: str | Path) -> LogiQA:
    return LogiQA(parse_all(path, _rows(path), parse_row), source=str(path))
