"""GSM8K grade-school maths (openai/grade-school-math JSON lines).

Row: {"question": str, "answer": "<worked solution>\\n#### <number>"}. Gold `answer` is
the canonical number after "#### " (commas stripped); the worked solution goes to
`meta["solution"]`. Ids are `gsm8k-<row index>` (0-based), matching HF row order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._io import RowError, get_str, iter_jsonl, parse_all
from .base import Question
from .numeric import NumericTask, canonical_number


class GSM8K(NumericTask):
    name = "gsm8k"
    answer_format = "a number, stated last as 'The answer is N.'"
    instruction = (
        "Solve the problem step by step. Finish with 'The answer is N.' where N is the final number."
    )
    # Chain-of-thought answers need room; the model's EOS ends them, no stop strings.
    max_new_tokens = 256


def parse_row(obj: dict[str, Any], index: int) -> Question:
    question = get_str(obj, "question")
    solution, sep, final = get_str(obj, "answer").rpartition("####")
    if not sep:
        raise RowError("field 'answer' has no '#### <number>' line")
    gold = canonical_number(final)
    if gold is None:
        raise RowError(f"final answer {final.strip()!r} is not a number")
    return Question(id=f"gsm8k-{index}", text=question, answer=gold, meta={"solution": solution.strip()})


def load_gsm8k(path: str | Path) -> GSM8K:
    return GSM8K(parse_all(path, iter_jsonl(path), parse_row), source=str(path))
