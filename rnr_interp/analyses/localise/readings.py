"""Reading a cohort's rows: repair and damage rates of one probe (plainly or under the
circular protocol), how many answers take the failure set's form, the multiple-choice
readings against chance, and the letter-permutation control: the chosen intervention
re-scored on the held-out failures with every question's options rotated
(`tasks.rotate_options`), so a "repair" that only moved a letter bias shows as such
(issue 17)."""

from __future__ import annotations

from typing import Any, Collection, Sequence

import pandas as pd

from rnr_interp.analyses.localise.circular import (
    ROTATION, answer_from_records, answer_of, circular_outcomes, permutation_applies, rotated_probe,
)
from rnr_interp.engine.decoding import Decoding
from rnr_interp.engine.rows import Row, run_rows
from rnr_interp.engine.sampling import chance_summary
from rnr_interp.interventions import Intervention
from rnr_interp.metrics import answer_changes, proportion
from rnr_interp.models import LoadedModel
from rnr_interp.records import DEFAULT_GRADING, DEPLOYED, RunDir
from rnr_interp.tasks.base import Question, Task, rotate_options


def probe_values(records: pd.DataFrame, probe: str, column: str) -> dict[str, Any]:
    """question id -> `column` of one probe's records."""
    mine = records[records["probe"] == probe]
    return dict(zip(mine["question_id"], mine[column]))


def outcome_counts(records: pd.DataFrame, questions: Sequence[Question], probe: str,
                   circular: bool = False) -> tuple[int, int]:
    """(questions answered right, questions) among `questions` in one probe's records;
    with `circular`, right under every cyclic shift (`circular_outcomes` on the probe's
    ``rotated:SHIFT:`` rows)."""
    if circular:
        outcomes = circular_outcomes(questions, answer_from_records(records, probe))
        return sum(o.correct for o in outcomes.values()), len(questions)
    correct = probe_values(records, probe, "correct")
    return sum(bool(correct[q.id]) for q in questions), len(questions)


def as_failure_count(records: pd.DataFrame, questions: Sequence[Question], probe: str,
                     failure_answers: Collection[str]) -> int:
    """How many of `questions` one probe answers wrong with an answer the failure set gave
    (`failure_answers`, its deployed answers): an induction that takes the failure's
    form, not just any wrong answer or no answer at all. Read from the probe's own rows,
    under the options' own order also for a circular cohort (a letter is the failure's
    form only where the options stand as the failure set saw them)."""
    extracted, correct = probe_values(records, probe, "extracted"), probe_values(records, probe, "correct")
    return sum(q.id in correct and not bool(correct[q.id]) and answer_of(extracted[q.id]) in failure_answers
               for q in questions)


def rates(records: pd.DataFrame, failure: Sequence[Question], panel: Sequence[Question], probe: str,
          circular: bool = False) -> tuple[float, float]:
    """(repair rate on the failure set, damage rate on the panel) of one probe's records;
    NaN for an empty set."""
    fixed, n_f = outcome_counts(records, failure, probe, circular)
    right, n_p = outcome_counts(records, panel, probe, circular)
    return (fixed / n_f if n_f else float("nan")), ((n_p - right) / n_p if n_p else float("nan"))


def multiple_choice_readings(task: Task, records: pd.DataFrame, failure: Sequence[Question],
                             probes: Sequence[str] = (), grading: str = DEFAULT_GRADING) -> dict[str, Any]:
    """What a localisation summary adds so a multiple-choice result can be read against
    chance (issue 17): `chance`, the baselines of the deployed greedy answers
    (`sampling.chance_summary` under the run's `grading`; no K, these runs draw no samples), and `answer_changes`,
    for each probe in `probes`, how its answers on the failure set moved from the
    deployed ones (`metrics.answer_changes`: to the gold option, the repairs, or merely
    to another option), counted on the failure questions the probe was asked (steering's
    rescue rows exist on the held-out part only)."""
    out: dict[str, Any] = {}
    deployed = records[records["probe"] == DEPLOYED]
    if (chance := chance_summary(task, deployed, None, grading)) is not None:
        out["chance"] = chance
    if probes:
        before = dict(zip(deployed["question_id"], deployed["extracted"]))
        out["answer_changes"] = {}
        for probe in probes:
            after = probe_values(records, probe, "extracted")
            asked = [q for q in failure if q.id in after]
            out["answer_changes"][probe] = answer_changes(
                [answer_of(before.get(q.id)) for q in asked], [answer_of(after[q.id]) for q in asked],
                [q.answer for q in asked])
    return out


