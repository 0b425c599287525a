"""The machinery the localisation analyses (repair, steering and units) share.

- `Row` / `run_rows`: deployed (greedy) generations of (question, intervention set)
  pairs, batched, each pair one record labelled by its `ProbeLabel`; rows already stored
  in the run folder are read back, so an interrupted analysis resumes.
- The cohort: the failure set (recognised but answered wrong) and the healthy panel
  (every question answered right, up to `PANEL_CAP`), from recognition and the deployed
  baseline (`build_cohort`), each split by `Split` into a selection part (chooses the
  block, v, the units) and a held-out part (scores them).
- `rates`: repair rate on the failure set and damage rate on the panel of one probe.
- `run_permutation_control`: the chosen intervention re-scored on the held-out failures
  with every question's options rotated (`tasks.rotate_options`), so a "repair" that
  only moved a letter bias shows as such (issue 17).

Run configs come from `sampling.run_config`, like every other analysis's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from rnr_interp.generate import Decoding, PromptStates, generate, prompt_states, replay_pays
from rnr_interp.interventions import Intervention, first_layer, set_id
from rnr_interp.metrics import answer_changes, proportion
from rnr_interp.models import LoadedModel
from rnr_interp.recognition import READOUTS, gold_first, recognize
from rnr_interp.records import DEFAULT_GRADING, DEPLOYED, ProbeLabel, RunDir
from rnr_interp.sampling import candidate_row, candidate_seed, chance_summary, chunks, prompt_ids, run_config
from rnr_interp.tasks.base import MultipleChoiceTask, Question, Task, rotate_options

# -- generation rows -----------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One batch row: a question under one intervention set, labelled `probe`."""

    question: Question
    interventions: tuple[Intervention, ...]
    probe: str  # a `ProbeLabel`, as text


def generate_rows(
    lm: LoadedModel, task: Task, rows: Sequence[Row], decoding: Decoding, run_id: str = "",
    states: Mapping[str, PromptStates] | None = None, grading: str = DEFAULT_GRADING,
) -> list[dict[str, Any]]:
    """Greedy generations of `rows` in one batched call, each row under its own set.
    states: question id -> its `prompt_states`, for each row's prefill to replay the
    blocks before the first one its interventions touch. `grading`: the run's, the one
    the records' `correct` holds."""
    gens = generate(
        lm, [prompt_ids(lm, task, r.question) for r in rows], n=1, decoding=decoding,
        interventions=[list(r.interventions) for r in rows], stop_strings=task.stop_strings,
        reuse=[states[r.question.id] for r in rows] if states is not None else None,
    )
    common = {"run_id": run_id, "model": lm.spec, "task": task.name, "candidate": 0, "seed": 0}
    return [
        candidate_row(task, r.question, g[0], grading, **common, probe=r.probe, intervention=set_id(r.interventions))
        for r, g in zip(rows, gens)
    ]


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
    if reuse_prefix is None:
        reuse_prefix = replay_pays(lm)
    done = run.stored_groups() if run is not None else set()
    todo = [r for r in rows if (r.question.id, r.probe) not in done]
    # Rows of one question are adjacent, so a chunk has little padding and needs few states.
    order = {q: i for i, q in enumerate(dict.fromkeys(r.question.id for r in todo))}
    todo.sort(key=lambda r: order[r.question.id])
    run_id = run.run_id if run is not None else ""
    produced: list[dict[str, Any]] = []
    states: dict[str, PromptStates] = {}
    for chunk in tqdm(list(chunks(todo, batch_size)), desc=desc, unit="batch", disable=not progress):
        # A first layer of 0, or none, leaves a row nothing to replay.
        replay = reuse_prefix and any(first_layer(r.interventions) for r in chunk)
        if replay:
            wanted = list({r.question.id: r.question for r in chunk}.values())
            states = {q.id: states[q.id] for q in wanted if q.id in states}
            missing = [q for q in wanted if q.id not in states]
            if missing:
                states.update(zip([q.id for q in missing], prompt_states(lm, [prompt_ids(lm, task, q) for q in missing])))
        recs = generate_rows(lm, task, chunk, decoding, run_id=run_id, states=states if replay else None,
                             grading=run.grading if run is not None else DEFAULT_GRADING)
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


