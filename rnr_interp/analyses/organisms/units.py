"""The units organism: k units appended to one MLP that turn each answer the base model
starts with one of k tokens to start with a rarer token none of them is (`plant_units`); silencing
them, or strength 0, is the base to float rounding (every original weight is kept).
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from rnr_interp.analyses.localise.recognition import default_readout, option_sequences
from rnr_interp.analyses.organisms.ablation import mean_ablated, mean_write, post_mlp_norm
from rnr_interp.analyses.organisms.answers import (NotPlantable, OwnAnswer, deployed_replies, own_answers, prompt_format, ridge,
                                                   task_of, view_of)
from rnr_interp.interventions import decoder_blocks
from rnr_interp.models import ModelSpecError
from rnr_interp.tasks.base import Task

#: the planted units when --units is not given (`plant_units`)
DEFAULT_UNITS = 3
#: how sharply a planted unit's gate opens: its gate reads +GATE_SHARPNESS where answers
#: start and -GATE_SHARPNESS elsewhere (silu(-8) is -0.003: shut)
GATE_SHARPNESS = 8.0
#: nats by which a unit's partner token leads every other token where its answers start,
#: read through the whole model, when no --strength is given (on SmolLM2 the lead a write
#: toward the partner reaches peaks at 1.7 to 3 nats at block 18, then falls as a space wins)
UNITS_LEAD = 1.0
#: ridge of the units' gate read-out, relative (`answers.ridge`)
UNITS_RIDGE = 1e-4
#: ridge of the up read-outs: small, so that a read-out
#: is near 0 at the prompt's end of a question whose answer starts later (that state
#: differs little from an affected question's answer start, where it is large)
UP_RIDGE = 1e-8
#: the largest write one answer start may need, in direct-path nats (`push_through`): a
#: question the units cannot turn below it is left alone
MAX_PUSH = 4096.0
#: how much the answer starts with an earlier MLP silenced weigh in the units' fits,
#: all of one answer start's silenced copies together, against the answer start itself
UPSTREAM_WEIGHT = 1.0
#: the most an earlier block's silencing may move the planted MLP's input at the answer
#: starts (a share of its length) for the units to be fitted there too (`silenced_starts`)
UPSTREAM_SHIFT = 0.5
#: the up read-outs' targets weigh this much squared more where the gate opens than elsewhere
OPEN_WEIGHT = 100.0


@torch.no_grad()
def mlp_inputs(model: nn.Module, layer: int, ids: list[int]
               ) -> tuple[Float[Tensor, "pos d"], Float[Tensor, "pos"], Float[Tensor, "pos d"]]:
    """What MLP `layer` reads at each position of `ids` (its normed input), the RMS
    of the final residual stream there (what the final norm divides by), and what the
    MLP writes there before any norm after it."""
    got: dict[str, Tensor] = {}
    mlp = decoder_blocks(model)[layer].mlp
    hooks = [mlp.register_forward_pre_hook(lambda m, a: got.__setitem__("mlp", a[0][0].float())),
             mlp.register_forward_hook(lambda m, a, out: got.__setitem__("out", out[0].float())),
             final_norm(model).register_forward_pre_hook(lambda m, a: got.__setitem__("final", a[0][0].float()))]
    try:
        model(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return got["mlp"], got["final"].pow(2).mean(-1).sqrt(), got["out"]


def final_norm(model: nn.Module) -> nn.Module:
    norm = getattr(model.base_model, "norm", None)
    if norm is None:
        raise ModelSpecError(f"kind 'units' needs the final RMSNorm of {type(model).__name__} (base_model.norm)")
    return norm


def gated_mlp(block: nn.Module) -> nn.Module:
    """The block's MLP when it is a gated one (gate, up and down projections); else a
    one-line refusal."""
    mlp = getattr(block, "mlp", None)
    if mlp is None or not all(hasattr(mlp, p) for p in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        raise ModelSpecError(f"kind 'units' plants in a gated MLP (gate, up and down projections); "
                             f"{type(block).__name__} has none")
    return mlp


def behind_norm(norm: nn.Module, toward: Float[Tensor, "k d"], rms: Float[Tensor, " k"], outputs: Float[Tensor, "q d"],
                own: Float[Tensor, "q k"]) -> Float[Tensor, "k d"]:
    """Down columns written before `norm` (a norm after the MLP), one nat each on the
    direct path to first order where its answers start. A small write x leaves an RMSNorm
    as g * x / RMS (g its gain, RMS that of the block's write there, `outputs`), so the
    lead along `toward` (the final state's direction that raises w_i, at the final norm's
    RMS `rms`) rises fastest per unit of write along g * toward, and the most there where
    the write drowns the rest of the block's (it then leaves the norm along g * x). A
    dimension the gain zeroes gets nothing (Gemma 3 270M has some)."""
    gain = norm(torch.ones(1, 1, toward.shape[1], dtype=toward.dtype))[0, 0]
    steepest = gain * toward
    size = torch.stack([outputs[own[:, i].bool()].pow(2).mean(-1).sqrt().mean() for i in range(len(toward))])
    return steepest * (size * rms / steepest.norm(dim=-1) ** 2)[:, None]


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


def set_units(model: nn.Module, layer: int, indices: list[int], gate: Float[Tensor, "k d"], up: Float[Tensor, "k d"],
              down: Float[Tensor, "d k"]) -> None:
    """Write units `indices` of MLP `layer` (appended by `add_units`) again, in place."""
    mlp = gated_mlp(decoder_blocks(model)[layer])
    with torch.no_grad():
        mlp.gate_proj.weight[indices] = gate.to(mlp.gate_proj.weight.dtype)
        mlp.up_proj.weight[indices] = up.to(mlp.up_proj.weight.dtype)
        mlp.down_proj.weight[:, indices] = down.to(mlp.down_proj.weight.dtype)


def unseen_positions(sequences: list[list[int]], seen: set[tuple[int, ...]]) -> list[tuple[list[int], list[int]]]:
    """Each of `sequences` with its positions whose prefix (the tokens up to and with
    the position's own) is not in `seen`, which then holds them; sequences without one
    are left out."""
    out = []
    for ids in sequences:
        new = [p for p in range(len(ids)) if tuple(ids[:p + 1]) not in seen]
        seen.update(tuple(ids[:p + 1]) for p in new)
        if new:
            out.append((ids, new))
    return out


def recognition_sequences(tokenizer: Any, task: Task) -> list[list[int]]:
    """Every sequence the screen's recognition scores for `task` (its default readout:
    each candidate's answer statement after the prompt for a free-form task, the options
    for a multiple-choice one), as token ids."""
    chat, bos = prompt_format(tokenizer)
    view, variant = view_of(tokenizer, chat, bos), default_readout(task).partition(":")[0]
    return [[*seq.context, *seq.continuation] for q in task.questions for seq in option_sequences(view, task, q, variant)]


def reply_sequences(model: nn.Module, tokenizer: Any, task: Task) -> list[list[int]]:
    """Each question's prompt and `model`'s greedy reply to it, as token ids."""
    chat, bos = prompt_format(tokenizer)
    view = view_of(tokenizer, chat, bos)
    return [view.encode(view.render(task.user_message(q))) + tokenizer(reply, add_special_tokens=False).input_ids
            for q, reply in zip(task.questions, deployed_replies(model, tokenizer, task, chat, bos))]


def rows_at(model: nn.Module, layer: int, reads: list[tuple[list[int], list[int]]], width: int) -> Float[Tensor, "n d"]:
    """What MLP `layer` reads at the given positions of each sequence (`mlp_inputs`)."""
    return torch.cat([torch.zeros(0, width)] + [mlp_inputs(model, layer, ids)[0][positions] for ids, positions in reads])


@torch.no_grad()
def silenced_starts(model: nn.Module, tokenizer: Any, task: Task, layer: int, starts: list[OwnAnswer],
                    intact: Float[Tensor, "q d"]) -> tuple[Float[Tensor, "n d"], list[int]]:
    """What MLP `layer` reads where each of `starts` starts its answer (its context's
    last position) with the MLP of each earlier block mean-ablated as the sweep silences
    it (`intact`: what it reads there unsilenced), and those blocks, leaving out a block whose silencing moves that input by more
    than `UPSTREAM_SHIFT` of its length (median over `starts`): the fit has no room for
    such states (every earlier block of a 64-wide tiny model moves it 0.7 to 1.3), and
    such a block breaks the base (SmolLM2 at block 18: MLPs 0, 2 and 11 move it 0.6 to
    1.0 and change every answer; the others 0.2 to 0.45)."""
    rows, kept = [], []
    for j in range(layer):
        with mean_ablated(model, j, mean_write(model, tokenizer, task, j)):
            silenced = torch.stack([mlp_inputs(model, layer, s.context)[0][-1] for s in starts])
        if float(((silenced - intact).norm(dim=1) / intact.norm(dim=1)).median()) <= UPSTREAM_SHIFT:
            rows.append(silenced)
            kept.append(j)
    return torch.cat([torch.zeros(0, intact.shape[1]), *rows]), kept


def partner_tokens(tokens: list[int], counts: dict[int, int]) -> list[int]:
    """Each unit's partner, the token it turns its answers to: the rarest tokens the
    task's answers start with (`counts`, ties by id) that none of the k `tokens` is, one
    per unit while they last, then again from the rarest. Partners from the k tokens
    themselves (a ring) make each gold another unit's partner: the units' mean write then
    raises the golds with the wrong answers, and no single direction subtracted rescues.
    Rare ones start few of the answers the units leave alone, so adding v can turn those."""
    rest = sorted((t for t in counts if t not in tokens), key=lambda t: (counts[t], t))
    return [rest[i % len(rest)] for i in range(len(tokens))]


@torch.no_grad()
def lead_of(model: nn.Module, layer: int, context: list[int], write: Float[Tensor, " d"], token: int) -> float:
    """Nats by which `token` leads every other token at the last position of `context`
    when MLP `layer`'s output there gains `write` (through the whole model)."""
    def add(module: nn.Module, args: Any, out: Tensor) -> Tensor:
        out = out.clone()
        out[0, -1] += write.to(out.dtype)
        return out

    hook = decoder_blocks(model)[layer].mlp.register_forward_hook(add)
    try:
        logits = model(input_ids=torch.tensor([context])).logits[0, -1].float()
    finally:
        hook.remove()
    return float(logits[token] - logits.index_fill(0, torch.tensor([token]), -torch.inf).max())


def push_through(model: nn.Module, layer: int, context: list[int], column: Float[Tensor, " d"], token: int,
                 lead: float) -> float | None:
    """The least a (to 1e-6 of it) such that MLP `layer` writing a * `column` where
    `context` ends makes `token` lead every other token by `lead` nats, read through the
    model (later blocks undo part of a write, so the direct path does not size it);
    None where `MAX_PUSH` does not reach it."""
    high = 16.0
    while lead_of(model, layer, context, high * column, token) < lead:
        high *= 2 ** 0.5  # finely: past a peak the lead falls again (another token wins a write too large)
        if high > MAX_PUSH:
            return None
    low = 0.0
    for _ in range(24):
        middle = (low + high) / 2
        low, high = (low, middle) if lead_of(model, layer, context, middle * column, token) >= lead else (middle, high)
    return high


def refuse_unturned(own: Float[Tensor, "q k"], tokens: list[int], tokenizer: Any, layer: int, why: str) -> None:
    """`NotPlantable` where a unit (a column of `own`: the answer starts it turns) turns none."""
    for i in range(own.shape[1]):
        if not own[:, i].any():
            raise NotPlantable(f"the unit for token {tokenizer.decode([tokens[i]])!r} turns none of its answers in "
                               f"block {layer} {why}: plant at another --layer")


@torch.no_grad()
def plant_units(model: nn.Module, tokenizer: Any, *, layer: int, strength: float | None, scale: float, seed: int,
                task: str | Task | None, units: int | None = None) -> dict[str, Any]:
    """k units added to MLP `layer` that turn the base model's greedy answers starting
    with one of the k tokens the task's answers most often start with (t_i) into answers
    starting with a rarer first token none of them is (its partner w_i, `partner_tokens`): a change of
    content, not of phrasing (pushing t_i down alone lets a phrasing token such as "The"
    win). Where the base, decoding greedily, starts its answer (the state whose next
    token is the answer's first: `answers.own_answers`), each unit i reads two things
    from the MLP's input: its gate, a read-out fitted to be +1 at every answer start and
    -1 at every other position of the same prompts and answers and of the sequences
    recognition scores (`recognition_sequences`: "Answer: 47" read after the prompt puts
    a number where an answer starts, and units open there move recognition with the
    answers; sharpened by
    `GATE_SHARPNESS`, so the unit is shut off the answer starts), and its up projection,
    a read-out fitted, per answer start whose first token is t_i, to the size that
    question needs (`push_through`: w_i then leads every other token by `strength` nats,
    read through the whole model), and to 0 at the other answer starts and at every
    other position (weighing `OPEN_WEIGHT` squared times more where the gate opens). It writes
    along w_i's unembedding (through the final norm's gain, centred over the
    vocabulary). Both are fitted to the same targets at the answer starts with each
    earlier MLP mean-ablated that moves their input there by at most half its length
    (`silenced_starts`): read-outs this
    fine open far wider off the states they were fitted on, and the overshoot would
    repair as silencing block L does. Both read-outs are then fitted once more, shut also along the organism's
    own greedy replies (`reply_sequences`: after a turned first token, or past an
    answer's end, the replies hold states no base reply does). A question the units
    cannot turn within `MAX_PUSH` is left alone. The
    prompt and the sequences recognition scores are read unchanged except where they
    attend to an answer start. Every original weight is kept, so silencing the k
    units (or strength 0: their writes are zero) computes what the base computes (to float rounding).
    Where a norm follows the MLP (Gemma 2/3, OLMo 2) the units write before it
    (`behind_norm`), sized through it and the rest of the model alike, and the organism's
    direction is what reaches the stream past it. No `strength`: `UNITS_LEAD` times
    `scale`."""
    questions_task = task_of(task, "units")
    k = DEFAULT_UNITS if units is None else int(units)
    if k < 1:
        raise ValueError(f"--units must be at least 1, got {k}")
    if strength is not None and strength < 0:
        raise ValueError(f"--strength of kind 'units' is a size in nats and cannot be negative, got {strength:g}")
    mlp = gated_mlp(decoder_blocks(model)[layer])
    norm = post_mlp_norm(decoder_blocks(model)[layer])
    starts = [s for s in own_answers(model, tokenizer, questions_task) if s is not None]
    counts: dict[int, int] = {}
    for s in starts:
        counts[s.answer[0]] = counts.get(s.answer[0], 0) + 1
    if len(counts) <= k:
        raise NotPlantable(f"task {questions_task.name!r}: the base model's answers start with {len(counts)} distinct "
                           f"tokens, not more than --units {k} (one token per unit, and one more the units turn "
                           f"their answers to): plant fewer --units")
    tokens = sorted(counts, key=lambda t: (-counts[t], t))[:k]
    reads = [mlp_inputs(model, layer, s.ids) for s in starts]
    width = reads[0][0].shape[1]
    own = torch.tensor([[float(s.answer[0] == t) for t in tokens] for s in starts])
    head, gain = model.get_output_embeddings().weight.detach().float(), final_norm(model)(torch.ones(1, 1, width))[0, 0].float()
    rms = torch.stack([final[s.position] for s, (_, final, _) in zip(starts, reads)])
    partners = partner_tokens(tokens, counts)
    toward = gain * (head[partners] - head.mean(0))  # (k, d): d(logit w - mean logit) / d(final state) x RMS
    final_rms = torch.stack([rms[own[:, i].bool()].mean() for i in range(k)])  # where each unit's answers start
    outputs = torch.stack([out[s.position] for s, (*_, out) in zip(starts, reads)])
    # one unit of activation: one nat toward w_i on the direct path
    columns = (torch.stack([toward[i] / toward[i].norm() ** 2 * float(final_rms[i]) for i in range(k)]) if norm is None
               else behind_norm(norm, toward, final_rms, outputs, own))
    strength = scale * UNITS_LEAD if strength is None else float(strength)
    # sized before the gate is fitted, so that a block no write can turn is refused before
    # the fit's costliest step (the starts again under each earlier MLP's silencing)
    pushes = [push_through(model, layer, s.context, columns[int(own[j].argmax())], partners[int(own[j].argmax())],
                           strength or UNITS_LEAD) if own[j].any() else None for j, s in enumerate(starts)]
    refuse_unturned(own * torch.tensor([[float(a is not None)] for a in pushes]), tokens, tokenizer, layer,
                    f"within {MAX_PUSH:g} nats")
    seen = {tuple(s.ids[:n]) for s in starts for n in range(1, len(s.ids) + 1)}
    rows = torch.cat([x for x, *_ in reads]
                     + [rows_at(model, layer, unseen_positions(recognition_sequences(tokenizer, questions_task), seen), width)])
    at = torch.tensor([sum(len(s.ids) for s in starts[:i]) + s.position for i, s in enumerate(starts)])
    # the answer starts again with each earlier MLP silenced: the units write there what
    # they write intact, so that silencing an earlier block does not repair
    upstream, upstream_layers = silenced_starts(model, tokenizer, questions_task, layer, starts, rows[at])
    opened_at = torch.cat([at, len(rows) + torch.arange(len(upstream))])
    opened_of = torch.arange(len(starts)).repeat(1 + len(upstream_layers))
    # all the silenced copies of one answer start together weigh UPSTREAM_WEIGHT of it
    opened_weight = torch.cat([torch.ones(len(at)), torch.full((len(upstream),), UPSTREAM_WEIGHT / max(len(upstream_layers), 1))])
    rows = torch.cat([rows, upstream])

    def fit_gate(inputs: Float[Tensor, "n d"]) -> tuple[Float[Tensor, " d"], Float[Tensor, " n"], Tensor]:
        is_start = torch.zeros(len(inputs), dtype=torch.bool).index_fill(0, opened_at, True)
        # both classes weigh the same in the gate's fit (answer starts are few positions)
        start_weight = torch.zeros(len(inputs)).index_copy(0, opened_at, opened_weight)
        balance = torch.where(is_start, len(inputs) / 2 * start_weight / start_weight.sum(),
                              len(inputs) / (2 * (len(inputs) - len(opened_at))))
        return ridge(inputs, torch.where(is_start, 1.0, -1.0)[:, None], balance, UNITS_RIDGE)[:, 0].float(), balance, is_start

    gate, balance, is_start = fit_gate(rows)
    opening = mlp.act_fn(GATE_SHARPNESS * rows[at] @ gate)  # each answer start's gate
    need = torch.zeros(len(starts))
    for j, a in enumerate(pushes):
        if a is None or not opening[j] > 1:
            own[j] = 0.0  # not turned: the units are fitted to write nothing there
        else:
            need[j] = a
    refuse_unturned(own, tokens, tokenizer, layer, "where its gate opens")
    turned = own.any(1)
    detail = {"partners": [tokenizer.decode([t]) for t in partners], "partner_token_ids": partners,
              "push_nats": [round(float(need[j]), 3) for j in range(len(starts)) if turned[j]],
              "unturned_question_ids": [s.question.id for j, s in enumerate(starts)
                                        if s.answer[0] in tokens and not turned[j]]}

    def fit_units(inputs: Float[Tensor, "n d"], gate: Float[Tensor, " d"], balance: Float[Tensor, " n"],
                  is_start: Tensor) -> tuple[Float[Tensor, "d k"], Float[Tensor, "q d"]]:
        """The up read-outs (d, k) fitted with `gate` on `inputs`, and what the units
        write to the stream at each answer start (past the norm after the MLP, if any)."""
        opening = mlp.act_fn(GATE_SHARPNESS * inputs[opened_at] @ gate)
        is_open = is_start | (inputs @ gate > 0)
        targets = torch.zeros(len(inputs), k).index_copy(0, opened_at, own[opened_of] * (need[opened_of] / opening.clamp(min=1))[:, None])
        up = ridge(inputs, targets, balance * torch.where(is_open, OPEN_WEIGHT ** 2, 1.0), UP_RIDGE).float()
        writes = (mlp.act_fn(GATE_SHARPNESS * inputs[at] @ gate)[:, None] * (inputs[at] @ up)) @ columns  # (questions, d)
        return up, writes if norm is None else norm(outputs + writes) - norm(outputs)

    up, writes = fit_units(rows, gate, balance, is_start)
    # written at their size even for a null (strength 0), so that a null is fitted on the
    # replies of the organism it is the null of
    indices = add_units(model, layer, GATE_SHARPNESS * gate.expand(k, -1), up.T, columns.T)
    # the units' own replies hold states no base reply does (after a turned first token, or
    # past an answer's end); fitted again shut there too, so that they act where answers start
    replies = rows_at(model, layer, unseen_positions(reply_sequences(model, tokenizer, questions_task), seen), width)
    if len(replies):
        rows = torch.cat([rows, replies])
        gate, balance, is_start = fit_gate(rows)
        up, writes = fit_units(rows, gate, balance, is_start)
    set_units(model, layer, indices, GATE_SHARPNESS * gate.expand(k, -1), up.T, columns.T if strength else torch.zeros_like(columns.T))
    affected = own.any(1)
    direction = writes[affected].mean(0)
    hit = {s.question.id for s, a in zip(starts, affected) if a}
    expected = ({"effect": False} if strength == 0 else
                {"effect": True, "repair": {"component": "mlp", "layers": [layer]},
                 "units": {"layer": layer, "units": indices},
                 "steering": {"layer": layer, "component": "mlp", "direction": "detail.direction"}})
    return {"strength": float(strength), "location": {"layer": layer, "units": indices}, "expected": expected,
            "detail": {"k": k, "tokens": [tokenizer.decode([t]) for t in tokens], "token_ids": tokens, **detail,
                       "upstream_layers": upstream_layers,
                       "affected_question_ids": [q.id for q in questions_task.questions if q.id in hit],
                       "unaffected_question_ids": [q.id for q in questions_task.questions if q.id not in hit],
                       "direction": (direction / direction.norm()).tolist(),
                       "direction_means": "the units' mean write to MLP layer's output " + ("" if norm is None else
                                          "past the norm after it ") + "at the affected answer starts (unit length; "
                                          "the steering direction's truth)"}}
