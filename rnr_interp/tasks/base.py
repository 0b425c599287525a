"""What a task is: questions, how to ask them, how to read and grade an answer.

A task fixes its answer format: the instruction appended to every question, the
extractor that reads an answer out of a generation, and the grader. The format is
recorded in every run manifest (`Task.describe()`), so two runs can only be compared
when they asked the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from .letter import LETTERS, extract_letter, extract_letter_strict


class DataFormatError(ValueError):
    """A data file that does not parse; the message names file, line and problem."""

    def __init__(self, path: Any, line: int | None, problem: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path, self.line, self.problem = path, line, problem

    def __reduce__(self) -> tuple[Any, ...]:  # rebuilt from its parts (it comes back from a child process pickled)
        return type(self), (self.path, self.line, self.problem)


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


def rotate_options(q: Question, shift: int = 1) -> Question:
    """q with its options rotated by `shift` positions: option i is shown at position
    (i + shift) mod n, and the gold letter moves with the gold option, so a letter
    answer is graded against the rotated gold. The id stays (records tell the rotated
    rows apart by their probe); `meta["rotated_by"]` says how far `choices` moved from
    the question as loaded. Only for questions graded by their gold option's letter
    (BoolQ grades words: rotating its options changes nothing it grades)."""
    if q.choices is None or q.gold_index is None:
        raise ValueError(f"question {q.id!r} has no options to rotate")
    n = len(q.choices)
    if q.answer != LETTERS[q.gold_index]:
        raise ValueError(f"question {q.id!r} is graded by {q.answer!r}, not by its gold option's letter "
                         f"{LETTERS[q.gold_index]}: rotating its options would not move what is graded")
    gold = (q.gold_index + shift) % n
    return dataclasses.replace(
        q, choices=tuple(q.choices[(j - shift) % n] for j in range(n)), gold_index=gold, answer=LETTERS[gold],
        meta={**q.meta, "rotated_by": (q.meta.get("rotated_by", 0) + shift) % n},
    )


@dataclass(frozen=True)
class CandidateGrade:
    """What grading one candidate gives: the answer read flexibly (None: none parses),
    and whether it is correct under each grading."""

    extracted: str | None
    flexible: bool
    strict: bool


class Task:
    """Base class. Subclasses set `name`, `answer_format`, `instruction`, and
    override `extract` (and `grade` when equality of normalised strings is wrong)."""

    name: str = "task"
    #: the answer-extraction module's kind: "number", "letter", "word" or "text"
    answer_kind: str = "text"
    answer_format: str = "free text"
    instruction: str = ""
    max_new_tokens: int = 64
    #: generation stops when any of these appears in the decoded continuation
    stop_strings: tuple[str, ...] = ()
    #: rows of the data file dropped as invalid (`--on-invalid skip`): {"row", "id", "reason"}
    skipped_rows: tuple[dict[str, Any], ...] = ()
    #: set on a task whose golds are a model's own answers (`analyses.anchor`): the task
    #: it was anchored from (name, source, n_questions, questions_hash) and the model
    anchored: dict[str, Any] | None = None

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

    def read_answer(self, generation: str, q: Question) -> str | None:
        """The answer to `q` in a generation when it is a valid answer of this task's
        kind for `q` (a number, one of q's option letters, ...), else None: a candidate
        counts as parsed exactly when this is not None."""
        return self.extract(generation)

    def read_answer_strict(self, generation: str, q: Question, finished: bool) -> str | None:
        """The answer to `q` stated in this task's declared format (a marked answer, or a
        reply that is the answer alone), else None; `finished` says the candidate ended
        on its own rather than at the token limit. Each answer kind's module defines its
        strict rule (numbers, letters, yes/no, free text); a task that reads its answers
        its own way (overrides `extract`) and declares no strict rule reads them so."""
        return self.read_answer(generation, q)

    def grade(self, extracted: str | None, q: Question) -> bool:
        return extracted is not None and extracted == q.answer

    def grade_candidate(self, generation: str, q: Question, finish: str) -> "CandidateGrade":
        """Both grades of one candidate (docs/grading.md). Strict is flexible and more:
        the answer must also be stated in the declared format and graded right there,
        so strict <= flexible holds for every candidate."""
        extracted = self.read_answer(generation, q)
        flexible = bool(self.grade(extracted, q))
        strict = flexible and bool(self.grade(self.read_answer_strict(generation, q, finish != "length"), q))
        return CandidateGrade(extracted, flexible, strict)

    def options(self, q: Question) -> tuple[str, ...] | None:
        """The answers `read_answer` can give for q when there are finitely many (a
        multiple-choice question's letters), else None: what chance baselines draw from."""
        return None

    def stored(self) -> dict[str, Any]:
        """What a run stores of its task besides the description (records.TASK_FILE): the
        questions as asked and graded, so a reader never reads or renders the task's
        files again (`tasks.reload_task`)."""
        return {"questions": [dataclasses.asdict(q) for q in self.questions]}

    def run_description(self) -> dict[str, Any]:
        """`describe()` for a run config, with `stored()` under "stored" (`RunDir.create`
        writes it to the run's TASK_FILE, outside the hashed config)."""
        return {**self.describe(), "stored": self.stored()}

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "answer_kind": self.answer_kind,
            "answer_format": self.answer_format,
            "instruction": self.instruction,
            "max_new_tokens": self.max_new_tokens,
            "stop_strings": list(self.stop_strings),
            "source": self.source,
            "n_questions": len(self.questions),
            "questions_hash": self.content_hash(),
            **({"skipped_rows": list(self.skipped_rows)} if self.skipped_rows else {}),
            **({"anchored": self.anchored} if self.anchored else {}),
        }


class MultipleChoiceTask(Task):
    """Options are lettered A, B, ...; the gold answer is a letter, `gold_index` its
    position. (A subclass may grade option words instead, e.g. BoolQ's "yes"/"no";
    `gold_index` always names the gold option in `choices`.)"""

    answer_format = "letter of the chosen option"
    instruction = "Answer with the letter of the correct option, e.g. 'Answer: A'."
    max_new_tokens = 32

    answer_kind = "letter"

    def extract(self, generation: str) -> str | None:
        return extract_letter(generation)

    def options(self, q: Question) -> tuple[str, ...] | None:
        return tuple(LETTERS[: len(q.choices or ())])

    def read_answer(self, generation: str, q: Question) -> str | None:
        if type(self).extract is not MultipleChoiceTask.extract:
            return self.extract(generation)  # a subclass that reads its own kind of answer (BoolQ's words)
        return extract_letter(generation, n_options=len(q.choices or LETTERS))

    def read_answer_strict(self, generation: str, q: Question, finished: bool) -> str | None:
        if type(self).extract is not MultipleChoiceTask.extract:
            return super().read_answer_strict(generation, q, finished)
        return extract_letter_strict(generation, n_options=len(q.choices or LETTERS), finished=finished)

    def recognition_prompt(self, q: Question) -> str:
        """The context before each option's text when options are ranked by
        likelihood (no letters, no instruction)."""
        return "\n\n".join(p for p in (q.context, q.text) if p).strip()
