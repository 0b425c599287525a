"""Options rotated: the circular protocol, the rotation of the permutation control, and
the letter bias.

- The circular protocol (`circular_outcomes`): a deployed answer is right only when it
  is right under every cyclic shift of the options; with it the failure set, the panel
  and every repair are letter-robust (issue 34).
- `rotated_probe`: the records' label of a probe asked with its options rotated
  (`tasks.rotate_options`), as the circular rows and the permutation control
  (`readings.run_permutation_control`) store them.
- `letter_bias` says, by a stated rule, when a cell's failure set is explained by its
  deployed letter distribution.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from rnr_interp.engine.rows import Row
from rnr_interp.records import ProbeLabel
from rnr_interp.tasks.base import MultipleChoiceTask, Question, Task, rotate_options

#: how far the permutation control rotates each question's options: one position, the
#: smallest move that puts every gold option under another letter for any option count
ROTATION = 1


def rotated_probe(probe: str, shift: int = ROTATION) -> str:
    return str(ProbeLabel.rotated(ProbeLabel.parse(probe), shift))


def permutation_applies(task: Task) -> bool:
    """Whether rotating `task`'s options moves what is graded (lettered options only;
    BoolQ grades the words yes/no)."""
    return isinstance(task, MultipleChoiceTask) and task.answer_kind == "letter"


def answer_of(value: Any) -> str | None:
    """A stored `extracted` value as an answer: None for null or NaN."""
    return None if value is None or value != value else str(value)


# -- the circular protocol --------------------------------------------------------------

CIRCULAR_RULE = ("circular: each question asked under every cyclic shift of its options (option i shown at position "
                 "(i + s) mod n for s = 0..n-1, the gold letter moved with its option); the deployed answer is right "
                 "only when it is right under every shift")
#: the answer a deployed generation gave to each question asked, and whether it is graded right
AnswerFn = Callable[[Sequence[Question]], Sequence[tuple["str | None", bool]]]


@dataclass(frozen=True)
class CircularOutcome:
    """One question's deployed answers under shifts 0..n-1 of its options."""

    answers: tuple[str | None, ...]
    right: tuple[bool, ...]

    @property
    def correct(self) -> bool:
        """Right under every shift."""
        return all(self.right)

    @property
    def letter_locked(self) -> bool:
        """The same letter at every shift: the answer ignores the options' contents."""
        return len(self.answers) > 1 and self.answers[0] is not None and len(set(self.answers)) == 1


def shifted(q: Question, shift: int) -> Question:
    """q asked with its options rotated by `shift` (q itself for shift 0)."""
    return q if shift == 0 else rotate_options(q, shift)


def option_shifts(q: Question) -> range:
    if q.choices is None:
        raise ValueError(f"question {q.id!r} has no options: the circular protocol needs options to shift")
    return range(len(q.choices))


def circular_outcomes(questions: Sequence[Question], answer: AnswerFn) -> dict[str, CircularOutcome]:
    """The one definition of circular correctness: question id -> its answers under
    every cyclic shift of its options. `answer` receives every (question, shift) as a
    rotated question (`shifted`; `meta["rotated_by"]` says the shift) in one call, and
    returns the deployed answer to each and whether it is graded right (against the
    rotated gold); it may generate, or read stored rows (`answer_from_records`)."""
    asked = [shifted(q, s) for q in questions for s in option_shifts(q)]
    got = list(answer(asked))
    if len(got) != len(asked):
        raise ValueError(f"the answer function returned {len(got)} answers for {len(asked)} questions")
    out, start = {}, 0
    for q in questions:
        n = len(option_shifts(q))
        mine = got[start:start + n]
        start += n
        out[q.id] = CircularOutcome(tuple(answer_of(a) for a, _ in mine), tuple(bool(ok) for _, ok in mine))
    return out


def shift_probe(probe: str, shift: int) -> str:
    """The records' probe label of `probe` asked with options rotated by `shift`."""
    return probe if shift == 0 else rotated_probe(probe, shift)


def circular_rows(rows: Sequence[Row]) -> list[Row]:
    """Each row under every cyclic shift of its question's options, labelled
    ``rotated:SHIFT:PROBE`` (shift 0: the row itself)."""
    return [Row(shifted(r.question, s), r.interventions, shift_probe(r.probe, s)) for r in rows for s in option_shifts(r.question)]


