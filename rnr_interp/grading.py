"""Two gradings of every candidate and the chance null every O_K and D is read against.

- Grades (docs/grading.md). `correct_flexible`: the answer kind's reading rule (a marked
  answer, else the kind's fallback: the last number, a letter alone, a short first
  line). `correct_strict`: flexible and, besides, stated in the task's declared format
  (a marker, `\\boxed{}`, the answer alone) and not cut by the token limit. A run's
  headline grading (`RunDir.grading`) picks which of the two its `correct` holds;
  `graded` puts either in `correct`, so every metric reads one column whatever grading.
- Null: what the same candidates reach by coincidence. Free-form answers: each
  question's candidates graded against another question's gold, along seeded
  derangements (no question keeps its own gold), averaged. Multiple choice: guessing
  from the model's own letter distribution (its deployed answers for D, its probe
  samples for O_K), the uniform guess beside it; `--circular` asks under every cyclic
  shift of the options instead (`circular_scores`).
- `null_summary`: the null's D and O_K and `gap_above_null = (O_K - D) - (O_K_null -
  D_null)`, with paired intervals (one seeded bootstrap over questions).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from rnr_interp.metrics import bootstrap_ci, guess_gold_share, question_scores
from rnr_interp.records import DEPLOYED, GRADINGS, ProbeLabel
from rnr_interp.tasks.base import Question, Task, rotate_options

#: derangements averaged for a free-form null
N_DERANGEMENTS = 20
#: a probe's unfinished rate above this draws a warning naming --max-new-tokens
UNFINISHED_WARN = 1 / 3


def other_grading(grading: str) -> str:
    """The grading shown beside the headline one."""
    check_grading(grading)
    return GRADINGS[1 - GRADINGS.index(grading)]


def check_grading(grading: str) -> None:
    if grading not in GRADINGS:
        raise ValueError(f"grading must be one of {', '.join(GRADINGS)}, got {grading!r}")


def graded(records: pd.DataFrame, grading: str) -> pd.DataFrame:
    """The records with `correct` set to the `grading` grade, for any metric to read.
    Strict grades missing (records written before they were recorded) raise: `regrade`
    the records with their task first."""
    check_grading(grading)
    column = records[f"correct_{grading}"]
    if column.isna().any():
        raise ValueError(f"{int(column.isna().sum())} records have no {grading} grade (written before both grades were "
                         "recorded): regrade them from their texts first (`rnr regrade RUN`)")
    return records.assign(correct=column.astype(bool))


def regrade(records: pd.DataFrame, task: Task) -> pd.DataFrame:
    """The records (a copy) with the strict grade read from each candidate's stored text
    where it is missing (records of runs made before both grades were recorded, as
    experiments/runs/gsm8k40's: `rnr regrade` and `rnr route-summary` read them so). Their
    flexible grade stays the one recorded when they were sampled, and strict never
    exceeds it."""
    missing = records["correct_strict"].isna()
    if not missing.any():
        return records
    by_id = {q.id: q for q in task.questions}
    unknown = sorted(set(records.loc[missing, "question_id"]) - set(by_id))
    if unknown:
        raise ValueError(f"records of questions the task does not hold: {unknown[:5]}")
    rows = records.loc[missing]
    strict = [task.grade_candidate(text, by_id[qid], finish).strict
              for text, qid, finish in zip(rows["text"], rows["question_id"], rows["finish"])]
    out = records.copy()
    out.loc[missing, "correct_strict"] = np.asarray(strict, dtype=bool) & rows["correct_flexible"].astype(bool).to_numpy()
    out["correct_strict"] = out["correct_strict"].astype(bool)
    return out


def unfinished_rate(records: pd.DataFrame, probe: str | None = None) -> float:
    """Share of candidates (of `probe`, when given) the token limit stopped; NaN for none."""
    rows = records if probe is None else records[records["probe"] == probe]
    return float((rows["finish"] == "length").mean()) if len(rows) else math.nan


def unfinished_warning(rate: float, probe: str) -> str | None:
    """The warning a summary prints when the token limit stopped many candidates."""
    if not rate > UNFINISHED_WARN:
        return None
    return (f"{rate:.0%} of the {probe} candidates stopped at the token limit: their answers may be cut off "
            f"(strictly they are wrong unless marked before the cut); raise --max-new-tokens")


# -- the free-form null: another question's gold ----------------------------------------


def derangements(n: int, count: int, seed: int = 0) -> np.ndarray:
    """(count, n): `count` seeded uniform random derangements of range(n), permutations
    with no fixed point (rejection sampling: about e tries each). n >= 2."""
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 questions, got {n}")
    rng = np.random.default_rng(seed)
    out = np.empty((count, n), dtype=np.int64)
    for row in range(count):
        while True:
            perm = rng.permutation(n)
            if not (perm == np.arange(n)).any():
                out[row] = perm
                break
    return out


def _answer_reader(task: Task, grading: str):
    """(text, question, finish) -> a key of what grading the text against any gold needs."""
    def read(text: str, q: Question, finish: str) -> tuple[str | None, str | None]:
        flexible = task.read_answer(text, q)
        return flexible, task.read_answer_strict(text, q, finish != "length") if grading == "strict" else flexible
    return read


def derangement_null(records: pd.DataFrame, task: Task, probe: str, grading: str, count: int = N_DERANGEMENTS,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per question (in `question_scores` order): d and o(K) when its candidates are
    graded against the gold of the question a derangement maps it to, averaged over
    `count` seeded derangements. No sample is regenerated."""
    check_grading(grading)
    scores = question_scores(records, probe)
    qids = list(scores.index)
    by_id = {q.id: q for q in task.questions}
    read = _answer_reader(task, grading)
    answers: list[tuple[tuple[Any, Any], list[tuple[Any, Any]]]] = []
    groups = dict(tuple(records[records["probe"].isin([DEPLOYED, probe])].groupby("question_id", sort=False)))
    for qid in qids:
        rows = groups[qid]
        keys = [read(t, by_id[qid], f) for t, f in zip(rows["text"], rows["finish"])]
        dep = [k for k, p in zip(keys, rows["probe"]) if p == DEPLOYED][0]
        answers.append((dep, list(dict.fromkeys(k for k, p in zip(keys, rows["probe"]) if p == probe))))
    cache: dict[tuple[Any, Any, int], bool] = {}

    def right(key: tuple[Any, Any], i: int, gold_q: Question) -> bool:
        hit = cache.get((*key, id(gold_q)))
        if hit is None:
            # graded as question i's answer, against gold_q's gold
            q = dataclasses.replace(by_id[qids[i]], answer=gold_q.answer, gold_index=gold_q.gold_index)
            hit = task.grade(key[0], q) and task.grade(key[1], q)
            cache[(*key, id(gold_q))] = hit
        return hit

    golds = [by_id[qid] for qid in qids]
    d_null, o_null = np.zeros(len(qids)), np.zeros(len(qids))
    for perm in derangements(len(qids), count, seed):
        for i, j in enumerate(perm):
            dep, samples = answers[i]
            d_null[i] += right(dep, i, golds[j])
            o_null[i] += any(right(key, i, golds[j]) for key in samples)
    return d_null / count, o_null / count


# -- the multiple-choice null: guessing ------------------------------------------------


def graded_answers(rows: pd.DataFrame, task: Task, grading: str) -> list[str | None]:
    """Each row's answer as `grading` reads it: the flexible reading, and under strict
    only where the answer is stated in the declared format and not cut off first (None:
    no answer)."""
    check_grading(grading)
    flexible = [a if isinstance(a, str) else None for a in rows["extracted"]]
    if grading == "flexible":
        return flexible
    by_id = {q.id: q for q in task.questions}
    strict = [task.read_answer_strict(text, by_id[qid], finish != "length")
              for text, qid, finish in zip(rows["text"], rows["question_id"], rows["finish"])]
    return [f if f is not None and f == s else None for f, s in zip(flexible, strict)]


def letter_null(records: pd.DataFrame, task: Task, probe: str, k: int, grading: str = "flexible") -> dict[str, np.ndarray]:
    """Per question (`question_id`, in `question_scores` order), what guessing reaches: `uniform` (d =
    1/m, o = 1 - (1 - 1/m)^K) and `model` (d from the model's deployed answers, o from
    its probe samples, each pooled over the questions: `metrics.guess_gold_share` of the
    answers as `grading` reads them (`graded_answers`), so a candidate with no answer
    under the grading is a miss, as it is for O_K itself)."""
    scores = question_scores(records, probe)
    by_id = {q.id: q for q in task.questions}
    options = [task.options(by_id[qid]) for qid in scores.index]
    gold = [by_id[qid].answer for qid in scores.index]
    dep, samples = (graded_answers(records[records["probe"] == p], task, grading) for p in (DEPLOYED, probe))
    m = np.array([len(o) for o in options], dtype=float)
    return {
        "question_id": scores.index,
        "uniform_d": 1 / m, "uniform_o": 1 - (1 - 1 / m) ** k,
        "model_d": guess_gold_share(dep, gold, options),
        "model_o": 1 - (1 - guess_gold_share(samples, gold, options)) ** k,
    }


# -- circular evaluation ------------------------------------------------------------------


def shift_records(records: pd.DataFrame, probe: str, shift: int) -> pd.DataFrame:
    """The deployed and `probe` rows asked under `shift`, under the plain labels (shift 0
    is the question as loaded; other shifts are labelled ``rotated:SHIFT:...``)."""
    if shift == 0:
        return records[records["probe"].isin([DEPLOYED, probe])]
    names = {str(ProbeLabel.rotated(ProbeLabel.deployed(), shift)): DEPLOYED,
             str(ProbeLabel.rotated(ProbeLabel.parse(probe), shift)): probe}
    return records[records["probe"].isin(list(names))].assign(probe=lambda r: r["probe"].map(names))


def rotated_task(task: Task, shift: int) -> Task:
    """`task` with every question's options rotated by `shift` (`rotate_options`)."""
    rotated = copy.copy(task)
    rotated.questions = [rotate_options(q, shift % len(q.choices or (0,))) for q in task.questions]
    return rotated


def circular_scores(records: pd.DataFrame, probe: str, shifts: Sequence[int]) -> pd.DataFrame:
    """Per question, d, o and c/n under circular evaluation: the question asked under
    every cyclic shift of its options (`shift_records`). d = the deployed answer right
    under every shift; o = under every shift some sample right. A model that always
    answers one letter is right under one shift only."""
    per_shift = [question_scores(shift_records(records, probe, shift), probe) for shift in shifts]
    d = np.logical_and.reduce([s["d"].to_numpy() for s in per_shift])
    o = np.logical_and.reduce([s["o"].to_numpy() for s in per_shift])
    first = per_shift[0]
    return pd.DataFrame({"d": d, "o": o, "c": first["c"], "n": first["n"]}, index=first.index)


def circular_null(records: pd.DataFrame, task: Task, probe: str, shifts: Sequence[int], k: int,
                  grading: str) -> tuple[np.ndarray, np.ndarray]:
    """The guessing null of circular evaluation, per question in `circular_scores` order:
    under each shift, guessing from the model's own answers under that shift
    (`letter_null`, `grading`), right under every shift with the product of the shifts'
    chances (each shift guessed independently). A model with one letter habit has a
    circular null of 0; 32 uniform guesses over 4 options still reach about 1."""
    guesses = [letter_null(shift_records(records, probe, shift), rotated_task(task, shift), probe, k, grading)
               for shift in shifts]
    index = guesses[0]["question_id"]
    d, o = pd.Series(1.0, index=index), pd.Series(1.0, index=index)
    for guess in guesses:
        d *= pd.Series(guess["model_d"], index=guess["question_id"]).reindex(index)
        o *= pd.Series(guess["model_o"], index=guess["question_id"]).reindex(index)
    return d.to_numpy(), o.to_numpy()


def circular_shifts(task: Task) -> list[int]:
    """The cyclic shifts circular evaluation asks each question under: 0..m-1 for the
    task's largest option count m (questions with fewer options repeat a shift, which
    changes nothing they grade)."""
    m = max((len(q.choices or ()) for q in task.questions), default=0)
    if m < 2 or task.answer_kind != "letter":
        raise ValueError(f"circular evaluation needs multiple-choice questions graded by letter; task {task.name!r} has none")
    return list(range(m))


# -- reading O_K against the null ---------------------------------------------------------


def null_summary(d: np.ndarray, o: np.ndarray, d_null: np.ndarray, o_null: np.ndarray, method: str,
                 level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """The null's D and O_K beside the observed ones, with one paired bootstrap over
    questions: `O_K_ci` (the null's), `O_K_minus_null` with its interval, and
    `gap_above_null = (O_K - D) - (O_K_null - D_null)` with its interval.
    `indistinguishable`: the interval of O_K - O_K_null covers 0."""
    d, o = np.asarray(d, dtype=float), np.asarray(o, dtype=float)
    cols = np.column_stack([d_null, o_null, o - o_null, (o - d) - (o_null - d_null)])
    lo, hi = bootstrap_ci(cols, level=level, seed=seed)
    above = o - o_null
    return {
        "method": method,
        "D": float(np.mean(d_null)),
        "O_K": float(np.mean(o_null)),
        "D_ci": [float(lo[0]), float(hi[0])],
        "O_K_ci": [float(lo[1]), float(hi[1])],
        "O_K_minus_null": float(above.mean()),
        "O_K_minus_null_ci": [float(lo[2]), float(hi[2])],
        "gap_above_null": float(cols[:, 3].mean()),
        "gap_above_null_ci": [float(lo[3]), float(hi[3])],
        "indistinguishable": bool(lo[2] <= 0 <= hi[2]),
    }


def question_null(records: pd.DataFrame, task: Task | None, probe: str, grading: str, k: int,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray, str] | None:
    """The per-question null (d, o, method) fitting the task's answers: the letter
    distribution for a finite option set, derangements of the golds for free-form
    answers; None without a task or with fewer than 2 questions."""
    if task is None:
        return None
    n_questions = records.loc[records["probe"] == DEPLOYED, "question_id"].nunique()
    by_id = {q.id: q for q in task.questions}
    first = by_id.get(records["question_id"].iloc[0]) if len(records) else None
    if first is not None and task.options(first) is not None:
        guess = letter_null(records, task, probe, k, grading)
        return guess["model_d"], guess["model_o"], "guessing from the model's own answer distribution"
    if n_questions < 2:
        return None
    d_null, o_null = derangement_null(records, task, probe, grading, seed=seed)
    return d_null, o_null, f"the same candidates graded against another question's gold ({N_DERANGEMENTS} derangements)"


def null_line(null: dict[str, Any], k: int | None) -> str:
    """The printed reading of a null: O_K against it, and whether it is told apart."""
    label = f"O_{k}" if k else "O_K"
    lo, hi = null["O_K_minus_null_ci"]
    verdict = ("the reachable set is indistinguishable from chance at this n" if null["indistinguishable"]
               else "above chance" if lo > 0 else "below chance")
    return (f"null ({null['method']}): D {null['D']:.3f}, {label} {null['O_K']:.3f}; {label} - null "
            f"{null['O_K_minus_null']:.3f} [{lo:.3f}, {hi:.3f}]: {verdict}; gap above null "
            f"{null['gap_above_null']:.3f} [{null['gap_above_null_ci'][0]:.3f}, {null['gap_above_null_ci'][1]:.3f}]")


__all__ = [
    "N_DERANGEMENTS", "UNFINISHED_WARN", "check_grading", "circular_null", "circular_scores", "circular_shifts", "derangement_null",
    "derangements", "graded", "graded_answers", "letter_null", "null_line", "null_summary", "other_grading", "question_null",
    "regrade", "rotated_task", "shift_records",
    "unfinished_rate", "unfinished_warning",
]
