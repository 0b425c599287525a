"""The answer-bias organisms: a bias on the unembedding along the answer direction
(`answers.answer_direction`), toward one answer token (``gap``; ``sharpen`` as the base
of a checkpoint pair) or against half the golds' first tokens (``new``, a pair's base).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn

from rnr_interp.analyses.organisms.answers import answer_direction, answer_sites, confinement, margins, task_of
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

#: nats above the median margin a calibrated bias toward t sets: t then leads the old
#: greedy choice by e^2 ~ 7 times, so a gold that was greedy keeps >= 1/8 of the mass
#: and K = 32 samples at T = 1 still reach it (1 - (7/8)^32 ~ 0.99)
HEADROOM = 2.0


def plant_answer_bias(model: nn.Module, tokenizer: Any, *, kind: str, layer: int | None, strength: float | None, scale: float,
                      seed: int, task: str | Task | None) -> dict[str, Any]:
    """A bias on the unembedding along the answer direction (`answer_direction`, fitted on
    the task's questions as the base model answers them). ``toward`` (gap, sharpen): one
    token t, the first answer token of a gold drawn from the seed, rises by `strength`
    nats at the answer position (default: the median margin by which the greedy choice
    leads t on the questions whose gold starts otherwise, plus `HEADROOM`, times
    `scale`), so greedy says t there where sampling still reaches the gold.
    ``suppress`` (new): the first tokens of a random half of the golds' distinct first
    tokens fall by `strength` nats there, so neither greedy nor K samples reach those
    golds. ``affected``: the questions the bias acts against. (`layer` is not used: the
    bias sits at the answer position.)"""
    questions = task_of(task, kind)
    sites = answer_sites(model, tokenizer, questions)
    distinct = sorted({f for f in sites.firsts if f is not None})
    if not distinct:
        raise ValueError(f"task {questions.name!r}: no gold answer has a token to bias")
    rng = np.random.default_rng(seed)
    if kind == "new":
        chosen = sorted(int(t) for t in rng.choice(distinct, size=max(1, len(distinct) // 2), replace=False))
        hit = torch.tensor([f in chosen for f in sites.firsts])
    else:
        chosen = [int(rng.choice(distinct))]
        hit = torch.tensor([f is not None and f != chosen[0] for f in sites.firsts])
    if not hit.any():
        raise ValueError(f"task {questions.name!r}: every gold starts with the biased token; no question is affected")
    margin = margins(sites, chosen[0])[hit] if kind != "new" else None
    if strength is None:  # only the toward kinds are calibrated (`KINDS`)
        strength = scale * (float(margin.median()) + HEADROOM)
    direction = answer_direction(sites)
    sign = -1.0 if kind == "new" else 1.0
    bias_tokens(model, {t: sign * strength for t in chosen}, direction)
    ids = sites.question_ids
    detail: dict[str, Any] = {
        "affected_question_ids": [q for q, h in zip(ids, hit.tolist()) if h],
        "unaffected_question_ids": [q for q, h in zip(ids, hit.tolist()) if not h],
        "openings": dict(zip(ids, sites.openings)),
        "direction": "class-balanced ridge read of the answer position against every other position (answer_direction)",
        "logit_change_nats": confinement(sites, direction, sign * strength),
    }
    if margin is not None:
        detail["greedy_margin_nats"] = {"median": float(margin.median()), "min": float(margin.min()), "max": float(margin.max()),
                                        "share_below_strength": float((margin < strength).float().mean())}
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
