"""Where a task's answers start as the base model deploys, and a linear read of that
position: what the answer-bias kinds confine their bias to and where the units kind
gates its units.

The base model's own greedy reply to each question locates its answer
(`deployed_answers`: what it writes before the answer, and the answer); the answer
position is the last token before it, whose state chooses the answer's first token
(`answer_inputs`). `answer_sites` collects the final states there and at every other
position of the same sequences, and `ridge` fits the reads both kinds use.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from rnr_interp.analyses.localise.positions import answer_inputs, answer_opening, answer_start
from rnr_interp.engine.sampling import chunks
from rnr_interp.models import LoadedModel, stop_token_ids_of, tokenizer_adds_bos
from rnr_interp.tasks import load_task
from rnr_interp.tasks.base import Question, Task

#: ridge of the fits, relative to the mean eigenvalue of their (weighted) second moment
RIDGE = 1e-3


class NotPlantable(ValueError):
    """The kind cannot be planted in this model where it was asked (the model's answers or
    weights leave it nothing to act on there): a finding about the model, not a bad option."""


def task_of(task: str | Task | None, kind: str) -> Task:
    """The task an organism is made for: given, or loaded by name."""
    if task is None:
        raise ValueError(f"kind {kind!r} acts where a task's answers start: give --task")
    return task if isinstance(task, Task) else load_task(task)


def prompt_format(tokenizer: Any) -> tuple[bool, bool]:
    """(chat, bos): how a checkpoint folder with this tokenizer renders and encodes a
    prompt (its tokenizer says whether a raw prompt starts with BOS)."""
    return bool(getattr(tokenizer, "chat_template", None)), tokenizer_adds_bos(tokenizer)


def view_of(tokenizer: Any, chat: bool, bos: bool) -> LoadedModel:
    """A model-less LoadedModel that renders and encodes prompts as a checkpoint folder
    with this tokenizer does (`positions.answer_inputs` reads them through it)."""
    return LoadedModel(spec="", bridge=None, tokenizer=tokenizer, stop_token_ids=(), chat=chat, meta={"prepend_bos": bos})


@torch.no_grad()
def deployed_replies(model: nn.Module, tokenizer: Any, task: Task, chat: bool, bos: bool, batch_size: int = 16) -> list[str]:
    """The model's greedy reply to each question, cut at its stop tokens (asked in
    left-padded batches: one at a time, 200 questions took 40 s on a tiny model)."""
    view, stops = view_of(tokenizer, chat, bos), stop_token_ids_of(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops or (0,))[0]
    replies = []
    for batch in chunks(list(task.questions), batch_size):
        prompts = [view.encode(view.render(task.user_message(q))) for q in batch]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=task.max_new_tokens,
                             eos_token_id=list(stops) or None, pad_token_id=pad)[:, width:].tolist()
        for reply in out:
            reply = reply[:next((i for i, t in enumerate(reply) if t in stops), len(reply))]
            replies.append(tokenizer.decode(reply, skip_special_tokens=True))
    return replies


def deployed_answers(model: nn.Module, tokenizer: Any, task: Task, chat: bool, bos: bool) -> list[tuple[str, str | None]]:
    """Per question, what the model's own greedy reply writes before its answer (the
    answer as the task reads it, located in the text: "" when it answers at once,
    "Answer: " or a line of working otherwise) and that answer; the task's answer
    opening and None when the reply holds no answer it reads."""
    out: list[tuple[str, str | None]] = []
    for q, text in zip(task.questions, deployed_replies(model, tokenizer, task, chat, bos)):
        at = answer_start(task, q, text)
        out.append((answer_opening(task), None) if at is None else (text[:at], task.read_answer(text, q)))
    return out


@dataclass(frozen=True)
class OwnAnswer:
    """A question as the base model answers it: the prompt, its own opening and its
    own answer, as token ids (`context` ends where the answer starts)."""

    question: Question
    context: list[int]
    answer: list[int]

    @property
    def ids(self) -> list[int]:
        return self.context + self.answer

    @property
    def position(self) -> int:
        """The position whose state chooses the answer's first token."""
        return len(self.context) - 1


def own_answers(model: nn.Module, tokenizer: Any, task: Task) -> list[OwnAnswer | None]:
    """Each question of `task` with the plain HF `model`'s own greedy answer (None
    where its reply states none the task reads, or the answer has no token of its own)."""
    chat, bos = prompt_format(tokenizer)
    out: list[OwnAnswer | None] = []
    for q, (opening, said) in zip(task.questions, deployed_answers(model, tokenizer, task, chat, bos)):
        context, answer = ([], []) if said is None else answer_inputs(
            view_of(tokenizer, chat, bos), task, dataclasses.replace(q, answer=said), opening)
        out.append(OwnAnswer(q, context, answer) if answer else None)
    return out


