"""A task anchored to a model: its questions, with that model's own deployed answers as
the golds.

Validation plants an effect in a model and asks whether the analyses find it. On the
task's own golds the organism's failures mix two causes: what the plant broke and what
the base model never answered (SmolLM2 answers 9 of 40 arithmetic questions), and a
failure set drawn from that mix is mostly the base's. Anchored to the base, a question
is "right" when the organism says what the base said, so every failure is the plant's
and an analysis that does not name the plant has missed a known answer. The task's own
golds remain the user's question (`rnr validate --gold task`).

A question is kept when the model's deployed answer is graded right against itself
under the grading the analyses use (strict by default: stated in the task's format), so
the base model realizes every kept question; the others are dropped (no gold to anchor
to: a tiny random model states no answer strictly, SmolLM2 almost always does). Everything else of the task (instruction, grading, answer
kind, the distractors recognition derives from a gold) is the task's own.
"""

from __future__ import annotations

from rnr_interp.engine.rows import Row, generate_rows
from rnr_interp.engine.sampling import chunks, deployed_decoding
from rnr_interp.models import LoadedModel
from rnr_interp.records import DEFAULT_GRADING
from rnr_interp.tasks import ANCHORED_FROM, with_gold, with_questions
from rnr_interp.tasks.base import Task


def anchor_task(lm: LoadedModel, task: Task, batch_size: int = 32, grading: str = DEFAULT_GRADING) -> Task:
    """`task` with each question's gold replaced by `lm`'s deployed answer to it, kept
    where that answer is graded right under `grading` (module docstring); the task's
    name gains ``@base``."""
    decoding = deployed_decoding(task)
    anchored = []
    for part in chunks(task.questions, batch_size):
        gens = generate_rows(lm, task, [Row(q, (), "deployed") for q in part], decoding)
        for q, g in zip(part, gens):
            said = task.read_answer_strict(g.text, q, g.finish != "length") if grading == "strict" else task.read_answer(g.text, q)
            if said is None:
                continue
            gold = with_gold(q, said)
            graded = task.grade_candidate(g.text, gold, g.finish)
            if graded.strict if grading == "strict" else graded.flexible:
                anchored.append(gold)
    if not anchored:
        raise ValueError(f"{lm.spec} states no answer to any question of {task.name!r} that {grading} grading reads: "
                         "nothing to anchor to")
    original = task.describe()
    return with_questions(task, anchored, f"{task.name}@base", original["source"],
                          {**{k: original[k] for k in ANCHORED_FROM}, "model": lm.spec})
