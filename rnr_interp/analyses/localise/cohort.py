"""The machinery the localisation analyses (repair, steering and units) share.

- `Row` / `run_rows`: deployed (greedy) generations of (question, intervention set)
  pairs, batched, each pair one record labelled by its `ProbeLabel`; rows already stored
  in the run folder are read back, so an interrupted analysis resumes.
- The cohort: the failure set (recognised but answered wrong) and the healthy panel
  (every question answered right, up to `PANEL_CAP`), from recognition and the deployed
  baseline (`build_cohort`), each split by `Split` into a selection part (chooses the
  block, v, the units) and a held-out part (scores them).
- `CohortRun` (`open_cohort`): the cohort with the model, task, run folder and
  decoding its rows are asked with, built once per run and handed down whole.
- `rates`: repair rate on the failure set and damage rate on the panel of one probe.
- `run_permutation_control`: the chosen intervention re-scored on the held-out failures
  with every question's options rotated (`tasks.rotate_options`), so a "repair" that
  only moved a letter bias shows as such (issue 17).
- The circular protocol (`circular_outcomes`): a deployed answer is right only when it
  is right under every cyclic shift of the options; with it the failure set, the panel
  and every repair are letter-robust (issue 34). `letter_bias` says, by a stated rule,
  when a cell's failure set is explained by its deployed letter distribution.

Run configs come from `sampling.run_config`, like every other analysis's.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from rnr_interp.engine.decoding import Decoding

from rnr_interp.engine.rows import PrefillCache, Row, generate_rows
from rnr_interp.interventions import Intervention, first_layer, set_id
from rnr_interp.metrics import answer_changes, proportion
from rnr_interp.models import LoadedModel
from rnr_interp.analyses.localise.recognition import READOUTS, gold_first, recognition_choices, recognize
from rnr_interp.records import DEFAULT_GRADING, DEPLOYED, ProbeLabel, RunDir, stable_key
from rnr_interp.engine.sampling import candidate_row, chance_summary, chunks, run_config
from rnr_interp.tasks.base import MultipleChoiceTask, Question, Task, rotate_options

# -- generation rows -----------------------------------------------------------------


def run_rows(
    lm: LoadedModel, task: Task, rows: Sequence[Row], decoding: Decoding, run: RunDir | None = None,
    batch_size: int = 32, desc: str = "rows", progress: bool = False, reuse_prefix: bool | None = None,
) -> pd.DataFrame:
    """Records of `rows`: those already stored in `run` are read back, the rest are
    generated in chunks of `batch_size` rows (written per chunk). With `reuse_prefix`,
    a row whose interventions sit in block p or later replays blocks 0..p-1 of its
    prefill from its question's full-path prefill (`prompt_states`, one per question)
    instead of recomputing them: the same generations, and a silencing sweep's prefill
    about half the arithmetic. None (the default): where that pays, the CPU
    (`generate.replay_pays`)."""
    prefills = PrefillCache(lm, task, enabled=reuse_prefix)
    done = run.stored_groups() if run is not None else set()
    todo = [r for r in rows if (r.question.id, r.probe) not in done]
    # Rows of one question are adjacent, so a chunk has little padding and needs few prefills.
    order = {q: i for i, q in enumerate(dict.fromkeys(r.question.id for r in todo))}
    todo.sort(key=lambda r: order[r.question.id])
    common = {"run_id": run.run_id if run is not None else "", "model": lm.spec, "task": task.name, "candidate": 0, "seed": 0}
    grading = run.grading if run is not None else DEFAULT_GRADING  # the one the records' `correct` holds
    produced: list[dict[str, Any]] = []
    for chunk in tqdm(list(chunks(todo, batch_size)), desc=desc, unit="batch", disable=not progress):
        prefills.keep_only([r.question.id for r in chunk])
        # A first layer of 0, or none, leaves a row nothing to replay.
        replay = any(first_layer(r.interventions) for r in chunk)
        gens = generate_rows(lm, task, chunk, decoding, prefills if replay else None)
        recs = [candidate_row(task, r.question, g, grading, **common, probe=r.probe, intervention=set_id(r.interventions))
                for r, g in zip(chunk, gens)]
        if run is not None:
            run.write_question_batch(recs)
        produced.extend(recs)
    wanted = {(r.question.id, r.probe) for r in rows}
    if run is None:
        return pd.DataFrame(produced)
    records = run.read_records()
    keep = [(q, p) in wanted for q, p in zip(records["question_id"], records["probe"])]
    return records[keep].reset_index(drop=True)


# -- failure set and healthy panel ---------------------------------------------------

#: the healthy panel is every deployed-right question up to this many (task order):
#: enough to see damage rates of a few percent (the paper's 0-12%)
PANEL_CAP = 64


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
        out[q.id] = CircularOutcome(tuple(_answer(a) for a, _ in mine), tuple(bool(ok) for _, ok in mine))
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
                                {q.id: _answer(answers.get(q.id)) for q in questions}, circular)
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
        row = {"question_id": q.id, "answer": _answer(answer), "gold": q.answer, "right_unshifted": bool(right)}
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


# -- rates and configs ----------------------------------------------------------------


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
                [_answer(before.get(q.id)) for q in asked], [_answer(after[q.id]) for q in asked],
                [q.answer for q in asked])
    return out


# -- letter-permutation control --------------------------------------------------------

#: how far the permutation control rotates each question's options: one position, the
#: smallest move that puts every gold option under another letter for any option count
ROTATION = 1

ROTATION_RULE = ("the same held-out failures asked with each question's options rotated by {shift}: option i shown "
                 "at position (i + {shift}) mod n, the gold letter moved with its option, answers graded against "
                 "the rotated gold")
ROTATION_READING = ("a repair that survives rotation follows the option's content; one that does not follows the "
                    "letter position: an intervention that only moved a letter bias (say from A to D) 'repairs' the "
                    "questions whose gold is that letter, and after rotation their gold is another letter, so its "
                    "rotated repairs drop and its repaired questions keep answering the old letter")


def rotated_probe(probe: str, shift: int = ROTATION) -> str:
    return str(ProbeLabel.rotated(ProbeLabel.parse(probe), shift))


def permutation_applies(task: Task) -> bool:
    """Whether rotating `task`'s options moves what is graded (lettered options only;
    BoolQ grades the words yes/no)."""
    return isinstance(task, MultipleChoiceTask) and task.answer_kind == "letter"


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
        return [_answer(a) for a in column(probe, "extracted")]

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


def _answer(value: Any) -> str | None:
    """A stored `extracted` value as an answer: None for null or NaN."""
    return None if value is None or value != value else str(value)


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
                        **extra: Any) -> dict[str, Any]:
    """`run_config` with the settings every localisation run shares (the cohort's),
    after refusing bad settings: every localisation run builds its config before it
    creates its folder. The split is recorded as stratified (its questions change with
    the stratification) and `circular` only when on, so a default run's config keeps
    its other keys."""
    check_cohort_options(task, readout, panel, batch_size)
    if circular:
        check_circular(task, readout)
    check_localisation_options(lm, **extra)
    return run_config(kind, lm, task, deployed=asdict(decoding), readout=readout, panel=panel,
                      split={**asdict(split), "stratified": True}, batch_size=batch_size,
                      **({"circular": True} if circular else {}), **extra)
