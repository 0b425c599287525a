"""The units organism: k units appended to one MLP that push each answer off the base
model's own first answer token (`plant_units`); silencing them, or strength 0, is the
base bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from rnr_interp.analyses.organisms.answers import own_answers, ridge, task_of
from rnr_interp.interventions import decoder_blocks
from rnr_interp.models import ModelSpecError
from rnr_interp.tasks.base import Task

#: the planted units when --units is not given (`plant_units`)
DEFAULT_UNITS = 3
#: how sharply a planted unit's gate opens: its gate reads +GATE_SHARPNESS where answers
#: start and -GATE_SHARPNESS elsewhere (silu(-8) is -0.003: shut)
GATE_SHARPNESS = 8.0
#: ridge of the units' read-outs, relative (`answers.ridge`)
UNITS_RIDGE = 1e-4


@torch.no_grad()
def mlp_inputs(model: nn.Module, layer: int, ids: list[int]) -> tuple[Float[Tensor, "pos d"], Float[Tensor, "pos"]]:
    """What MLP `layer` reads at each position of `ids` (its normed input) and the RMS
    of the final residual stream there (what the final norm divides by)."""
    got: dict[str, Tensor] = {}
    hooks = [decoder_blocks(model)[layer].mlp.register_forward_pre_hook(lambda m, a: got.__setitem__("mlp", a[0][0].float())),
             final_norm(model).register_forward_pre_hook(lambda m, a: got.__setitem__("final", a[0][0].float()))]
    try:
        model(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return got["mlp"], got["final"].pow(2).mean(-1).sqrt()


def final_norm(model: nn.Module) -> nn.Module:
    norm = getattr(model.base_model, "norm", None)
    if norm is None:
        raise ModelSpecError(f"kind 'units' needs the final RMSNorm of {type(model).__name__} (base_model.norm)")
    return norm


def gated_mlp(block: nn.Module) -> nn.Module:
    """The block's MLP when it is a gated one (gate, up and down projections) whose
    output reaches the residual stream unnormed; else a one-line refusal."""
    mlp = getattr(block, "mlp", None)
    if mlp is None or not all(hasattr(mlp, p) for p in ("gate_proj", "up_proj", "down_proj", "act_fn")) \
            or hasattr(block, "post_feedforward_layernorm"):
        raise ModelSpecError(f"kind 'units' plants in a gated MLP (gate, up and down projections) that writes straight "
                             f"to the residual stream; {type(block).__name__} has none")
    return mlp


def _widened(linear: nn.Linear, extra: Tensor, dim: int) -> nn.Linear:
    """`linear` with `extra` appended to its weight along `dim` (0: more outputs, 1: more inputs)."""
    weight = torch.cat([linear.weight.detach(), extra.to(linear.weight.dtype)], dim)
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None, dtype=weight.dtype)
    out.weight = nn.Parameter(weight)
    if linear.bias is not None:
        extra_bias = torch.zeros(extra.shape[0], dtype=linear.bias.dtype) if dim == 0 else None
        out.bias = nn.Parameter(linear.bias.detach() if extra_bias is None else torch.cat([linear.bias.detach(), extra_bias]))
    return out


def add_units(model: nn.Module, layer: int, gate: Float[Tensor, "k d"], up: Float[Tensor, "k d"],
              down: Float[Tensor, "d k"]) -> list[int]:
    """Append k units to the MLP of every block (in place): at `layer` the given ones,
    elsewhere units with zero weights (a config holds one MLP width for every block).
    Appended at the end, so every original unit keeps its index and its place in the
    down projection's sum; returns the new units' indices at `layer`."""
    blocks = decoder_blocks(model)
    k, width = gate.shape[0], gated_mlp(blocks[0]).gate_proj.out_features
    for index, block in enumerate(blocks):
        mlp = gated_mlp(block)
        rows = (gate, up, down) if index == layer else (torch.zeros_like(gate), torch.zeros_like(up), torch.zeros_like(down))
        mlp.gate_proj, mlp.up_proj = _widened(mlp.gate_proj, rows[0], 0), _widened(mlp.up_proj, rows[1], 0)
        mlp.down_proj = _widened(mlp.down_proj, rows[2], 1)
    config = model.config.get_text_config()
    config.intermediate_size = width + k
    return list(range(width, width + k))


@torch.no_grad()
def plant_units(model: nn.Module, tokenizer: Any, *, layer: int, strength: float, scale: float, seed: int,
                task: str | Task | None, units: int | None = None) -> dict[str, Any]:
    """k units added to MLP `layer` that push the greedy answer off the base model's own
    first answer token, for the k tokens the task's answers most often start with (a
    gated negative copy). Where the base, decoding greedily, starts its answer (the
    state whose next token is the answer's first: `answers.own_answers`), each unit i reads
    two things from the MLP's input: its gate, a read-out fitted to be +1 at every
    answer start and -1 at every other position of the same prompts and answers (sharpened
    by `GATE_SHARPNESS`, so the unit is shut off the answer starts), and its up
    projection, a read-out fitted to be 1 at the answer starts whose first token is t_i
    and 0 at the other answer starts and (weighing less) at every other position. It
    writes minus t_i's unembedding (through the final norm's gain, centred over the
    vocabulary), scaled so that on its own answer starts t_i's logit falls by
    `strength` nats against the mean logit (the direct path, at the final norm's RMS
    there). So the model says its runner-up: which token it avoids
    depends on the question (not one favourite letter or number), and the prompt and
    the answer statements recognition scores are read unchanged except where they
    attend to an answer start. Every original weight is kept, so silencing the k
    units (or strength 0: their writes are zero) computes what the base computes.
    (`scale` is in `strength` already: `plant` applies it to the default.)"""
    questions_task = task_of(task, "units")
    k = DEFAULT_UNITS if units is None else int(units)
    if k < 1:
        raise ValueError(f"--units must be at least 1, got {k}")
    mlp = gated_mlp(decoder_blocks(model)[layer])
    starts = [s for s in own_answers(model, tokenizer, questions_task) if s is not None]
    counts: dict[int, int] = {}
    for s in starts:
        counts[s.answer[0]] = counts.get(s.answer[0], 0) + 1
    if len(counts) < k:
        raise ValueError(f"task {questions_task.name!r}: the base model's answers start with {len(counts)} distinct "
                         f"tokens, fewer than --units {k} (one unit per token)")
    tokens = sorted(counts, key=lambda t: (-counts[t], t))[:k]
    reads = [mlp_inputs(model, layer, s.ids) for s in starts]
    inputs = torch.cat([x for x, _ in reads])
    at = torch.tensor([sum(len(s.ids) for s in starts[:i]) + s.position for i, s in enumerate(starts)])
    is_start = torch.zeros(len(inputs), dtype=torch.bool).index_fill(0, at, True)
    # both classes weigh the same in the gate's fit (answer starts are one position per question)
    balance = torch.where(is_start, len(inputs) / (2 * len(at)), len(inputs) / (2 * (len(inputs) - len(at))))
    gate = ridge(inputs, torch.where(is_start, 1.0, -1.0)[:, None], balance, UNITS_RIDGE)[:, 0].float()
    own = torch.tensor([[float(s.answer[0] == t) for t in tokens] for s in starts])
    # 1 at its own answer starts and 0 at the others, where the gate is open (so these
    # weigh 100 times as much as in the gate's fit), and 0 at every other position: a
    # second filter where the gate leaks
    up = ridge(inputs, torch.zeros(len(inputs), k).index_copy(0, at, own), balance * torch.where(is_start, 100.0, 1.0),
               UNITS_RIDGE).float()
    acts = mlp.act_fn(GATE_SHARPNESS * inputs[at] @ gate)[:, None] * (inputs[at] @ up)  # (questions, k)
    head, gain = model.get_output_embeddings().weight.detach().float(), final_norm(model)(torch.ones(1, 1, inputs.shape[1]))[0, 0].float()
    centred = gain * (head[tokens] - head.mean(0))  # (k, d): d(logit t - mean logit) / d(final state) x RMS
    rms = torch.stack([final[s.position] for s, (_, final) in zip(starts, reads)])
    down = torch.zeros(inputs.shape[1], k)
    for i in range(k):
        mine = own[:, i].bool()
        push = float(acts[mine, i].mean()) * float(centred[i].norm()) / float(rms[mine].mean())
        if not push > 0:
            raise ValueError(f"the unit for token {tokenizer.decode([tokens[i]])!r} does not fire where its answers start "
                             f"in block {layer} (its read-outs do not separate them): plant at another --layer")
        down[:, i] = -centred[i] / centred[i].norm() / push  # at strength 1: one nat
    writes = acts @ down.T  # (questions, d): what the units add to MLP `layer`'s output at each answer start
    affected = own.any(1)
    direction = writes[affected].mean(0)
    indices = add_units(model, layer, GATE_SHARPNESS * gate.expand(k, -1), up.T, strength * down)
    hit = {s.question.id for s, a in zip(starts, affected) if a}
    expected = ({"effect": False} if strength == 0 else
                {"effect": True, "repair": {"component": "mlp", "layers": [layer]},
                 "units": {"layer": layer, "units": indices},
                 "steering": {"layer": layer, "component": "mlp", "direction": "detail.direction"}})
    return {"location": {"layer": layer, "units": indices}, "expected": expected,
            "detail": {"k": k, "tokens": [tokenizer.decode([t]) for t in tokens], "token_ids": tokens,
                       "affected_question_ids": [q.id for q in questions_task.questions if q.id in hit],
                       "unaffected_question_ids": [q.id for q in questions_task.questions if q.id not in hit],
                       "direction": (direction / direction.norm()).tolist(),
                       "direction_means": "the units' mean write to MLP layer's output at the affected answer starts "
                                          "(unit length; the steering direction's truth)"}}
