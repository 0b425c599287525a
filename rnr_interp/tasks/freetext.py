"""The free-text answer kind: a short answer read after a marker, compared normalised.

Rule (README, "Grading"):
1. After the first answer marker (`marker.ANSWER_MARKER`, "Answer: X", "The answer is
   X"): the rest of that line, or the next non-empty line when the marker ends its line.
2. Else, with no marker: the first non-empty line, only when it is short (at most
   `MAX_UNMARKED_WORDS` words); longer unmarked prose is no answer (unparsed).
The answer is then cut at its first sentence end (". ", "! ", "? "), a trailing
parenthetical is dropped ("2 (wheat flour...)" -> "2"), and it is normalised: casefold,
collapsed spaces, surrounding quotes and markdown and trailing punctuation removed.
Grading: equal normalised strings, or equal numbers (numeric.numbers_equal) when both
sides are numbers.

Strict rule (`extract_free_text_strict`): the marked answer of rule 1 whose line is
complete (the candidate finished, or went on after that line), or, when the candidate
finished with no marker, a reply that is one short line and nothing else.
"""

from __future__ import annotations

import re

from .marker import ANSWER_MARKER, stated_before_cut

MAX_UNMARKED_WORDS = 8

_MARKED_RE = re.compile(ANSWER_MARKER + r"[ \t]*(?P<rest>[^\n]*)(?P<after>.*)", re.IGNORECASE | re.DOTALL)
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")
_TRAILING_PAREN = re.compile(r"\s*[(\[][^()\[\]]*[)\]]?\s*$")


def normalise(text: str) -> str:
    """Casefolded, spaces collapsed, surrounding quotes/markdown and trailing
    punctuation removed: the form free-text answers are compared in."""
    s = " ".join(text.split()).casefold()
    s = s.strip("*_`\"'\u201c\u201d\u2018\u2019 ")
    return s.rstrip(".!?,;:").strip("*_`\"'\u201c\u201d\u2018\u2019 ")


def _first_line(text: str) -> str:
    return next((ln for ln in text.splitlines() if ln.strip()), "")


def _marked_answer(generation: str) -> tuple[str, int] | None:
    """The raw text after the first marker (the rest of its line, or the next non-empty
    line when the marker ends its line) and where that line ends; None without a marker."""
    m = _MARKED_RE.search(generation)
    if not m:
        return None
    if normalise(m.group("rest")):
        return m.group("rest"), m.end("rest")
    line = _first_line(m.group("after"))
    return line, (generation.find(line, m.start("after")) + len(line)) if line else m.end("rest")


def extract_free_text(generation: str) -> str | None:
    """The normalised answer, or None when the generation states none."""
    marked = _marked_answer(generation)
    if marked is not None:
        answer = marked[0]
    else:
        answer = _first_line(generation)
        if len(answer.split()) > MAX_UNMARKED_WORDS:
            return None
    return _cut_and_normalise(answer)


def extract_free_text_strict(generation: str, finished: bool = True) -> str | None:
    """The normalised answer stated in the declared format (module docstring, strict
    rule), or None. `finished`: the candidate ended on its own."""
    marked = _marked_answer(generation)
    if marked is not None:
        answer, end = marked
        return _cut_and_normalise(answer) if stated_before_cut(generation, end, finished) else None
    reply = generation.strip()
    if not finished or "\n" in reply or len(reply.split()) > MAX_UNMARKED_WORDS:
        return None
    return _cut_and_normalise(reply)


def _cut_and_normalise(answer: str) -> str | None:
    """An answer cut at its first sentence end, without a trailing parenthetical, normalised."""
    end = _SENTENCE_END.search(answer)
    if end:
        answer = answer[: end.start()]
    answer = _TRAILING_PAREN.sub("", answer) or answer
    return normalise(answer) or None
