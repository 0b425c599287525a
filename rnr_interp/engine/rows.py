"""Rows: one question under one intervention set (a silenced block, a steering vector,
a layer route), decoded greedily with its own set in a shared batch. The one row
runner: the silencing, steering and unit analyses (`run_rows`, into their run folders)
and the routing audit (`analyses.routing.evaluator.RouteEvaluator`) both generate through
`generate_rows`, with the same prefill cache (`PrefillCache`) and replay policy; they
differ only in how they group rows into batches and where the records go."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd
from tqdm.auto import tqdm

from rnr_interp.engine.decoding import Decoding, Generation
from rnr_interp.engine.generate import PromptStates, generate, prompt_states, replay_pays
from rnr_interp.engine.sampling import candidate_row, chunks, prompt_ids
from rnr_interp.interventions import Intervention, first_layer, set_id
from rnr_interp.models import LoadedModel
from rnr_interp.records import DEFAULT_GRADING, RunDir
from rnr_interp.tasks.base import Question, Task


@dataclass(frozen=True)
class Row:
    """One batch row: a question under one intervention set, labelled `probe`."""

    question: Question
    interventions: tuple[Intervention, ...]
    probe: str = ""  # a `ProbeLabel`, as text


class PrefillCache:
    """Each question's full-path prefill (`prompt_states`: keys, values and the residual
    entering every block), kept while rows of that question run, so a row whose first
    p blocks are the full path's replays them instead of recomputing them. Off where it
    does not pay (`generate.replay_pays`: on a GPU each extra forward costs more than
    the arithmetic saved); the generations are the same either way."""

    def __init__(self, lm: LoadedModel, task: Task, enabled: bool | None = None):
        self.lm, self.task = lm, task
        self.enabled = replay_pays(lm) if enabled is None else enabled
        self._states: dict[str, PromptStates] = {}

    def states(self, questions: Sequence[Question]) -> list[PromptStates] | None:
        """The prefills of `questions` (computed for those not yet kept), or None when off."""
        if not self.enabled:
            return None
        missing = list({q.id: q for q in questions if q.id not in self._states}.values())
        if missing:
            fresh = prompt_states(self.lm, [prompt_ids(self.lm, self.task, q) for q in missing])
            self._states.update({q.id: st for q, st in zip(missing, fresh)})
        return [self._states[q.id] for q in questions]

    def keep_only(self, question_ids: Sequence[str]) -> None:
        """Drop the prefills of every other question (they are large)."""
        wanted = set(question_ids)
        self._states = {qid: st for qid, st in self._states.items() if qid in wanted}

    def forget(self, question_ids: Sequence[str]) -> None:
        for qid in question_ids:
            self._states.pop(qid, None)


def generate_rows(lm: LoadedModel, task: Task, rows: Sequence[Row], decoding: Decoding,
                  prefills: PrefillCache | None = None, sparse_slots: bool | None = None) -> list[Generation]:
    """One batched generation of `rows`, each under its own intervention set, each row's
    prefill replaying what `prefills` keeps of its question. Returns one generation per row."""
    questions = [r.question for r in rows]
    gens = generate(lm, [prompt_ids(lm, task, q) for q in questions], n=1, decoding=decoding,
                    interventions=[list(r.interventions) for r in rows], stop_strings=task.stop_strings,
                    reuse=prefills.states(questions) if prefills is not None else None, sparse_slots=sparse_slots)
    return [g[0] for g in gens]


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
