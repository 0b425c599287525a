"""Model organisms: a known effect planted in a real model, written as an ordinary
checkpoint folder, so that the analyses can be shown to find it (and to find nothing
where nothing was planted).

An organism is a Hugging Face checkpoint folder (safetensors, config, tokenizer) that
every command loads with ``--model CKPT`` like any other, plus ``planted.json``: the
ground truth (kind, location, strength, seed, the planted units or direction) and what
each analysis should report. Nothing reads ``planted.json`` to analyse the model; only a
comparison of findings against the truth does.

Kinds (`KINDS`):

- ``layer``: a copy of decoder layer L inserted at position L, its writes to the
  residual stream (attention and MLP outputs) scaled by the strength. Strength 1 is an
  exact duplicate (the issue's organism: SmolLM2 with layer 15 doubled); strength 0
  writes nothing, so the model computes what the base computes. Skipping or silencing
  position L gives back the base model exactly, at every strength (`remove_layer`
  undoes the edit on the weights).
- ``null``: the ``layer`` organism at strength 0 at a random location: the checkpoint
  has one more layer than the base and computes the same function; no analysis may
  report an effect.

- ``gap`` (needs ``--task``): a deployment bias toward one answer token t (the first
  answer token of a gold drawn from the seed). The unembedding row of t gains
  strength / |u| along u, the mean final state where the task's answers start (after the
  prompt and the opening of the answer statement, "Answer: "), so t's logit rises by
  `strength` nats there on average (the unembedding is untied from the input embedding
  first). On the questions whose gold starts with another token (``affected`` in
  ``planted.json``) greedy decoding says t where sampling still reaches the gold; the
  audit's O_K - D should rise above its null there and not on the others.

- ``units`` (needs ``--task``): k units appended to the MLP of block L that push each
  answer off the base model's own first answer token, for the k tokens the task's
  answers most often start with (`plant_units`); silencing them, or strength 0, is the
  base bit for bit.

Every organism is a function of (base model, kind, layer, strength, seed): the same
arguments give the same weights bit for bit. A location not given is drawn from the
seed (`draw_layer`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn

from rnr_interp.analyses.localise.recognition import answer_statement
from rnr_interp.engine.sampling import chunks
from rnr_interp.interventions import decoder_blocks
from rnr_interp.models import (
    TINY_ARCHITECTURES, LoadedModel, ModelSpecError, build_tiny, refuse_remote_code, smollm2_dir, stop_token_ids_of,
)
from rnr_interp.tasks import load_task
from rnr_interp.tasks.base import Question, Task

PLANTED_FILE = "planted.json"
#: the weights file `save_pretrained` writes (one shard at these sizes)
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class Planted:
    """The ground truth of one organism, as written to ``planted.json``."""

    kind: str
    base: str
    strength: float
    seed: int
    #: where the effect sits: {"layer": L} for the layer kinds
    location: dict[str, Any]
    n_layers_base: int
    n_layers: int
    #: what each analysis should report on this organism
    expected: dict[str, Any]
    task: str | None = None
    #: planted units or direction, for the kinds that have them
    detail: dict[str, Any] = field(default_factory=dict)
    #: sha256 of the weights file, so a rebuild from the seed can be checked bit for bit
    weights_sha256: str = ""


def load_base(spec: str) -> tuple[nn.Module, Any]:
    """The plain HF model and tokenizer of `spec`, in float32 on the CPU, without the
    bridge (an organism edits and saves the weights themselves): the demo model, a tiny
    test model (the weights `--model` gives it) or a local checkpoint folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name, _, arg = spec.partition(":")
    if name in TINY_ARCHITECTURES:
        return build_tiny(name, n_layers=int(arg) if arg.isdigit() else 3)
    folder = smollm2_dir() if spec == "smollm2" else Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        raise ModelSpecError(f"model spec {spec!r}: plant takes smollm2, a tiny test model or a local checkpoint folder "
                             "(config.json inside)")
    refuse_remote_code(folder)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32, trust_remote_code=False)
    return model.eval(), tok


