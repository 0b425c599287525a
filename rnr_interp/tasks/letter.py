"""The letter answer kind (multiple choice) and its word variant (yes/no).

Letter rule (README, "Grading"), for a question with options A.. up to its m-th letter:
1. The first marked letter: an answer marker (`marker.ANSWER_MARKER`) followed by the
   letter, optionally wrapped in quotes, parentheses, brackets or markdown and optionally
   after the word "option", "choice" or "letter" ("The right answer is 'A'.", "Answer:
   **(C)**", "The answer is option B"). A lower-case letter counts only after ':' or
   inside quotes or brackets, so "the answer is a bit..." is no "A".
2. Else the first "option X", "choice X", "choose X", "select X" or "pick X" with a
   capital letter ("Option B is right", "Choose D.").
3. Else a letter alone at the start: "B", "B.", "(C)", "**D**", "A) ..." but not "A dog".
4. Else a letter standing alone after any colon ("I'd suggest: B. minerals"; lm-eval's
   last fallback), with the same ending as in 3, so "Note: A plant..." is no "A".
A letter beyond the question's m options is not an answer and is skipped.

Word rule (BoolQ): the first marked yes/no/true/false, else the first such word anywhere;
true/false read as yes/no.

Strict rules (`extract_letter_strict`, `extract_yes_no_strict`): the first marked answer
(rule 1), or a reply that is the letter (word) alone ("B", "(B).", "**yes**"); a marked
answer at the very end of a candidate the token limit stopped does not count, nor does a
lone letter in one (`marker.stated_before_cut`).
"""

from __future__ import annotations

import re

from .marker import ANSWER_MARKER, stated_before_cut

LETTERS = "ABCDEFGHIJ"

_WRAP = r"[\s*_:\"'`\u201c\u2018(\[]*"  # what may sit between a marker and the letter
# The letter must end its word: not "A dog", not "A's", not "B12".
_LETTER_END = r"(?![A-Za-z0-9]|'[a-z])"
_MARKED_RE = re.compile(
    ANSWER_MARKER + _WRAP + r"(?:(?:option|choice|letter)\b" + _WRAP + r")?(?P<letter>[A-Za-z])" + _LETTER_END,
    re.IGNORECASE,
)
_MENTION_RE = re.compile(
    r"\b(?i:option|choice|choose|select|pick)\b(?:\s+(?i:is))?" + _WRAP + r"(?P<letter>[A-J])" + _LETTER_END
)
# A letter standing alone: followed by ")", ".", ":", "]", "*", ",", a quote, a dash or the end.
_ALONE = r"([A-J])(?:[).:\]*,\"'`\u201d\u2019]|\s*$|\s+[-\u2013\u2014])"
_LEAD_RE = re.compile(r"^[\s*(\[\"'`\u201c\u2018]*" + _ALONE)
_AFTER_COLON_RE = re.compile(r":[\s*(\[\"'`\u201c\u2018]*" + _ALONE, re.MULTILINE)
_WORD_MARKED_RE = re.compile(ANSWER_MARKER + _WRAP + r"(yes|no|true|false)\b", re.IGNORECASE)
_WORD_RE = re.compile(r"\b(yes|no|true|false)\b", re.IGNORECASE)
# A reply that is its answer alone, optionally wrapped ("B", "(B).", "**yes**").
_ONLY_RE = r"^[\s*_(\[\"'`\u201c\u2018]*({})[\s*_)\].!:\"'`\u201d\u2019]*$"
_ONLY_LETTER_RE = re.compile(_ONLY_RE.format("[A-J]"))
_ONLY_WORD_RE = re.compile(_ONLY_RE.format("yes|no|true|false"), re.IGNORECASE)


def _lower_case_allowed(match: re.Match[str]) -> bool:
    """A lower-case letter is an answer only when set off: after ':' or inside quotes
    or brackets ("answer: c", "answer is (c)"), never as a plain word."""
    before = match.group(0)[: match.start("letter") - match.start(0)]
    return any(ch in before for ch in ":(['\"`\u201c\u2018")


def extract_letter(generation: str, n_options: int = len(LETTERS)) -> str | None:
    """The chosen option's letter (upper case) among the first `n_options`, or None."""
    valid = LETTERS[:n_options]
    marked = _marked_letter(generation, valid)
    if marked is not None:
        return marked.group("letter").upper()
    for m in _MENTION_RE.finditer(generation):
        if m.group("letter") in valid:
            return m.group("letter")
    m = _LEAD_RE.match(generation.strip())
    if m and m.group(1) in valid:
        return m.group(1)
    return next((m.group(1) for m in _AFTER_COLON_RE.finditer(generation) if m.group(1) in valid), None)


def _marked_letter(generation: str, valid: str) -> re.Match[str] | None:
    for m in _MARKED_RE.finditer(generation):
        letter = m.group("letter")
        if (letter.isupper() or _lower_case_allowed(m)) and letter.upper() in valid:
            return m
    return None


def extract_letter_strict(generation: str, n_options: int = len(LETTERS), finished: bool = True) -> str | None:
    """The letter stated in the declared format (module docstring, strict rules) among
    the first `n_options`, or None. `finished`: the candidate ended on its own."""
    m = _marked_letter(generation, LETTERS[:n_options])
    if m is not None:
        return m.group("letter").upper() if stated_before_cut(generation, m.end(), finished) else None
    alone = _ONLY_LETTER_RE.match(generation) if finished else None
    return alone.group(1) if alone and alone.group(1) in LETTERS[:n_options] else None


def _yes_no(word: str) -> str:
    word = word.lower()
    return {"true": "yes", "false": "no"}.get(word, word)


def extract_yes_no_strict(generation: str, finished: bool = True) -> str | None:
    """"yes" or "no" stated in the declared format (module docstring), or None."""
    m = _WORD_MARKED_RE.search(generation)
    if m is not None:
        return _yes_no(m.group(1)) if stated_before_cut(generation, m.end(), finished) else None
    alone = _ONLY_WORD_RE.match(generation) if finished else None
    return _yes_no(alone.group(1)) if alone else None


def extract_yes_no(generation: str) -> str | None:
    """"yes" or "no" (true/false mapped onto them), or None."""
    m = _WORD_MARKED_RE.search(generation) or _WORD_RE.search(generation)
    return _yes_no(m.group(1)) if m else None
