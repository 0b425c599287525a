"""Rows: one question under one intervention set (a silenced block, a steering vector,
a layer route), decoded greedily with its own set in a shared batch. The one row
runner: the silencing, steering and unit analyses (`analyses.localise.cohort.run_rows`)
and the routing audit (`analyses.routing.evaluator.RouteEvaluator`) both generate through
`generate_rows`, with the same prefill cache (`PrefillCache`) and replay policy; they
differ only in how they group rows into batches and where the records go."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rnr_interp.engine.decoding import Decoding, Generation
from rnr_interp.engine.generate import PromptStates, generate, prompt_states, replay_pays
from rnr_interp.engine.sampling import prompt_ids
from rnr_interp.interventions import Intervention
from rnr_interp.models import LoadedModel
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