# -- letter-permutation control --------------------------------------------------------

ROTATION_RULE = ("the same held-out failures asked with each question's options rotated by {shift}: option i shown "
                 "at position (i + {shift}) mod n, the gold letter moved with its option, answers graded against "
                 "the rotated gold")
ROTATION_READING = ("a repair that survives rotation follows the option's content; one that does not follows the "
                    "letter position: an intervention that only moved a letter bias (say from A to D) 'repairs' the "
                    "questions whose gold is that letter, and after rotation their gold is another letter, so its "
                    "rotated repairs drop and its repaired questions keep answering the old letter")


def check_permutation_control(task: Task) -> None:
    """Refuse the control where rotating options moves nothing graded."""
    if not permutation_applies(task):
        raise ValueError(f"task {task.name!r} grades {task.answer_kind} answers, not option letters: the permutation "
                         "control rotates lettered options and has nothing to move here")


def run_permutation_control(lm: LoadedModel, task: Task, failure: Sequence[Question], probes: dict[str, tuple[Intervention, ...]],
                        run: RunDir, *, decoding: Decoding, shift: int = ROTATION, batch_size: int = 32,
                        progress: bool = False, level: float = 0.95) -> dict[str, Any]:
    """Each of `probes` (label -> intervention set, already scored unrotated in `run`)
    and the deployed generation, re-asked on `failure` (the held-out failures) with
    options rotated by `shift`; rows stored as ``rotated:SHIFT:LABEL``. Returns
    `permutation_summary`."""
    rotated = [rotate_options(q, shift) for q in failure]
    rows = [Row(q, specs, rotated_probe(probe, shift)) for probe, specs in {DEPLOYED: (), **probes}.items() for q in rotated]
    run_rows(lm, task, rows, decoding, run, batch_size=batch_size, desc="rotated", progress=progress)
    return permutation_summary(run.read_records(), failure, list(probes), shift, level)


def permutation_summary(records: pd.DataFrame, failure: Sequence[Question], probes: Sequence[str],
                        shift: int = ROTATION, level: float = 0.95) -> dict[str, Any]:
    """The control's reading, from records holding each probe unrotated and rotated
    and the rotated deployed rows, on the questions of `failure` (as loaded):

    - `baseline`: rotated, no intervention: right (against the rotated gold) / n;
    - per probe, `repair`: rotated and intervened, right / n (Wilson), beside
      `unrotated_repair`, the same probe's repair rate as the sweep measured it;
      `answer_changes`: how the intervention moved the rotated deployed answers (to
      the rotated gold, or to another option); `repairs`: of the questions it repaired
      unrotated, how many answer the rotated gold under rotation (`follow_content`),
      how many the letter that was gold before rotation (`follow_position`), and
      `other` (another letter or none)."""
    rotated = [rotate_options(q, shift) for q in failure]

    def column(probe: str, name: str) -> list[Any]:
        values = probe_values(records, probe, name)
        return [values[q.id] for q in failure]

    def answers(probe: str) -> list[str | None]:
        return [answer_of(a) for a in column(probe, "extracted")]

    n = len(failure)
    base = rotated_probe(DEPLOYED, shift)
    before, rotated_gold = answers(base), [q.answer for q in rotated]
    out: dict[str, Any] = {"shift": shift, "rotation": ROTATION_RULE.format(shift=shift), "reading": ROTATION_READING,
                           "n": n, "baseline": proportion(sum(map(bool, column(base, "correct"))), n, level), "probes": {}}
    for probe in probes:
        mine = rotated_probe(probe, shift)
        after = answers(mine)
        repaired = [i for i, ok in enumerate(column(probe, "correct")) if ok]
        content = sum(after[i] == rotated[i].answer for i in repaired)
        position = sum(after[i] == failure[i].answer != rotated[i].answer for i in repaired)
        out["probes"][probe] = {
            "repair": proportion(sum(map(bool, column(mine, "correct"))), n, level),
            "unrotated_repair": proportion(len(repaired), n, level),
            "answer_changes": answer_changes(before, after, rotated_gold),
            "repairs": {"n": len(repaired), "follow_content": content, "follow_position": position,
                        "other": len(repaired) - content - position},
        }
    return out
