"""The cohort the localisation analyses (repair, steering and units) share.

- The cohort: the failure set (recognised but answered wrong) and the healthy panel
  (every question answered right, up to `PANEL_CAP`), from recognition and the deployed
  baseline (`build_cohort`), each split by `Split` into a selection part (chooses the
  block, v, the units) and a held-out part (scores them); with the circular protocol
  (`circular.py`) right means right under every shift of the options.
- `CohortRun` (`open_cohort`): the cohort with the model, task, run folder and
  decoding its rows are asked with (`engine.rows.run_rows`), built once per run and
  handed down whole; it reads them (`readings.py`) and runs the permutation control.
- The checks every localisation run makes of its settings, and its run config
  (`sampling.run_config`, like every other analysis's).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from rnr_interp.analyses.localise.circular import (
    CIRCULAR_RULE, CircularOutcome, answer_from_records, answer_of, check_circular, circular_outcomes, circular_rows,
    letter_bias,
)
from rnr_interp.analyses.localise.defaults import PANEL_CAP
from rnr_interp.analyses.localise.positions import reading_contexts
from rnr_interp.analyses.localise.readings import multiple_choice_readings, run_permutation_control
from rnr_interp.analyses.localise.recognition import READOUTS, gold_first, recognition_choices, recognize
from rnr_interp.engine.decoding import Decoding
from rnr_interp.engine.rows import Row, run_rows
from rnr_interp.engine.sampling import run_config
from rnr_interp.interventions import Intervention
from rnr_interp.models import LoadedModel
from rnr_interp.records import DEPLOYED, RunDir, stable_key
from rnr_interp.tasks.base import MultipleChoiceTask, Question, Task

# -- failure set and healthy panel ---------------------------------------------------



#: meta keys that name a question's subset (an MMLU subject, a jsonl file's extra
#: "subset" column); the split is stratified by the first one a task's questions carry
SUBSET_KEYS = ("subset", "subject")


def subset_key(questions: Sequence[Question]) -> str | None:
    """The meta key naming the questions' subsets, or None when they carry none."""
    return next((key for key in SUBSET_KEYS if any(key in q.meta for q in questions)), None)


@dataclass(frozen=True)
class Split:
    """Which questions choose (the block, v, the units) and which score. Stratified and
    seeded: each set is sorted by stratum (the gold option's position, then the task
    subset where questions carry one) and within a stratum by a seeded hash of the
    question id, and positions alternate between selection and held out (position i
    goes to selection when ceil((i + 1) f) > ceil(i f), f = `fraction`), so every
    stratum is split f : 1 - f up to one question and ceil(f n) questions choose. The
    failure set and the panel are split alike, so every reported rate of a chosen block
    is measured on questions that did not choose it, and neither half can hold all the
    questions whose gold is one letter."""

    seed: int = 0
    fraction: float = 0.5

    def __post_init__(self):
        if not 0 < self.fraction < 1:
            raise ValueError(f"the selection fraction must be in (0, 1), got {self.fraction}")

    def __call__(self, questions: Sequence[Question]) -> tuple[list[Question], list[Question]]:
        subset = subset_key(questions)

        def stratum(q: Question) -> tuple[int, str]:
            return (-1 if q.gold_index is None else q.gold_index, "" if subset is None else str(q.meta.get(subset, "")))

        order = sorted(questions, key=lambda q: (stratum(q), stable_key(self.seed, q.id, "split")))
        f = self.fraction
        chosen = {q.id for i, q in enumerate(order) if math.ceil((i + 1) * f) > math.ceil(i * f)}
        return [q for q in questions if q.id in chosen], [q for q in questions if q.id not in chosen]

    def stratified_by(self, questions: Sequence[Question]) -> list[str]:
        """What the split of `questions` was stratified by, in words."""
        subset = subset_key(questions)
        return ["gold option"] + ([f"task subset (meta {subset!r})"] if subset is not None else [])

    def describe(self) -> str:
        return (f"failure set and panel each stratified by gold option (and task subset where questions carry one), "
                f"ordered within a stratum by a hash of (seed {self.seed}, question id), positions alternating so "
                f"{self.fraction:g} of each stratum (rounded per stratum) choose and the rest are held out and scored")


