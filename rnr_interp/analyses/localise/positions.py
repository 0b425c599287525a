"""Where a reply's answer starts: the position whose state chooses the answer's first
token. Steering and units read a block there when asked (`--read-at answer`; a model
that writes "The final answer is" before its answer decides the answer after that
opening), and the organisms that act where answers start are fitted there.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from rnr_interp.analyses.localise.defaults import READ_AT
from rnr_interp.analyses.localise.recognition import answer_statement
from rnr_interp.engine.sampling import prompt_ids
from rnr_interp.models import LoadedModel
from rnr_interp.tasks.base import Question, Task


def check_read_at(read_at: str) -> None:
    if read_at not in READ_AT:
        raise ValueError(f"read_at must be one of {', '.join(READ_AT)}, got {read_at!r}")


def read_setting(read_at: str) -> dict[str, str]:
    """`read_at` for a run config: only when it is not the prompt's end, so a default
    run's config (and run id) is what it was before there was a choice."""
    return {} if read_at == "prompt" else {"read_at": read_at}


def answer_opening(task: Task) -> str:
    """What the task's answer statement says before the answer ("Answer: ")."""
    return answer_statement(task).split("{}", 1)[0]


def answer_start(task: Task, question: Question, text: str) -> int | None:
    """Where in `text` the answer the task reads from it begins: the first place the
    answer is written from which the rest of the text still reads as that answer (in
    "42 = 40 + 2. Answer: 42" the first 42; in "Answer: 4,2", read as 4, the 4). None
    when the text holds no answer the task reads, or does not write it as read."""
    answer = task.read_answer(text, question)
    if not answer:
        return None
    starts = [i for i in range(len(text)) if text.startswith(answer, i)]
    return next((i for i in starts if task.read_answer(text[i:], question) == answer), starts[-1] if starts else None)


def answer_inputs(view: LoadedModel, task: Task, question: Question,
                  opening: str | None = None) -> tuple[list[int], list[int]]:
    """The token ids up to where `question`'s answer starts (its prompt as `view`
    renders and encodes it, then `opening`: what is written before the answer, by
    default the task's answer opening), and the answer's tokens after them
    (`question.answer`). Whitespace ending the opening goes with the answer, as a
    tokenizer that writes " 42" as one token reads it; a tokenizer that writes the space
    as a token of its own (SmolLM2: " ", "4", "2") has it in the context, so the
    answer's first token is the first that writes some of the answer."""
    opening = answer_opening(task) if opening is None else opening
    prompt = view.render(task.user_message(question))
    context = view.encode(prompt + opening.rstrip())
    whole = view.encode(prompt + opening + question.answer)
    answer = whole[len(context):]
    while len(answer) > 1 and not view.tokenizer.decode([answer[0]]).strip():
        context, answer = [*context, answer[0]], answer[1:]
    return context, answer


def answer_fork(lm: LoadedModel, task: Task, question: Question, reply: str) -> tuple[list[int], int, int] | None:
    """Where `reply`'s wrong answer leaves the gold: the token ids up to the first answer
    token on which the two differ (the prompt, what the reply writes before its answer,
    and the tokens they share), the gold's token there and the reply's. None when the
    reply states no answer the task reads, states the gold, or one answer's tokens are
    the other's beginning (no token on which they part)."""
    at = answer_start(task, question, reply)
    said = task.read_answer(reply, question) if at is not None else None
    if not said or said == question.answer:
        return None
    context, wrong = answer_inputs(lm, task, dataclasses.replace(question, answer=said), reply[:at])
    gold_context, gold = answer_inputs(lm, task, question, reply[:at])
    if gold_context != context:
        return None
    shared = next((i for i, (a, b) in enumerate(zip(gold, wrong)) if a != b), None)
    return None if shared is None else ([*context, *gold[:shared]], gold[shared], wrong[shared])


def reading_contexts(lm: LoadedModel, task: Task, questions: Sequence[Question], replies: Mapping[str, str],
                     read_at: str = "prompt") -> list[list[int]]:
    """Per question, the token ids whose last position is read: with "prompt" the
    prompt; with "answer" the prompt and what the question's deployed reply (`replies`,
    by question id) writes before its answer (the prompt where it states none the task
    reads)."""
    out = []
    for q in questions:
        text = replies.get(q.id) if read_at == "answer" else None
        at = None if text is None else answer_start(task, q, text)
        if at is None:
            out.append(prompt_ids(lm, task, q))
            continue
        said = task.read_answer(text, q) or ""
        out.append(answer_inputs(lm, task, dataclasses.replace(q, answer=said), text[:at])[0])
    return out
