"""AI2 ARC (Challenge or Easy) JSON lines.

Row: {"id", "question": {"stem", "choices": [{"text", "label"}, ...]}, "answerKey"}.
Labels are letters or digits "1".."4" and there are 3 to 5 choices, so options are
re-lettered by position: `answer` is the LETTER of the gold option's position,
`gold_index` its position, `meta["labels"]` the original labels. Ids are the file's ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._io import RowError, get_str, iter_jsonl, parse_all
from .base import LETTERS, MultipleChoiceTask, Question


class ARC(MultipleChoiceTask):
    name = "arc"


def parse_row(obj: dict[str, Any], index: int) -> Question:
    q = obj.get("question")
    if not isinstance(q, dict):
        raise RowError("field 'question' must be an object with 'stem' and 'choices'")
    choices = q.get("choices")
    if not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS):
        raise RowError(f"'question.choices' must be a list of 2 to {len(LETTERS)} options")
    if not all(isinstance(c, dict) for c in choices):
        raise RowError("each of 'question.choices' must be an object with 'text' and 'label'")
    labels = [get_str(c, "label").strip() for c in choices]
    texts = [get_str(c, "text", allow_empty=True) for c in choices]
    if len(set(labels)) != len(labels):
        dup = next(label for label in labels if labels.count(label) > 1)
        raise RowError(f"ambiguous gold: two choices have the label {dup!r}")
    key = get_str(obj, "answerKey").strip()
    if key not in labels:
        raise RowError(f"answerKey {key!r} is not one of the labels {labels}")
    gold = labels.index(key)
    return Question(
        id=get_str(obj, "id"),
        text=get_str(q, "stem"),
        answer=LETTERS[gold],
        choices=tuple(texts),
        gold_index=gold,
        meta={"labels": labels},
    )


def load_arc(path: str | Path) -> ARC:
    return ARC(parse_all(path, iter_jsonl(path), parse_row), source=str(path))
