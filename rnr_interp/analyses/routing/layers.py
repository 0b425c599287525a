"""Where a route's gain is: the layers and actions behind the answers routes reach and
the full path does not.

A route takes an *action* at a layer when it skips the layer (runs it zero times) or
repeats it (runs it more than once). Per space, layer and action, the *gain* is the
share of questions whose full path (greedy, deployed) is wrong and some correct route
candidate of that space (any method's) takes that action there. A planted damaging
layer L shows as the skip of L: every correct candidate skips it. Its *chance null* is
the same share with the candidates graded against another question's gold
(`grading.derangements`, the routes' null elsewhere): what the candidates that happen
to take the action reach by coincidence. `above_chance` reads the paired bootstrap of
gain - null over questions (`config.above_chance`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import pandas as pd
from jaxtyping import Bool, Float

from rnr_interp.grading import N_DERANGEMENTS, derangements, graded_answers
from rnr_interp.analyses.routing.config import above_chance
from rnr_interp.metrics import bootstrap_ci, wilson_interval
from rnr_interp.records import DEPLOYED
from rnr_interp.tasks.base import Task

#: what a route does to a layer (rows of `layer_actions`)
LAYER_ACTIONS = ("skip", "repeat")
#: correct routes per question and space in the `route_questions` table
BEST_ROUTES = 3

Actions = Bool[np.ndarray, "action layer"]


def layer_actions(route: Sequence[int], n_layers: int) -> Actions:
    """(actions, layers): row 0 the layers `route` skips, row 1 those it runs twice or more."""
    counts = np.bincount(np.asarray(route, dtype=int), minlength=n_layers)[:n_layers]
    return np.stack([counts == 0, counts > 1])


def route_of(intervention: str) -> tuple[int, ...]:
    """The route in a route record's intervention id ("route:0-1-1-2", `Route.label`)."""
    return tuple(int(i) for i in intervention.removeprefix("route:").split("-"))


def _space_rows(records: pd.DataFrame, space: str) -> pd.DataFrame:
    return records[records["probe"].astype(str).str.startswith(f"{space}:")]


def route_layers(records: pd.DataFrame, spaces: Sequence[str], n_layers: int, qids: Sequence[str], task: Task | None,
                 grading: str, seed: int = 0) -> pd.DataFrame:
    """The `route_layers` table: per space, layer and action, `gain` with its Wilson
    interval (`gain_ci_low`, `gain_ci_high`), `null_gain` (NaN without the task's golds)
    and `above_chance`. `records` are graded the headline way (`correct`)."""
    deployed = records[records["probe"] == DEPLOYED].set_index("question_id")
    full_wrong = ~deployed.loc[list(qids), "correct"].astype(bool).to_numpy()
    null_fp = None
    if task is not None and len(qids) >= 2:
        by_id = {q.id: q for q in task.questions}
        fp_rows = deployed.loc[list(qids)].reset_index()
        null_fp = (graded_answers(fp_rows, task, grading), [by_id[q] for q in qids])
    rows: list[dict[str, Any]] = []
    for space in spaces:
        cands = _space_rows(records, space)
        gains, actions_by_answer = _question_gains(cands, qids, n_layers, full_wrong, task, grading)
        null = _null_gains(actions_by_answer, null_fp, task, n_layers, seed) if null_fp is not None else None
        n = len(qids)
        lo = (np.asarray(bootstrap_ci((gains - null).reshape(n, -1), seed=seed)[0]).reshape(gains.shape[1:])
              if null is not None else np.full(gains.shape[1:], np.nan))
        for a, action in enumerate(LAYER_ACTIONS):
            for layer in range(n_layers):
                hits = int(gains[:, a, layer].sum())
                ci = wilson_interval(hits, n)
                rows.append({"space": space, "layer": layer, "action": action, "gain": hits / n,
                             "gain_ci_low": ci[0], "gain_ci_high": ci[1],
                             "null_gain": float(null[:, a, layer].mean()) if null is not None else np.nan,
                             "above_chance": bool(null is not None and above_chance(float(lo[a, layer])))})
    return pd.DataFrame(rows, columns=["space", "layer", "action", "gain", "gain_ci_low", "gain_ci_high", "null_gain",
                                       "above_chance"])