def answer_from_records(records: pd.DataFrame, probe: str) -> AnswerFn:
    """An `AnswerFn` that reads `probe`'s rows (and its ``rotated:SHIFT:`` rows) from
    stored records."""
    # only this probe's rows: a sweep asks this once per block and part, of one records table
    probe_rows = records["probe"].str.fullmatch(rf"(rotated:\d+:)?{re.escape(probe)}")
    mine = records[probe_rows]
    stored = {(qid, p): (a, c) for qid, p, a, c in zip(mine["question_id"], mine["probe"], mine["extracted"], mine["correct"])}

    def answer(asked: Sequence[Question]) -> list[tuple[str | None, bool]]:
        out = []
        for q in asked:
            key = (q.id, shift_probe(probe, int(q.meta.get("rotated_by", 0))))
            if key not in stored:
                raise ValueError(f"no stored row of question {q.id!r} under probe {key[1]!r}")
            extracted, correct = stored[key]
            out.append((extracted, bool(correct)))
        return out

    return answer


def check_circular(task: Task, readout: str) -> None:
    """Refuse the circular protocol where shifting options moves nothing graded, or
    with the letter readout (recognition must not see letters)."""
    if not permutation_applies(task):
        raise ValueError(f"task {task.name!r} grades {task.answer_kind} answers, not option letters: the circular "
                         "protocol shifts lettered options and has nothing to move here")
    if readout == "letter":
        raise ValueError("the circular protocol reads recognition from the option likelihoods (option:mean or "
                         "option:sum); the letter readout ranks letters, which is what it removes")


# -- letter bias -----------------------------------------------------------------------

#: circular: the failure set is explained by the letter distribution when at least this
#: share of the recognised, circularly wrong questions are letter-locked
LETTER_LOCK_SHARE = 0.5
LETTER_RULE_PLAIN = ("explained by the deployed letter distribution when the recognised questions answered wrong are "
                     "at least as many as a content-blind answerer drawing letters from that distribution would get "
                     "wrong among the recognised questions, less 1.96 of its standard deviations")
LETTER_RULE_CIRCULAR = ("explained by the deployed letter distribution when at least "
                        f"{LETTER_LOCK_SHARE:.0%} of the recognised, circularly wrong questions are letter-locked "
                        "(the same letter under every shift: left out of the failure set)")


def letter_bias(recognised: Sequence[Question], correct: Mapping[str, bool], answers: Mapping[str, str | None],
                outcomes: Mapping[str, CircularOutcome] | None = None) -> dict[str, Any]:
    """Whether a cell's failure set is explained by its deployed letter distribution,
    by the stated rule (`LETTER_RULE_PLAIN`, or `LETTER_RULE_CIRCULAR` with the
    circular `outcomes`); `answers`: question id -> deployed answer (unshifted), over
    every question of the cell. `message` is the warning the commands print."""
    dist = Counter(a for a in answers.values())
    total = max(sum(dist.values()), 1)
    top, top_n = max(((a, c) for a, c in dist.items() if a is not None), key=lambda x: x[1], default=(None, 0))
    out: dict[str, Any] = {"letter_distribution": {str(a): c / total for a, c in dist.items()},
                           "modal_answer": top, "modal_share": top_n / total}
    wrong = [q for q in recognised if not correct[q.id]]
    if outcomes is not None:
        locked = sum(outcomes[q.id].letter_locked for q in wrong)
        explained = locked > 0 and locked >= LETTER_LOCK_SHARE * len(wrong)
        out.update({"rule": LETTER_RULE_CIRCULAR, "n_recognised_wrong": len(wrong), "n_letter_locked": locked,
                    "explained": explained})
        reason = f"{locked} of the {len(wrong)} recognised, circularly wrong questions give one letter under every shift"
    else:
        p = [dist.get(q.answer, 0) / total for q in recognised]
        expected = float(sum(1 - x for x in p))
        sd = float(math.sqrt(sum(x * (1 - x) for x in p)))
        explained = len(wrong) > 0 and len(wrong) >= expected - 1.96 * sd
        out.update({"rule": LETTER_RULE_PLAIN, "n_recognised_wrong": len(wrong), "content_blind_expected": expected,
                    "content_blind_sd": sd, "explained": explained})
        reason = (f"{len(wrong)} recognised questions answered wrong vs {expected:.1f} (sd {sd:.1f}) for a content-blind "
                  f"answerer with this letter distribution (modal answer {top!r} {top_n / total:.0%})")
    out["message"] = (f"the failure set is explained by the deployed letter distribution: {reason}"
                      + ("" if outcomes is not None else "; rerun with --circular")) if explained else None
    return out