def draw_layer(seed: int, n_layers: int) -> int:
    """A layer drawn from `seed`, uniform over the middle half of the model (a
    duplicate of the first or last layers is not the effect under study, and the sweep
    runs there too)."""
    lo, hi = n_layers // 4, max(n_layers // 4 + 1, (3 * n_layers) // 4)
    return int(np.random.default_rng(seed).integers(lo, hi))


# -- the layer organism ------------------------------------------------------------


def _residual_writers(block: nn.Module) -> list[tuple[nn.Module, str]]:
    """The modules through which a decoder block writes to the residual stream, and how
    to scale each: "linear" (an output projection: weight and bias), "gain" (a
    post-norm's weight) or "gemma_gain" (Gemma's post-norm, which multiplies by
    1 + weight)."""
    post = [getattr(block, name, None) for name in ("post_attention_layernorm", "post_feedforward_layernorm")]
    if post[1] is not None:  # OLMo 2 / Gemma 2-3: the norm after each sublayer sets its output's scale
        # (OLMo 2 calls its post-attention norm post_attention_layernorm as well)
        return [(norm, "gemma_gain" if "Gemma" in type(norm).__name__ else "gain") for norm in post]
    for attn, mlp in (("self_attn.o_proj", "mlp.down_proj"), ("attn.c_proj", "mlp.c_proj")):
        try:
            return [(block.get_submodule(attn), "linear"), (block.get_submodule(mlp), "linear")]
        except AttributeError:
            continue
    raise ModelSpecError(f"cannot plant in {type(block).__name__}: no attention/MLP output projection found")


@torch.no_grad()
def scale_writes(block: nn.Module, strength: float) -> None:
    """Scale everything `block` adds to the residual stream by `strength` (0: the block
    adds exactly zero and is the identity)."""
    for module, how in _residual_writers(block):
        if how == "linear":
            module.weight.mul_(strength)
            if getattr(module, "bias", None) is not None:
                module.bias.mul_(strength)
        elif how == "gain":
            module.weight.mul_(strength)
        else:  # (1 + w) * s = 1 + (s (1 + w) - 1)
            module.weight.copy_(strength * (1 + module.weight) - 1)


def _set_layer_count(model: nn.Module, blocks: nn.ModuleList, layer_types: list[str] | None) -> None:
    config = model.config.get_text_config()
    config.num_hidden_layers = len(blocks)
    if layer_types is not None:
        config.layer_types = layer_types
    for index, block in enumerate(blocks):  # the KV cache index of each attention
        for module in block.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = index


def insert_layer(model: nn.Module, layer: int, strength: float) -> None:
    """Insert a copy of decoder layer `layer` at position `layer` (in place), its
    residual writes scaled by `strength`."""
    blocks = decoder_blocks(model)
    if not 0 <= layer < len(blocks):
        raise ValueError(f"--layer must be in 0..{len(blocks) - 1} (the base model's layers), got {layer}")
    extra = copy.deepcopy(blocks[layer])
    scale_writes(extra, strength)
    blocks.insert(layer, extra)
    types = getattr(model.config.get_text_config(), "layer_types", None)
    _set_layer_count(model, blocks, None if types is None else [*types[:layer], types[layer], *types[layer:]])


def remove_layer(model: nn.Module, layer: int) -> None:
    """Delete decoder layer `layer` (in place): undoes `insert_layer`."""
    blocks = decoder_blocks(model)
    del blocks[layer]
    types = getattr(model.config.get_text_config(), "layer_types", None)
    _set_layer_count(model, blocks, None if types is None else [*types[:layer], *types[layer + 1:]])


def _layer_expectations(layer: int, strength: float) -> dict[str, Any]:
    if strength == 0:
        return {"effect": False}
    # at strength 1 the copy and the original are the same block: removing either is the base
    equivalent = [layer, layer + 1] if strength == 1 else [layer]
    return {"effect": True, "repair": {"component": "layer", "layers": equivalent},
            "route": {"space": "skiponly", "skip": equivalent}}


