"""The answer-bias organisms: a bias on the unembedding confined to where answers start,
toward one answer token by each question's own margin and a fixed lead (``gap``;
``sharpen`` as the base of a checkpoint pair: `matched_read`) or against half the golds'
first tokens along the answer direction (``new``, a pair's base: `answers.answer_direction`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn

from rnr_interp.analyses.organisms.answers import (
    answer_direction, answer_sites, confinement, margins, matched_read, task_of,
)
from rnr_interp.engine.decoding import SAMPLING_TEMPERATURE
from rnr_interp.tasks.base import Task


def bias_tokens(model: nn.Module, biases: dict[int, float], direction: Float[Tensor, " d"]) -> None:
    """Add biases[t] * direction to the unembedding row of each token t (in place,
    untied from the input embedding first)."""
    untie_unembedding(model)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        for token, nats in biases.items():
            head[token] += (nats * direction).to(head.dtype)


def untie_unembedding(model: nn.Module) -> None:
    """Give the unembedding its own weights (a tied one is the input embedding too, and
    a bias toward a token there would change how every prompt containing it is read)."""
    config = model.config.get_text_config()
    if getattr(model.config, "tie_word_embeddings", False) or getattr(config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False
        config.tie_word_embeddings = False
        head = model.get_output_embeddings()
        head.weight = nn.Parameter(head.weight.detach().clone())


# -- the realization gap and the checkpoint pairs ----------------------------------

#: nats t leads the gold by at each affected answer start when no --strength is given,
#: per unit of the probe's temperature: at temperature T the gold then keeps
#: 1 / (1 + e^2) ~ 1/8 of what the two share of the first token's mass, and K = 32
#: samples reach it (1 - (7/8)^32 ~ 0.99)
HEADROOM = 2.0


def plant_answer_bias(model: nn.Module, tokenizer: Any, *, kind: str, layer: int | None, strength: float | None, scale: float,
                      seed: int, task: str | Task | None, temperature: float = SAMPLING_TEMPERATURE) -> dict[str, Any]:
    """A bias on the unembedding, confined to where the task's answers start.
    ``toward`` (gap, sharpen): one token t, the first answer token of a gold drawn from
    the seed, is raised at each affected answer start (a question the base answers
    greedily, its gold starting with another token) by the gold's margin over t there
    plus `strength` nats (`matched_read`), so greedy says t on every affected question
    and t leads the gold by the same `strength` on each: sampling at `temperature`
    still reaches the gold. Default strength: `HEADROOM` x `temperature` x `scale`; 0
    plants no bias (the null). (One bias of the same size everywhere, the first version,
    flipped 14 of SmolLM2's 21 affected arithmetic answers and left 4 of them within
    K = 32 samples' reach: its spread of margins put most past where sampling looks.)
    ``suppress`` (new): the first tokens of a random half of the golds' distinct first
    tokens fall by `strength` nats there along `answer_direction`, so neither greedy nor
    K samples reach those golds. ``affected``: the questions the bias acts against.
    (`layer` is not used: the bias sits at the answer position.)"""
    questions = task_of(task, kind)
    sites = answer_sites(model, tokenizer, questions)
    distinct = sorted({f for f in sites.firsts if f is not None})
    if not distinct:
        raise ValueError(f"task {questions.name!r}: no gold answer has a token to bias")
    rng = np.random.default_rng(seed)
    ids = sites.question_ids
    detail: dict[str, Any] = {"openings": dict(zip(ids, sites.openings))}
    if kind == "new":
        chosen = sorted(int(t) for t in rng.choice(distinct, size=max(1, len(distinct) // 2), replace=False))
        hit = torch.tensor([f in chosen for f in sites.firsts])
        unaffected = ~hit
        direction = answer_direction(sites)
        bias_tokens(model, {t: -strength for t in chosen}, direction)
        detail["direction"] = "class-balanced ridge read of the answer position against every other position (answer_direction)"
        detail["logit_change_nats"] = confinement(sites, direction, -strength)
    else:
        chosen = [int(rng.choice(distinct))]
        greedy = sites.logits.argmax(-1).tolist()
        realized = torch.tensor([f is not None and f == g for f, g in zip(sites.firsts, greedy)])
        hit = realized & torch.tensor([f != chosen[0] for f in sites.firsts])
        unaffected = realized & ~hit
        if not hit.any():
            raise ValueError(f"task {questions.name!r}: no question the base model answers greedily starts with a token "
                             f"other than the biased one; no question is affected")
        if strength is None:  # only the toward kinds are calibrated (`KINDS`)
            strength = scale * HEADROOM * temperature
        if strength < 0:
            raise ValueError(f"--strength is how many nats the biased token leads the gold by; it cannot be negative, "
                             f"got {strength:g}")
        margin = margins(sites, chosen[0])
        read = matched_read(sites, torch.where(hit, margin + strength, 0.0) if strength else torch.zeros(len(hit))).float()
        bias_tokens(model, {chosen[0]: 1.0}, read)
        lead = (sites.answer[hit] @ read) - margin[hit]
        detail["direction"] = ("class-balanced ridge read of the final state: the gold's margin over the biased token "
                               "plus the strength at each affected answer start, 0 at the other answer starts and "
                               "every other position (matched_read)")
        detail["logit_change_nats"] = confinement(dataclasses.replace(sites, answer=sites.answer[hit]), read, 1.0)
        detail["greedy_margin_nats"] = {"median": float(margin[hit].median()), "min": float(margin[hit].min()),
                                        "max": float(margin[hit].max())}
        detail["lead_nats"] = {"median": float(lead.median()), "min": float(lead.min()), "max": float(lead.max())}
        detail["sized_for_temperature"] = float(temperature)
        detail["unrealized_question_ids"] = [q for q, r in zip(ids, realized.tolist()) if not r]
    detail["affected_question_ids"] = [q for q, h in zip(ids, hit.tolist()) if h]
    detail["unaffected_question_ids"] = [q for q, u in zip(ids, unaffected.tolist()) if u]
    location = {"token_ids": chosen, "tokens": [tokenizer.decode([t]) for t in chosen], "questions": "affected"}
    return {"strength": float(strength), "location": location, "detail": detail,
            "expected": {"effect": False} if strength == 0 else {"effect": True, **EXPECTED[kind]}}


#: what the analyses should report on each answer-bias kind (validate's analyses read these)
EXPECTED: dict[str, dict[str, Any]] = {
    "gap": {"audit": {"gap_above_null_on": "affected", "no_gap_change_on": "unaffected"}},
    # the checkpoint audit's source of gains (`checkpoints.counts`, "gained_from"): where
    # most newly realized answers come from
    "sharpen": {"compare": {"gained_from": "base_reachable"}},
    "new": {"compare": {"gained_from": "base_unreachable"}},
}