@dataclass
class Cohort:
    """The failure set and the healthy panel, with the criteria that made them, each
    split into a selection part and a held-out part. `circular`: generation was read
    under the circular protocol (`circular_outcomes`), and every analysis of the cohort
    reads its own rows the same way."""

    failure: list[Question]
    panel: list[Question]
    failure_criterion: str
    panel_criterion: str
    n_questions: int
    n_recognised: int
    n_deployed_correct: int
    split: Split = field(default_factory=Split)
    circular: bool = False
    n_letter_locked: int = 0
    letter_bias: dict[str, Any] | None = None

    def parts(self, which: str) -> tuple[list[Question], list[Question]]:
        """(selection, held-out) of "failure" or "panel"."""
        return self.split(self.failure if which == "failure" else self.panel)

    def failure_json(self) -> dict[str, Any]:
        return self._json(self.failure, self.failure_criterion, "failure")

    def panel_json(self) -> dict[str, Any]:
        return self._json(self.panel, self.panel_criterion, "panel")

    def _json(self, questions: Sequence[Question], criterion: str, which: str) -> dict[str, Any]:
        selection, heldout = self.parts(which)
        return {"question_ids": [q.id for q in questions], "criterion": criterion,
                "selection_ids": [q.id for q in selection], "heldout_ids": [q.id for q in heldout],
                "split": {**asdict(self.split), "method": self.split.describe(),
                          "stratified_by": self.split.stratified_by(questions)},
                "circular": self.circular, "n_letter_locked": self.n_letter_locked, "letter_bias": self.letter_bias}

    def why_empty(self) -> str | None:
        """A one-line reason when the failure set is empty, else None."""
        if self.failure:
            return None
        if self.n_recognised == 0:
            return f"recognition ranks the gold option first on none of the {self.n_questions} questions"
        if self.n_deployed_correct == self.n_questions:
            return "the deployed generation is right on every question"
        if self.n_letter_locked:
            return (f"every recognised question answered wrong under some shift gives one letter under every shift "
                    f"({self.n_letter_locked} letter-locked): its failure is the letter bias, not the content")
        return (f"every one of the {self.n_recognised} recognised questions is already answered right "
                f"by the deployed generation")


def select_cohort(
    questions: Sequence[Question], recognition: Sequence[dict[str, Any]], deployed: pd.DataFrame,
    readout: str = "option:mean", panel: int | None = PANEL_CAP, split: Split = Split(),
    circular: Mapping[str, CircularOutcome] | None = None,
) -> Cohort:
    """Failure set = gold first under `readout` and deployed wrong; panel = deployed
    right (every one up to the first `panel` in task order; all when None). With the
    `circular` outcomes (`circular_outcomes`), right means right under every shift, and
    letter-locked questions (one letter under every shift) stay out of the failure set:
    their failure is the letter bias, which a localisation would only encode."""
    recognised = gold_first(recognition, readout)
    plain = dict(zip(deployed["question_id"], deployed["correct"].astype(bool)))
    correct = plain if circular is None else {q.id: circular[q.id].correct for q in questions}
    locked = set() if circular is None else {q.id for q in questions if circular[q.id].letter_locked}
    wrong_recognised = [q for q in questions if q.id in recognised and not correct[q.id]]
    failure = [q for q in wrong_recognised if q.id not in locked]
    healthy = [q for q in questions if correct[q.id]]
    chosen = healthy if panel is None else healthy[:panel]
    cap = "" if panel is None else f"; cap {panel}, " + (
        f"the first {panel} of {len(healthy)} in task order" if len(healthy) > panel else f"all {len(healthy)} taken")
    generation = "the greedy deployed generation" + (" (circular: under every cyclic shift of the options)" if circular else "")
    # a hand-built table without answers has no letter distribution to read
    answers = dict(zip(deployed["question_id"], deployed["extracted"])) if "extracted" in deployed.columns else {}
    return Cohort(
        failure=failure, panel=chosen,
        failure_criterion=f"recognition readout {readout!r} ranks the gold option first and {generation} is graded wrong"
                          + ("; letter-locked questions (one letter under every shift) left out" if circular else ""),
        panel_criterion=f"{generation} is graded right{cap}",
        n_questions=len(questions), n_recognised=len(recognised & {q.id for q in questions}),
        n_deployed_correct=sum(correct[q.id] for q in questions), split=split, circular=circular is not None,
        n_letter_locked=sum(q.id in locked for q in wrong_recognised),
        # free-form answers have no letters to be biased toward (and nearly every number is rare)
        letter_bias=letter_bias([q for q in questions if q.id in recognised], correct,
                                {q.id: answer_of(answers.get(q.id)) for q in questions}, circular)
        if all(q.choices is not None for q in questions) else None,
    )