@dataclass(frozen=True)
class Split:
    """Which questions choose (the block, v, the units) and which score. Each set is
    ordered by a seeded hash of its question ids and the first ceil(fraction * n) go to
    selection, the rest are held out; the failure set and the panel are split alike, so
    every reported rate of a chosen block is measured on questions that did not choose
    it."""

    seed: int = 0
    fraction: float = 0.5

    def __post_init__(self):
        if not 0 < self.fraction < 1:
            raise ValueError(f"the selection fraction must be in (0, 1), got {self.fraction}")

    def __call__(self, questions: Sequence[Question]) -> tuple[list[Question], list[Question]]:
        order = sorted(questions, key=lambda q: candidate_seed(self.seed, q.id, 0))
        chosen = {q.id for q in order[:math.ceil(self.fraction * len(order))]}
        return [q for q in questions if q.id in chosen], [q for q in questions if q.id not in chosen]

    def describe(self) -> str:
        return (f"failure set and panel each ordered by a hash of (seed {self.seed}, question id); the first "
                f"{self.fraction:g} of each (rounded up) choose, the rest are held out and scored")


@dataclass
class Cohort:
    """The failure set and the healthy panel, with the criteria that made them, each
    split into a selection part and a held-out part."""

    failure: list[Question]
    panel: list[Question]
    failure_criterion: str
    panel_criterion: str
    n_questions: int
    n_recognised: int
    n_deployed_correct: int
    split: Split = field(default_factory=Split)

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
                "split": {**asdict(self.split), "method": self.split.describe()}}

    def why_empty(self) -> str | None:
        """A one-line reason when the failure set is empty, else None."""
        if self.failure:
            return None
        if self.n_recognised == 0:
            return f"recognition ranks the gold option first on none of the {self.n_questions} questions"
        if self.n_deployed_correct == self.n_questions:
            return "the deployed generation is right on every question"
        return (f"every one of the {self.n_recognised} recognised questions is already answered right "
                f"by the deployed generation")


def select_cohort(
    questions: Sequence[Question], recognition: Sequence[dict[str, Any]], deployed: pd.DataFrame,
    readout: str = "option:mean", panel: int | None = PANEL_CAP, split: Split = Split(),
) -> Cohort:
    """Failure set = gold first under `readout` and deployed wrong; panel = deployed
    right (every one up to the first `panel` in task order; all when None)."""
    recognised = gold_first(recognition, readout)
    correct = dict(zip(deployed["question_id"], deployed["correct"].astype(bool)))
    failure = [q for q in questions if q.id in recognised and not correct[q.id]]
    healthy = [q for q in questions if correct[q.id]]
    chosen = healthy if panel is None else healthy[:panel]
    cap = "" if panel is None else f"; cap {panel}, " + (
        f"the first {panel} of {len(healthy)} in task order" if len(healthy) > panel else f"all {len(healthy)} taken")
    return Cohort(
        failure=failure, panel=chosen,
        failure_criterion=f"recognition readout {readout!r} ranks the gold option first and the greedy deployed generation is graded wrong",
        panel_criterion=f"the greedy deployed generation is graded right{cap}",
        n_questions=len(questions), n_recognised=len(recognised & {q.id for q in questions}),
        n_deployed_correct=sum(correct[q.id] for q in questions), split=split,
    )


