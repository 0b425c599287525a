"""The number answer kind: finding a number in a generation, normalising it, comparing it.

Used by every task whose gold answer is a number (GSM8K, the synthetic arithmetic task,
numeric JSONL data), so that "$1,000." and "1000.0" grade the same everywhere.

Rule (README, "Grading"):
1. The first marked answer: an answer marker (`ANSWER_MARKER`: "answer is", "answer:",
   "final answer =", "####", ...) followed, in the same sentence and within 40
   characters of words without digits, by a number ("The answer is approximately $20");
   when that number starts a calculation, the calculation's result ("The answer is
   2 * 3 = 6" reads 6).
2. Else the last number in the text.
A number is an optional minus, digits with thousands separators only in groups of
three ("1,000" is one thousand; "9,26" is the two numbers 9 and 26), an optional decimal
part. Units, currency signs, percent signs, quotes, parentheses and markdown around it
are ignored. Two numbers are equal when their values agree to a relative 1e-6.

Strict rule (`extract_number_strict`): only the first marked answer (as in 1, with its
calculation), else a number in `\boxed{}`, else a reply that is one number and nothing
else, or one calculation and its result and nothing else ("79 + 21 = 100."): the
answer alone with its working, no prose to pick a number from. A marked answer at the
very end of a candidate the token limit stopped does not count (it may be cut: "The
answer is 13" of 131), nor does a lone number or calculation in one.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from .base import Question, Task
from .marker import ANSWER_MARKER, stated_before_cut

_MINUS = "-\u2212"  # ASCII hyphen-minus and the Unicode minus sign
# A minus sign counts only when not glued to a preceding word or digit ("2019-2020").
# A thousands group must not run on into a fourth digit ("1,0000" is not 10000).
_NUM = rf"(?:(?<![\w.])[{_MINUS}])?(?:\d{{1,3}}(?:,\d{{3}})+(?!\d)|\d+)(?:\.\d+)?"
NUMBER_RE = re.compile(_NUM)
# Between the marker and the number: up to 40 characters that are neither digits nor a
# sentence or line end (markdown, "$", quotes, "approximately", "Janet makes").
MARKED_RE = re.compile(ANSWER_MARKER + r"[^\d\n.!?]{0,40}?(" + _NUM + r")", re.IGNORECASE)
_CANONICAL_INPUT = re.compile(rf"[{_MINUS}]?(?:\d{{1,3}}(?:,\d{{3}})+|\d+)?(?:\.\d*)?")


def canonical_number(text: str) -> str | None:
    """The number in `text` written canonically ("$1,000." -> "1000", "18.0" -> "18",
    "-0.50" -> "-0.5"), or None when `text` is not a single number. Commas are
    thousands separators only in groups of three: "9,26" is not a number."""
    s = text.strip().removeprefix("$").rstrip(".").strip()
    if not re.search(r"\d", s) or not _CANONICAL_INPUT.fullmatch(s):
        return None
    s = s.replace(",", "").replace("\u2212", "-")
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


# After a marked number, a calculation that ends in a result: "is 2 * 2 * 2 = 8".
_CHAIN_RE = re.compile(r"(?:\s*[-+*/\u00d7\u00f7=]\s*[$(]*" + _NUM + r"\)*)+")


# A reply that is one calculation and its result: "79 + 21 = 100", "(3 * 4) = 12."
_OPERAND = r"[$(]*" + _NUM + r"\)*"
_ONLY_CALCULATION_RE = re.compile(
    r"\s*" + _OPERAND + r"(?:\s*[-+*/\u00d7\u00f7]\s*" + _OPERAND + r")+\s*=\s*\$?(" + _NUM + r")\s*\.?\s*")
_BOXED_RE = re.compile(r"\\boxed\{\s*\$?(" + _NUM + r")\s*\}")


def _marked_number(generation: str) -> tuple[str | None, int] | None:
    """The first marked answer's number (canonical) and where its statement ends, or
    None when no marker is followed by a number. When the marked number starts a
    calculation ("The answer is 2 * 3 = 6"), its result: the number after the
    calculation's last "="."""
    m = MARKED_RE.search(generation)
    if not m:
        return None
    chain = _CHAIN_RE.match(generation, m.end())
    if chain and "=" in chain.group(0):
        return canonical_number(NUMBER_RE.findall(chain.group(0).rsplit("=", 1)[1])[0]), chain.end()
    return canonical_number(m.group(1)), m.end()


def extract_number(generation: str) -> str | None:
    """The first marked answer's number, else the last number in the text, canonical.

    The first marked answer, not the last: small models often go on to invent a
    further question and answer it, and the first commitment is the answer given."""
    marked = _marked_number(generation)
    if marked is not None:
        return marked[0]
    found = NUMBER_RE.findall(generation)
    return canonical_number(found[-1]) if found else None


def extract_number_strict(generation: str, finished: bool = True) -> str | None:
    """The number stated in the declared format (module docstring, strict rule), or
    None. `finished`: the candidate ended on its own, not at the token limit."""
    marked = _marked_number(generation)
    if marked is not None:
        value, end = marked
        return value if stated_before_cut(generation, end, finished) else None
    boxed = _BOXED_RE.search(generation)
    if boxed:
        return canonical_number(boxed.group(1))
    if not finished:
        return None
    calculation = _ONLY_CALCULATION_RE.fullmatch(generation)
    return canonical_number(calculation.group(1)) if calculation else canonical_number(generation.strip().strip("*_` "))


class NumericTask(Task):
    """A task whose gold `answer` is a canonical number string."""

    answer_kind = "number"
    answer_format = "a number"

    def extract(self, generation: str) -> str | None:
        return extract_number(generation)

    def read_answer_strict(self, generation: str, q: Question, finished: bool) -> str | None:
        return extract_number_strict(generation, finished)

    def grade(self, extracted: str | None, q: Question) -> bool:
        return numbers_equal(extracted, q.answer)