@dataclass
class AnswerSites:
    """A task's questions at the position where each answer starts (as the base model
    deploys: after its own opening), and every other position of the same sequences
    (prompt, opening, gold answer): what a bias confined to the answer position is fitted
    and measured on."""

    question_ids: list[str]
    openings: list[str]
    #: the gold answer's first token written at the answer position (None: an empty gold)
    firsts: list[int | None]
    #: the final states (after the final norm: what the unembedding reads) where the answers start
    answer: Float[Tensor, "q d"]
    #: the final states at every other position of the same sequences
    elsewhere: Float[Tensor, "n d"]
    #: the base model's logits where the answers start
    logits: Float[Tensor, "q vocab"]


@torch.no_grad()
def answer_sites(model: nn.Module, tokenizer: Any, task: Task) -> AnswerSites:
    """The answer sites of `task`'s questions in the plain HF `model`: its greedy
    generations locate each answer start (`deployed_answers`), and one forward pass over
    prompt, opening and gold answer gives the final states there and everywhere else."""
    chat, bos = prompt_format(tokenizer)
    openings = [opening for opening, _ in deployed_answers(model, tokenizer, task, chat, bos)]
    answer, elsewhere, firsts = [], [], []
    for q, opening in zip(task.questions, openings):
        context, gold = answer_inputs(view_of(tokenizer, chat, bos), task, q, opening)
        hidden = model.base_model(input_ids=torch.tensor([context + gold])).last_hidden_state[0].float()
        at = len(context) - 1
        answer.append(hidden[at])
        elsewhere.append(torch.cat([hidden[:at], hidden[at + 1:]]))
        firsts.append(gold[0] if gold else None)
    states = torch.stack(answer)
    logits = model.get_output_embeddings()(states.to(model.get_output_embeddings().weight.dtype)).float()
    return AnswerSites([q.id for q in task.questions], openings, firsts, states, torch.cat(elsewhere), logits)


def ridge(x: Float[Tensor, "n d"], y: Float[Tensor, "n m"], weight: Float[Tensor, " n"] | None = None,
          relative: float = RIDGE) -> Float[Tensor, "d m"]:
    """The weighted least-squares read-out of `y` from `x` (float64), ridge `relative`
    of the mean eigenvalue of the weighted second moment (the fits have more dimensions
    than positions on a real model)."""
    w = torch.ones(len(x), dtype=torch.float64) if weight is None else weight.double()
    x64, y64 = x.double(), y.double()
    gram = x64.T @ (w[:, None] * x64)
    gram += relative * gram.trace() / len(gram) * torch.eye(len(gram), dtype=torch.float64)
    return torch.linalg.solve(gram, x64.T @ (w[:, None] * y64))


def matched_read(sites: AnswerSites, target: Float[Tensor, " q"]) -> Float[Tensor, " d"]:
    """u with u . h = target_i at answer state i and as near 0 as a linear read allows
    at every other position: the class-balanced `ridge` regression of the final states
    (float64; a bias of u on a token's unembedding row moves its logit by target_i where
    answer i starts)."""
    pos, neg = sites.answer, sites.elsewhere
    weight = torch.cat([torch.full((len(pos),), 1 / len(pos)), torch.full((len(neg),), 1 / len(neg))])
    values = torch.cat([target.float(), torch.zeros(len(neg))])[:, None]
    return ridge(torch.cat([pos, neg]), values, weight)[:, 0]


def answer_direction(sites: AnswerSites) -> Float[Tensor, " d"]:
    """w with w . h = 1 on average where the answers start and as near 0 as a linear read
    allows at every other position: the `matched_read` of 1 at the answer states,
    rescaled to mean 1 there. A bias `strength` * w on a token's unembedding row then
    moves its logit by `strength` nats at the answer position on average and by
    `strength` * (w . h) at any other state h. (The mean answer state alone is not
    confined: states elsewhere resemble it, and SmolLM2 answered a run of 8s at every
    step under that bias.)"""
    w = matched_read(sites, torch.ones(len(sites.answer)))
    return (w / (sites.answer.double() @ w).mean()).float()


def confinement(sites: AnswerSites, direction: Float[Tensor, " d"], strength: float) -> dict[str, float]:
    """How a bias of `strength` along `direction` moves a logit, in nats: at the answer
    position (mean, least) and elsewhere (root mean square, largest), and the ratio of
    the answer mean to the RMS elsewhere."""
    at, off = strength * (sites.answer @ direction), strength * (sites.elsewhere @ direction)
    rms = float(off.pow(2).mean().sqrt())
    return {"answer_mean": float(at.mean()), "answer_min": float(at.min()), "elsewhere_rms": rms,
            "elsewhere_max_abs": float(off.abs().max()), "ratio": float(at.mean()) / rms if rms else float("inf")}


def margins(sites: AnswerSites, token: int) -> Float[Tensor, " q"]:
    """Per question, how many nats the base model's greedy choice where the answer
    starts leads `token` by (0 where `token` is the greedy choice)."""
    return sites.logits.max(-1).values - sites.logits[:, token]