def build_cohort(
    lm: LoadedModel, task: Task, run: RunDir, *, readout: str = "option:mean",
    panel: int | None = PANEL_CAP, split: Split = Split(), decoding: Decoding, batch_size: int = 32,
    progress: bool = False, circular: bool = False,
) -> Cohort:
    """Recognition + deployed baseline for every question of `task` (with `circular`,
    under every cyclic shift of its options), the cohort from them; writes the
    `recognition` table, deployed records and the two id lists."""
    check_cohort_options(task, readout, panel, batch_size)
    if circular:
        check_circular(task, readout)
    try:  # a resumed run (same config, so same questions) does not recompute recognition
        recognition = run.read_table("recognition").to_dict("records")
    except FileNotFoundError:
        # only the readout's variant: the letter one re-reads the whole deployed prompt per option
        recognition = recognize(lm, task, task.questions, batch_size=max(1, batch_size // 2),
                                variants=(readout.partition(":")[0],))
        run.write_table("recognition", pd.DataFrame(recognition))
    rows = [Row(q, (), DEPLOYED) for q in task.questions]
    records = run_rows(lm, task, circular_rows(rows) if circular else rows, decoding, run,
                       batch_size=batch_size, desc="deployed", progress=progress)
    deployed = records[records["probe"] == DEPLOYED]
    outcomes = circular_outcomes(task.questions, answer_from_records(records, DEPLOYED)) if circular else None
    cohort = select_cohort(task.questions, recognition, deployed, readout=readout, panel=panel, split=split,
                           circular=outcomes)
    run.write_table("generation", generation_table(task.questions, deployed, outcomes))
    run.write_json("failure_set", cohort.failure_json())
    run.write_json("healthy_panel", cohort.panel_json())
    return cohort


def generation_table(questions: Sequence[Question], deployed: pd.DataFrame,
                     outcomes: Mapping[str, CircularOutcome] | None) -> pd.DataFrame:
    """Per question, what the cohort read generation as: the deployed answer, whether
    it is right under the run's protocol (`correct`: under every shift when circular),
    and, when circular, the answers under each shift and whether they are letter-locked."""
    plain = dict(zip(deployed["question_id"], zip(deployed["extracted"], deployed["correct"])))
    rows = []
    for q in questions:
        answer, right = plain[q.id]
        row = {"question_id": q.id, "answer": answer_of(answer), "gold": q.answer, "right_unshifted": bool(right)}
        if outcomes is None:
            row["correct"] = bool(right)
        else:
            o = outcomes[q.id]
            row.update({"correct": o.correct, "answers_by_shift": [str(a) for a in o.answers],
                        "letter_locked": o.letter_locked})
        rows.append(row)
    return pd.DataFrame(rows)


def cohort_summary(cohort: Cohort, recognition: pd.DataFrame | None = None) -> dict[str, Any]:
    f_sel, f_out = cohort.parts("failure")
    p_sel, p_out = cohort.parts("panel")
    out = {
        "n_questions": cohort.n_questions,
        "n_recognised": cohort.n_recognised,
        "deployed_accuracy": cohort.n_deployed_correct / max(cohort.n_questions, 1),
        "n_failure": len(cohort.failure),
        "n_panel": len(cohort.panel),
        "failure_criterion": cohort.failure_criterion,
        "panel_criterion": cohort.panel_criterion,
        "split": {"method": cohort.split.describe(), **asdict(cohort.split),
                  "stratified_by": cohort.split.stratified_by([*cohort.failure, *cohort.panel]),
                  "n_failure_selection": len(f_sel), "n_failure_heldout": len(f_out),
                  "n_panel_selection": len(p_sel), "n_panel_heldout": len(p_out)},
        "failure_empty_reason": cohort.why_empty(),
        "circular": {"on": cohort.circular, "rule": CIRCULAR_RULE if cohort.circular else None,
                     "n_letter_locked": cohort.n_letter_locked},
        "letter_bias": cohort.letter_bias,
    }
    if recognition is not None and len(recognition):
        out["recognition_accuracy"] = recognition.groupby("readout")["gold_first"].mean().astype(float).to_dict()
    return out


@dataclass(frozen=True)
class CohortRun:
    """One localisation run's cohort with everything its rows are asked with, built once
    per run (`open_cohort`; steering and units may read it back from a repair run) and
    handed down whole, so the sweep, the steering, the units and the controls are never
    handed the task, the model or the decoding apart from the cohort they belong to."""

    lm: LoadedModel
    task: Task
    run: RunDir
    cohort: Cohort
    decoding: Decoding
    batch_size: int = 32
    progress: bool = False
    #: the run whose records hold the cohort's deployed answers, when it was read back
    #: from another (a repair run's); None: this run's own
    deployed_from: RunDir | None = None

    def summary(self, kind: str, recognition: pd.DataFrame | None = None, **fields: Any) -> dict[str, Any]:
        """What every localisation summary opens with: kind, model, task, `fields`, the cohort."""
        return {"kind": kind, "model": self.lm.spec, "task": self.task.name, **fields,
                **cohort_summary(self.cohort, recognition)}

    def deployed_replies(self) -> dict[str, str]:
        """Each question's deployed reply (its text, by question id), from where the
        cohort's deployed answers are (`deployed_from`, else this run)."""
        return self._deployed("text")

    def deployed_answers(self, questions: Sequence[Question]) -> set[str]:
        """The answers the deployed generation gave to `questions` (those that parse)."""
        answers = self._deployed("extracted")
        return {a for q in questions if (a := answer_of(answers.get(q.id))) is not None}

    def reading_contexts(self, questions: Sequence[Question], read_at: str) -> dict[str, list[int]] | None:
        """Each question's reading context by id (`positions.reading_contexts`) from the
        cohort's deployed replies; None at the prompt's end (`directions.read_ids` then
        reads the prompts)."""
        if read_at == "prompt":
            return None
        return dict(zip([q.id for q in questions],
                        reading_contexts(self.lm, self.task, questions, self.deployed_replies(), read_at)))

    def _deployed(self, column: str) -> dict[str, Any]:
        records = (self.deployed_from or self.run).read_records(filters=[("probe", "=", DEPLOYED)])
        return dict(zip(records["question_id"], records[column]))

    def readings(self, probes: Sequence[str] = ()) -> dict[str, Any]:
        """`multiple_choice_readings` of the run's records, the deployed rows from where
        the cohort was read (`deployed_from`)."""
        records = self.run.read_records()
        if self.deployed_from is not None:
            deployed = self.deployed_from.read_records(filters=[("probe", "=", DEPLOYED)])
            mine = records[records["probe"] != DEPLOYED]
            records = deployed if mine.empty else pd.concat([deployed, mine], ignore_index=True)
        return multiple_choice_readings(self.task, records, self.cohort.failure, probes, grading=self.run.grading)

    def permutation_control(self, probes: dict[str, tuple[Intervention, ...]]) -> dict[str, Any]:
        """`run_permutation_control` of `probes` on the held-out failures."""
        return run_permutation_control(self.lm, self.task, self.cohort.parts("failure")[1], probes, self.run,
                                       decoding=self.decoding, batch_size=self.batch_size, progress=self.progress)


def open_cohort(lm: LoadedModel, task: Task, run: RunDir, *, decoding: Decoding, batch_size: int = 32,
                progress: bool = False, **settings: Any) -> CohortRun:
    """The run's cohort (`build_cohort` with `settings`: readout, panel, split,
    circular) and what its rows are asked with."""
    cohort = build_cohort(lm, task, run, decoding=decoding, batch_size=batch_size, progress=progress, **settings)
    return CohortRun(lm, task, run, cohort, decoding, batch_size, progress)


# -- settings and configs ------------------------------------------------------------


def check_cohort_options(task: Task, readout: str, panel: int | None, batch_size: int) -> None:
    """Refuse what no cohort can be built from: an unknown readout, one that does not
    fit the task (free-form answers are ranked by the answer readout, options by the
    others), a panel or batch below 1."""
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
    if (readout == "answer") == isinstance(task, MultipleChoiceTask):
        raise ValueError(f"task {task.name!r} is multiple choice: rank its options (readout option:mean, option:sum or letter)"
                         if readout == "answer" else f"task {task.name!r} is not multiple choice: readout {readout!r} "
                         "ranks options; free-form answers are ranked against their distractors by readout 'answer'")
    if readout == "answer":
        for q in task.questions:  # every question needs distractors before anything is written
            recognition_choices(task, q)
    if readout.startswith("lm-eval:") and not hasattr(task, "loglikelihood_requests"):
        raise ValueError(f"readout {readout!r} reads lm-eval's requests: only for lm-eval tasks (--task lm-eval:NAME), not {task.name!r}")
    if panel is not None and panel < 1:
        raise ValueError(f"panel must be >= 1 question, got {panel}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def check_localisation_options(lm: LoadedModel, *, layer: int | None = None, layers: Sequence[int] = (),
                               alphas: Sequence[float] = (), ks: Sequence[int] = (), **_: Any) -> None:
    """Refuse blocks the model does not have, non-finite steering strengths and unit
    counts below 1 (a negative layer would silently index from the end)."""
    last = lm.n_layers - 1
    for name, value in [("layer", layer), *(("layers", l) for l in layers)]:
        if value is not None and not 0 <= value <= last:
            raise ValueError(f"{name} must name layers 0..{last} of {lm.spec}, got {value}")
    if not all(np.isfinite(a) for a in alphas):
        raise ValueError(f"alphas must be finite numbers, got {list(alphas)}")
    if any(k < 1 for k in ks):
        raise ValueError(f"ks must be unit counts >= 1, got {list(ks)}")


def localisation_config(kind: str, lm: LoadedModel, task: Task, decoding: Decoding, readout: str,
                        panel: int | None, batch_size: int, split: Split = Split(), circular: bool = False,
                        grading: str | None = None, **extra: Any) -> dict[str, Any]:
    """`run_config` with the settings every localisation run shares (the cohort's),
    after refusing bad settings: every localisation run builds its config before it
    creates its folder. The split is recorded as stratified (its questions change with
    the stratification) and `circular` only when on, so a default run's config keeps
    its other keys. `grading` decides what "right" is for the cohort and every sweep
    (None: the default, strict: a failure of the stated format is a failure; flexible
    reads the answer's content whatever its format, `records.GRADINGS`)."""
    check_cohort_options(task, readout, panel, batch_size)
    if circular:
        check_circular(task, readout)
    check_localisation_options(lm, **extra)
    return run_config(kind, lm, task, grading=grading, deployed=asdict(decoding), readout=readout, panel=panel,
                      split={**asdict(split), "stratified": True}, batch_size=batch_size,
                      **({"circular": True} if circular else {}), **extra)
