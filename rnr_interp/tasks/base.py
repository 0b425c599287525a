"""What a task is: questions, how to ask them, how to read and grade an answer.

A task fixes its answer format: the instruction appended to every question, the
extractor that reads an answer out of a generation, and the grader. The format is
recorded in every run manifest (`Task.describe()`), so two runs can only be compared
when they asked the same way.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

LETTERS = "ABCDEFGHIJ"


class DataFormatError(ValueError):
    """A data file that does not parse; the message names file, line and problem."""

    def __init__(self, path: Any, line: int | None, problem: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path, self.line, self.problem = path, line, problem


@dataclass(frozen=True)
class Question:
    """One item. `answer` is the gold answer as the grader compares it
    (a number as text, a letter, "yes"/"no"). Multiple-choice items also carry
    their option texts and the gold option's index."""

    id: str
    text: str
    answer: str
    choices: tuple[str, ...] | None = None
    gold_index: int | None = None
    context: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


class Task:
    """Base class. Subclasses set `name`, `answer_format`, `instruction`, and
    override `extract` (and `grade` when equality of normalised strings is wrong)."""

    name: str = "task"
    answer_format: str = "free text"
    instruction: str = ""
    max_new_tokens: int = 64
    #: generation stops when any of these appears in the decoded continuation
    stop_strings: tuple[str, ...] = ()

    def __init__(self, questions: Sequence[Question], source: str = "builtin"):
        self.questions = list(questions)
        self.source = source
        ids = [q.id for q in self.questions]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"{self.name}: duplicate question id {dup!r} in {source}")

    def __len__(self) -> int:
        return len(self.questions)

    def ids_hash(self) -> str:
        """A short hash of the question ids in order: two runs asked the same questions
        only when theirs agree."""
        return hashlib.sha1("\n".join(q.id for q in self.questions).encode()).hexdigest()[:16]

    def content_hash(self) -> str:
        """A short sha256 of the questions as loaded, in order: ids, texts, contexts,
        options and gold. Two runs asked the same questions with the same gold only
        when theirs agree, wherever the data file lived."""
        digest = hashlib.sha256()
        for q in self.questions:
            fields = [q.id, q.context, q.text, list(q.choices) if q.choices is not None else None, q.answer, q.gold_index]
            digest.update(json.dumps(fields, ensure_ascii=False).encode() + b"\n")
        return digest.hexdigest()[:16]

    def head(self, n: int | None) -> "Task":
        """The same task restricted to its first n questions (None: all)."""
        if n is None:
            return self
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.questions = self.questions[:n]
        return clone

    # -- asking -------------------------------------------------------------
    def user_message(self, q: Question) -> str:
        """The question as the user turn (the chat template, if any, is applied by
        the model wrapper, not here)."""
        parts = []
        if q.context:
            parts.append(q.context.strip())
        parts.append(q.text.strip())
        if q.choices is not None:
            parts.append("\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(q.choices)))
        if self.instruction:
            parts.append(self.instruction)
        return "\n\n".join(parts)

    # -- reading and grading -----------------------------------------------
    def extract(self, generation: str) -> str | None:
        """The answer in a generation, normalised, or None when none parses."""
        raise NotImplementedError

    def grade(self, extracted: str | None, q: Question) -> bool:
        return extracted is not None and extracted == q.answer

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "answer_format": self.answer_format,
            "instruction": self.instruction,
            "max_new_tokens": self.max_new_tokens,
            "stop_strings": list(self.stop_strings),
            "source": self.source,
            "n_questions": len(self.questions),
            "questions_hash": self.content_hash(),
        }


class MultipleChoiceTask(Task):
    """Options are lettered A, B, ...; the gold answer is a letter, `gold_index` its
    position. (A subclass may grade option words instead, e.g. BoolQ's "yes"/"no";
    `gold_index` always names the gold option in `choices`.)"""

    answer_format = "letter of the chosen option"
    instruction = "Answer with the letter of the correct option, e.g. 'Answer: A'."
    max_new_tokens = 32

    # "Answer: B", "the answer is (C)", "**Answer:** c", "option B", "correct choice is D".
    # A lower-case letter counts only after ':' or '(' so "the answer is a bit..." is no "A".
    _answer_re = re.compile(
        r"\b(?P<kw>answer|option|choice)\b(?:\s+(?:is|would be|should be))?(?P<sep>[\s:*\-(]*)"
        r"(?P<letter>[A-J])(?![\w'])",
        re.IGNORECASE,
    )
    # A bare leading letter: "B", "B.", "(C)", "**D**", "A) ..." but not "A dog ...".
    _lead_re = re.compile(r"^[\s*(\[]*([A-J])(?:[).:\]*,]|\s*$|\s+[-\u2013\u2014])")

    def extract(self, generation: str) -> str | None:
        found = [
            m for m in self._answer_re.finditer(generation)
            if m.group("letter").isupper() or ":" in m.group("sep") or "(" in m.group("sep")
        ]
        # "Option A is wrong, the answer is B": a stated answer outranks a mentioned option.
        found.sort(key=lambda m: m.group("kw").lower() != "answer")
        if found:
            return found[0].group("letter").upper()
        m = self._lead_re.match(generation.strip())
        return m.group(1) if m else None

    def recognition_prompt(self, q: Question) -> str:
        """The context before each option's text when options are ranked by
        likelihood (no letters, no instruction)."""
        return "\n\n".join(p for p in (q.context, q.text) if p).strip()