def _question_gains(cands: pd.DataFrame, qids: Sequence[str], n_layers: int, full_wrong: np.ndarray, task: Task | None,
                    grading: str) -> tuple[Bool[np.ndarray, "question action layer"], list[dict[Any, Actions]]]:
    """Per question, the actions its correct candidates take where its full path is
    wrong; and per question, answer (as `grading` reads it) -> the actions of the
    candidates giving it (for the null; empty without the task)."""
    gains = np.zeros((len(qids), len(LAYER_ACTIONS), n_layers), dtype=bool)
    by_answer: list[dict[Any, Actions]] = []
    groups = dict(tuple(cands.groupby("question_id", sort=False)))
    for i, qid in enumerate(qids):
        g = groups.get(qid)
        answers: dict[Any, Actions] = {}
        if g is not None:
            acts = [layer_actions(route_of(r), n_layers) for r in g["intervention"]]
            if full_wrong[i]:
                for act, ok in zip(acts, g["correct"].astype(bool)):
                    if ok:
                        gains[i] |= act
            if task is not None:
                for act, answer in zip(acts, graded_answers(g, task, grading)):
                    if answer is not None:
                        answers[answer] = answers[answer] | act if answer in answers else act
        by_answer.append(answers)
    return gains, by_answer


def _null_gains(by_answer: list[dict[Any, Actions]], full_path: tuple[list[Any], list[Any]], task: Task, n_layers: int,
                seed: int) -> Float[np.ndarray, "question action layer"]:
    """Per question, the gain's indicator with every candidate graded against the gold
    of the question a derangement maps it to, averaged over `N_DERANGEMENTS`."""
    fp_answers, questions = full_path
    n = len(questions)
    out = np.zeros((n, len(LAYER_ACTIONS), n_layers))
    cache: dict[tuple[Any, int, int], bool] = {}

    def right(answer: Any, i: int, j: int) -> bool:
        key = (answer, i, j)
        if key not in cache:
            q = dataclasses.replace(questions[i], answer=questions[j].answer, gold_index=questions[j].gold_index)
            cache[key] = answer is not None and bool(task.grade(answer, q))
        return cache[key]

    perms = derangements(n, N_DERANGEMENTS, seed)
    for perm in perms:
        for i, j in enumerate(perm):
            if right(fp_answers[i], i, int(j)):
                continue  # the full path is right against this gold: no gain to attribute
            hit = np.zeros((len(LAYER_ACTIONS), n_layers), dtype=bool)
            for answer, act in by_answer[i].items():
                if right(answer, i, int(j)):
                    hit |= act
            out[i] += hit
    return out / len(perms)


def best_routes(records: pd.DataFrame, spaces: Sequence[str], n_layers: int, qids: Sequence[str],
                per_question: int = BEST_ROUTES) -> pd.DataFrame:
    """The `route_questions` table: per question whose full path is wrong and space, up
    to `per_question` distinct correct routes, fewest edits first (layers not run exactly
    once), then found by more methods: question_id, space, route, edits, skips and
    repeats (layer lists as text), methods."""
    deployed = records[records["probe"] == DEPLOYED].set_index("question_id")["correct"].astype(bool)
    rows: list[dict[str, Any]] = []
    for space in spaces:
        hits = _space_rows(records, space)
        hits = hits[hits["correct"].astype(bool) & hits["question_id"].isin([q for q in qids if not deployed.get(q, True)])]
        for (qid, route), g in hits.groupby(["question_id", "intervention"], sort=False):
            acts = layer_actions(route_of(route), n_layers)
            counts = np.bincount(np.asarray(route_of(route)), minlength=n_layers)
            methods = sorted({str(p).split(":", 1)[1] for p in g["probe"]})
            rows.append({"question_id": qid, "space": space, "route": route, "edits": int((counts != 1).sum()),
                         "skips": " ".join(map(str, np.flatnonzero(acts[0]))),
                         "repeats": " ".join(map(str, np.flatnonzero(acts[1]))), "methods": ", ".join(methods)})
    columns = ["question_id", "space", "route", "edits", "skips", "repeats", "methods"]
    table = pd.DataFrame(rows, columns=columns)
    if table.empty:
        return table
    table = table.assign(n_methods=table["methods"].str.count(",") + 1)
    table = table.sort_values(["question_id", "space", "edits", "n_methods"], ascending=[True, True, True, False], kind="stable")
    return table.groupby(["question_id", "space"], sort=False).head(per_question)[columns].reset_index(drop=True)
