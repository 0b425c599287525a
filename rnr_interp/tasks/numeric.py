"""Numbers in generations: finding them, normalising them, comparing them.

Shared by GSM8K, the synthetic arithmetic task and free-form user data, so that
"$1,000." and "1000.0" grade the same everywhere.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from .base import Question, Task

# Thousands separators only in groups of three, so "1, 2, 3" stays three numbers.
# A minus sign counts only when not glued to a preceding word or digit ("2019-2020").
_NUM = r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
NUMBER_RE = re.compile(_NUM)
# An explicitly marked answer: "The answer is 18", "Answer: $1,000", "#### 42",
# tolerating markdown bold and a currency sign in between.
MARKED_RE = re.compile(
    r"(?:\banswer\b(?:\s+(?:is|would be|should be))?|####)[\s:=*$]*(" + _NUM + r")",
    re.IGNORECASE,
)


def canonical_number(text: str) -> str | None:
    """The number in `text` written canonically ("$1,000." -> "1000", "18.0" -> "18",
    "-0.50" -> "-0.5"), or None when `text` is not a single number."""
    s = text.strip().replace(",", "").removeprefix("$").rstrip(".").strip()
    if not re.fullmatch(r"-?(?:\d+(?:\.\d*)?|\.\d+)", s):
        return None
    try:
        d = Decimal(s).normalize()
    except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
        return None
    out = format(d, "f")
    return "0" if out == "-0" else out


def numbers_equal(a: str | None, b: str | None, rel_tol: float = 1e-6) -> bool:
    """Numeric equivalence of two number strings; False when either is not a number."""
    if a is None or b is None:
        return False
    ca, cb = canonical_number(a), canonical_number(b)
    if ca is None or cb is None:
        return False
    return math.isclose(float(ca), float(cb), rel_tol=rel_tol, abs_tol=1e-9)


def extract_number(generation: str) -> str | None:
    """The first explicitly marked answer, else the last number in the text, canonical.

    The first marked answer, not the last: small models often go on to invent a
    further question and answer it, and the first commitment is the answer given."""
    m = MARKED_RE.search(generation)
    if m:
        return canonical_number(m.group(1))
    found = NUMBER_RE.findall(generation)
    return canonical_number(found[-1]) if found else None


class NumericTask(Task):
    """A task whose gold `answer` is a canonical number string."""

    answer_format = "a number"

    def extract(self, generation: str) -> str | None:
        return extract_number(generation)

    def grade(self, extracted: str | None, q: Question) -> bool:
        return numbers_equal(extracted, q.answer)