def build_cohort(
    lm: LoadedModel, task: MultipleChoiceTask, run: RunDir, *, readout: str = "option:mean",
    panel: int | None = PANEL_CAP, split: Split = Split(), decoding: Decoding, batch_size: int = 32,
    progress: bool = False,
) -> Cohort:
    """Recognition + deployed baseline for every question of `task`, the cohort from
    them; writes the `recognition` table, deployed records and the two id lists."""
    check_cohort_options(task, readout, panel, batch_size)
    try:  # a resumed run (same config, so same questions) does not recompute recognition
        recognition = run.read_table("recognition").to_dict("records")
    except FileNotFoundError:
        # only the readout's variant: the letter one re-reads the whole deployed prompt per option
        recognition = recognize(lm, task, task.questions, batch_size=max(1, batch_size // 2),
                                variants=(readout.partition(":")[0],))
        run.write_table("recognition", pd.DataFrame(recognition))
    deployed = run_rows(lm, task, [Row(q, (), DEPLOYED) for q in task.questions], decoding, run,
                        batch_size=batch_size, desc="deployed", progress=progress)
    cohort = select_cohort(task.questions, recognition, deployed, readout=readout, panel=panel, split=split)
    run.write_json("failure_set", cohort.failure_json())
    run.write_json("healthy_panel", cohort.panel_json())
    return cohort


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
                  "n_failure_selection": len(f_sel), "n_failure_heldout": len(f_out),
                  "n_panel_selection": len(p_sel), "n_panel_heldout": len(p_out)},
        "failure_empty_reason": cohort.why_empty(),
    }
    if recognition is not None and len(recognition):
        out["recognition_accuracy"] = recognition.groupby("readout")["gold_first"].mean().astype(float).to_dict()
    return out


# -- rates and configs ----------------------------------------------------------------


def probe_values(records: pd.DataFrame, probe: str, column: str) -> dict[str, Any]:
    """question id -> `column` of one probe's records."""
    mine = records[records["probe"] == probe]
    return dict(zip(mine["question_id"], mine[column]))


def outcome_counts(records: pd.DataFrame, questions: Sequence[Question], probe: str) -> tuple[int, int]:
    """(questions answered right, questions) among `questions` in one probe's records."""
    correct = probe_values(records, probe, "correct")
    return sum(bool(correct[q.id]) for q in questions), len(questions)


def rates(records: pd.DataFrame, failure: Sequence[Question], panel: Sequence[Question], probe: str) -> tuple[float, float]:
    """(repair rate on the failure set, damage rate on the panel) of one probe's records;
    NaN for an empty set."""
    fixed, n_f = outcome_counts(records, failure, probe)
    right, n_p = outcome_counts(records, panel, probe)
    return (fixed / n_f if n_f else float("nan")), ((n_p - right) / n_p if n_p else float("nan"))

def multiple_choice_readings(task: Task, records: pd.DataFrame, failure: Sequence[Question],
                             probes: Sequence[str] = ()) -> dict[str, Any]:
    """What a localisation summary adds so a multiple-choice result can be read against
    chance (issue 17): `chance`, the baselines of the deployed greedy answers
    (`sampling.chance_summary`; no K, these runs draw no samples), and `answer_changes`,
    for each probe in `probes`, how its answers on the failure set moved from the
    deployed ones (`metrics.answer_changes`: to the gold option, the repairs, or merely
    to another option), counted on the failure questions the probe was asked (steering's
    rescue rows exist on the held-out part only)."""
    out: dict[str, Any] = {}
    deployed = records[records["probe"] == DEPLOYED]
    if (chance := chance_summary(task, deployed, None)) is not None:
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
    """Refuse what no cohort can be built from: a task without options, an unknown
    readout, a panel or batch below 1."""
    if not isinstance(task, MultipleChoiceTask):
        raise ValueError(f"task {task.name!r} is not multiple choice: failure localisation needs options to rank")
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
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
                        panel: int | None, batch_size: int, split: Split = Split(), **extra: Any) -> dict[str, Any]:
    """`run_config` with the settings every localisation run shares (the cohort's),
    after refusing bad settings: every localisation run builds its config before it
    creates its folder."""
    check_cohort_options(task, readout, panel, batch_size)
    check_localisation_options(lm, **extra)
    return run_config(kind, lm, task, deployed=asdict(decoding), readout=readout, panel=panel,
                      split=asdict(split), batch_size=batch_size, **extra)