def plant_layer(model: nn.Module, tokenizer: Any, *, layer: int, strength: float, seed: int, task: str | None) -> dict[str, Any]:
    insert_layer(model, layer, strength)
    return {"location": {"layer": layer}, "expected": _layer_expectations(layer, strength)}


# -- the realization-gap organism ----------------------------------------------------


def task_of(task: str | Task | None, kind: str) -> Task:
    """The task an organism is made for: given, or loaded by name."""
    if task is None:
        raise ValueError(f"kind {kind!r} acts where a task's answers start: give --task")
    return task if isinstance(task, Task) else load_task(task)


def answer_opening(task: Task) -> str:
    """What the task's answer statement says before the answer ("Answer: ")."""
    return answer_statement(task).split("{}", 1)[0]


def answer_inputs(tokenizer: Any, task: Task, question: Question, chat: bool, bos: bool) -> tuple[list[int], list[int]]:
    """The token ids up to where `question`'s answer starts (its deployed prompt, then the
    opening of the answer statement), and the gold answer's tokens after them."""
    view = LoadedModel(spec="", bridge=None, tokenizer=tokenizer, stop_token_ids=(), chat=chat, meta={"prepend_bos": bos})
    context = view.encode(view.render(task.user_message(question)) + answer_opening(task))
    whole = view.encode(view.render(task.user_message(question)) + answer_opening(task) + question.answer)
    return context, whole[len(context):]


@torch.no_grad()
def answer_states(model: nn.Module, contexts: list[list[int]]) -> Float[Tensor, "q d"]:
    """The final hidden state (after the final norm, what the unembedding reads) at the
    last position of each context: where the answer's first token is chosen."""
    rows = []
    for ids in contexts:
        hidden = model.base_model(input_ids=torch.tensor([ids])).last_hidden_state
        rows.append(hidden[0, -1].float())
    return torch.stack(rows)


def untie_unembedding(model: nn.Module) -> None:
    """Give the unembedding its own weights (a tied one is the input embedding too, and
    a bias toward a token there would change how every prompt containing it is read)."""
    config = model.config.get_text_config()
    if getattr(model.config, "tie_word_embeddings", False) or getattr(config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False
        config.tie_word_embeddings = False
        head = model.get_output_embeddings()
        head.weight = nn.Parameter(head.weight.detach().clone())


def plant_gap(model: nn.Module, tokenizer: Any, *, layer: int, strength: float, seed: int, task: str | Task | None) -> dict[str, Any]:
    """A deployment bias toward one answer token: the unembedding row of token t gains
    `strength` / |u| along u, the mean final state where the task's answers start, so t's
    logit there rises by about `strength` nats (less where the state is unlike the mean).
    t is the first answer token of a gold drawn from the seed; on questions whose gold
    starts otherwise, greedy decoding now says t where sampling still reaches the gold."""
    questions_task = task_of(task, "gap")
    # as a checkpoint folder loads: its tokenizer says whether a raw prompt starts with BOS
    chat, bos = bool(getattr(tokenizer, "chat_template", None)), bool(getattr(tokenizer, "add_bos_token", False))
    inputs = [answer_inputs(tokenizer, questions_task, q, chat, bos) for q in questions_task.questions]
    firsts = [answer[0] for _, answer in inputs if answer]
    if not firsts:
        raise ValueError(f"task {task!r}: no gold answer has a token to bias against")
    token = int(np.random.default_rng(seed).choice(sorted(set(firsts))))
    mean = answer_states(model, [context for context, _ in inputs]).mean(0)
    untie_unembedding(model)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[token] += (strength * mean / mean.norm() ** 2).to(head.dtype)
    affected = [q.id for q, (_, answer) in zip(questions_task.questions, inputs) if answer and answer[0] != token]
    unaffected = [q.id for q, (_, answer) in zip(questions_task.questions, inputs) if not answer or answer[0] == token]
    expected = ({"effect": False} if strength == 0 else
                {"effect": True, "audit": {"gap_above_null_on": "affected", "no_gap_change_on": "unaffected"}})
    return {"location": {"token_id": token, "token": tokenizer.decode([token])}, "expected": expected,
            "detail": {"affected_question_ids": affected, "unaffected_question_ids": unaffected,
                       "answer_opening": answer_opening(questions_task), "direction": "mean final state at the answer position"}}


# -- the units organism ----------------------------------------------------------------

#: the planted units when --units is not given (`plant_units`)
DEFAULT_UNITS = 3
#: how sharply a planted unit's gate opens: its gate reads +GATE_SHARPNESS where answers
#: start and -GATE_SHARPNESS elsewhere (silu(-8) is -0.003: shut)
GATE_SHARPNESS = 8.0


@dataclass(frozen=True)
class AnswerStart:
    """Where the base model, asked `question` and decoding greedily, starts its answer."""

    question: Question
    #: the prompt and the greedy reply, as token ids
    ids: list[int]
    #: the position whose next token is the answer's first (its state chooses it)
    position: int
    token: int


@torch.no_grad()
def answer_starts(model: nn.Module, tokenizer: Any, task: Task, chat: bool, bos: bool,
                  batch_size: int = 16) -> list[AnswerStart | None]:
    """For each question of `task`, the base model's greedy reply and the position where
    the answer it extracts begins (None when the reply has no answer, or the answer is
    not found in it as written). Batches are padded on the left."""
    view = LoadedModel(spec="", bridge=None, tokenizer=tokenizer, stop_token_ids=(), chat=chat, meta={"prepend_bos": bos})
    stops = stop_token_ids_of(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops or (0,))[0]
    out: list[AnswerStart | None] = []
    for batch in chunks(list(task.questions), batch_size):
        prompts = [view.encode(view.render(task.user_message(q))) for q in batch]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        replies = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=task.max_new_tokens,
                                 eos_token_id=list(stops) or None, pad_token_id=pad)[:, width:].tolist()
        for q, prompt, reply in zip(batch, prompts, replies):
            reply = reply[:next((i for i, t in enumerate(reply) if t in stops), len(reply))]
            text = tokenizer.decode(reply, skip_special_tokens=True)
            answer = task.extract(text)
            at = -1 if not answer else text.find(answer)
            if at < 0:
                out.append(None)
                continue
            # the first reply token whose text reaches past where the answer begins
            first = next(j for j in range(len(reply)) if len(tokenizer.decode(reply[:j + 1], skip_special_tokens=True)) > at)
            out.append(AnswerStart(q, prompt + reply, len(prompt) + first - 1, reply[first]))
    return out


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


def ridge(x: Float[Tensor, "n d"], y: Float[Tensor, "n m"], weight: Float[Tensor, "n"] | None = None) -> Float[Tensor, "d m"]:
    """The weighted least-squares read-out of `y` from `x`, ridge 1e-4 of the mean
    eigenvalue (the fits below have more dimensions than positions on a real model)."""
    w = torch.ones(len(x), dtype=torch.float64) if weight is None else weight.double()
    x64, y64 = x.double(), y.double()
    gram = x64.T @ (w[:, None] * x64)
    gram += 1e-4 * gram.trace() / len(gram) * torch.eye(len(gram), dtype=torch.float64)
    return torch.linalg.solve(gram, x64.T @ (w[:, None] * y64)).float()


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
def plant_units(model: nn.Module, tokenizer: Any, *, layer: int, strength: float, seed: int, task: str | Task | None,
                units: int | None = None) -> dict[str, Any]:
    """k units added to MLP `layer` that push the greedy answer off the base model's own
    first answer token, for the k tokens the task's answers most often start with (a
    gated negative copy). Where the base, decoding greedily, starts its answer (the
    state whose next token is the answer's first: `answer_starts`), each unit i reads
    two things from the MLP's input: its gate, a read-out fitted to be +1 at every
    answer start and -1 at every other position of the prompts and replies (sharpened
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
    units (or strength 0: their writes are zero) computes what the base computes."""
    questions_task = task_of(task, "units")
    k = DEFAULT_UNITS if units is None else int(units)
    if k < 1:
        raise ValueError(f"--units must be at least 1, got {k}")
    mlp = gated_mlp(decoder_blocks(model)[layer])
    chat, bos = bool(getattr(tokenizer, "chat_template", None)), bool(getattr(tokenizer, "add_bos_token", False))
    starts = [s for s in answer_starts(model, tokenizer, questions_task, chat, bos) if s is not None]
    counts: dict[int, int] = {}
    for s in starts:
        counts[s.token] = counts.get(s.token, 0) + 1
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
    gate = ridge(inputs, torch.where(is_start, 1.0, -1.0)[:, None], balance)[:, 0]
    own = torch.tensor([[float(s.token == t) for t in tokens] for s in starts])
    # 1 at its own answer starts and 0 at the others, where the gate is open (so these
    # weigh 100 times as much as in the gate's fit), and 0 at every other position: a
    # second filter where the gate leaks
    up = ridge(inputs, torch.zeros(len(inputs), k).index_copy(0, at, own), balance * torch.where(is_start, 100.0, 1.0))
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


@dataclass(frozen=True)
class Kind:
    planter: Callable[..., dict[str, Any]]
    #: the strength when none is given
    strength: float
    #: strength 0 at a drawn layer, always (takes neither --layer nor --strength)
    null: bool = False
    takes_layer: bool = True
    #: takes --units (how many units to plant)
    takes_units: bool = False


KINDS: dict[str, Kind] = {
    "layer": Kind(plant_layer, 1.0),
    "null": Kind(plant_layer, 0.0, null=True),
    # 8 nats: the biased token's logit at the mean answer state rises by e^8 ~ 3000 times
    "gap": Kind(plant_gap, 8.0, takes_layer=False),
    # 8 nats at the answer start: above the base's top-1 margin there on the test models
    # and for a confident answer of a small instruct model, so the k tokens' questions flip
    "units": Kind(plant_units, 8.0, takes_units=True),
}


def plant(kind: str, base: str, out: Path, *, layer: int | None = None, strength: float | None = None, seed: int = 0,
          task: str | Task | None = None, units: int | None = None) -> Planted:
    """Build the organism `kind` from the model `base` and write it to `out` (a new
    folder, made whole or not at all): the checkpoint and its ``planted.json``. `task`:
    a task name, or the task itself (its name is recorded); `units`: how many units the
    ``units`` kind plants."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    spec = KINDS[kind]
    if spec.null and (layer is not None or strength not in (None, 0)):
        raise ValueError(f"kind {kind!r} is strength 0 at a layer drawn from --seed: it takes neither --layer nor --strength")
    if not spec.takes_layer and layer is not None:
        raise ValueError(f"kind {kind!r} is not planted at a layer: it takes no --layer")
    if not spec.takes_units and units is not None:
        raise ValueError(f"kind {kind!r} plants no units: it takes no --units")
    strength = spec.strength if strength is None else float(strength)
    if not np.isfinite(strength):
        raise ValueError(f"--strength must be a finite number, got {strength}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} exists and is not an empty folder (an organism is written to a new folder)")
    model, tokenizer = load_base(base)
    n_base = len(decoder_blocks(model))
    if layer is None:
        layer = draw_layer(seed, n_base)
    torch.manual_seed(seed)
    found = spec.planter(model, tokenizer, layer=layer, strength=strength, seed=seed, task=task,
                         **({"units": units} if spec.takes_units else {}))
    partial = out.with_name(out.name + ".part")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    planted = Planted(kind=kind, base=base, strength=strength, seed=seed, n_layers_base=n_base,
                      n_layers=len(decoder_blocks(model)), task=task.name if isinstance(task, Task) else task,
                      weights_sha256=file_sha256(partial / WEIGHTS_FILE),
                      **found)
    (partial / PLANTED_FILE).write_text(json.dumps(asdict(planted), indent=1) + "\n")
    if out.exists():
        out.rmdir()  # empty, checked above
    os.replace(partial, out)
    return planted


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def read_planted(folder: Path) -> Planted:
    """The ground truth of an organism folder."""
    path = Path(folder) / PLANTED_FILE
    try:
        return Planted(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"{str(path)!r} is not an organism's {PLANTED_FILE} ({exc})") from None
