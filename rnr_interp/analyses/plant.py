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
  answer token of a gold drawn from the seed), confined to where the answers start: t's
  unembedding row gains `strength` * w, w the answer direction (`answer_direction`: a
  linear read that is 1 on average at the final states where the base model's own
  greedy answers start and as near 0 as it can be at every other position of the same
  prompts and answers), so t's logit rises by `strength` nats at the answer position on
  average and by a fraction of that elsewhere (``logit_change_nats`` in
  ``planted.json``). The default strength is calibrated: the median margin by which the
  greedy choice there leads t on the affected questions, plus `HEADROOM` (2 nats). On
  the questions whose gold starts with another token (``affected``) greedy says t where
  sampling still reaches the gold; the audit's O_K - D should rise above its null there
  and not on the others. The unembedding is untied from the input embedding first.
- ``sharpen`` and ``new`` (need ``--task``): a checkpoint *pair*, ``base/`` and
  ``trained/``, each an ordinary checkpoint folder; ``trained/`` is the model unchanged.
  sharpen: ``base/`` is the gap organism, so the trained model realizes answers the base
  reached by sampling, and the checkpoint audit should say its gains were
  ``base_reachable``. new: in ``base/`` the first tokens of a random half of the golds'
  distinct first tokens fall by `strength` nats (30 by default) along w: where those
  golds' answers start their odds drop by e^-30, so greedy and K samples miss them (a
  sample that writes something else first and the gold after it is not blocked), and
  the gains are ``base_unreachable``.

Every organism is a function of (base model, kind, layer, strength, seed, and the task's
questions for the answer-bias kinds): the same
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
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn

from rnr_interp.analyses.localise.recognition import answer_statement
from rnr_interp.interventions import decoder_blocks
from rnr_interp.models import (
    BUILTIN, TINY_ARCHITECTURES, LoadedModel, ModelSpecError, build_tiny, refuse_remote_code, tokenizer_adds_bos,
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
    folder = BUILTIN[spec].checkpoint_dir() if spec in BUILTIN else Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        raise ModelSpecError(f"model spec {spec!r}: plant takes a built-in model ({', '.join(BUILTIN)}), a tiny test model "
                             "or a local checkpoint folder "
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


def plant_layer(model: nn.Module, tokenizer: Any, *, layer: int, strength: float, scale: float, seed: int,
                task: str | Task | None) -> dict[str, Any]:
    """(`scale` is in `strength` already: `plant` applies it to a fixed strength.)"""
    insert_layer(model, layer, strength)
    return {"location": {"layer": layer}, "expected": _layer_expectations(layer, strength)}


# -- the answer position: where a task's answers start, and a bias confined there --------


def answer_opening(task: Task) -> str:
    """What the task's answer statement says before the answer ("Answer: ")."""
    return answer_statement(task).split("{}", 1)[0]


def _view(tokenizer: Any, chat: bool, bos: bool) -> LoadedModel:
    return LoadedModel(spec="", bridge=None, tokenizer=tokenizer, stop_token_ids=(), chat=chat, meta={"prepend_bos": bos})


def answer_inputs(tokenizer: Any, task: Task, question: Question, chat: bool, bos: bool,
                  opening: str | None = None) -> tuple[list[int], list[int]]:
    """The token ids up to where `question`'s answer starts (its deployed prompt, then
    `opening`: what is written before the answer, by default the task's answer opening),
    and the gold answer's tokens after them. Whitespace ending the opening goes with the
    answer, as a tokenizer that writes " 42" as one token reads it."""
    view = _view(tokenizer, chat, bos)
    opening = answer_opening(task) if opening is None else opening
    prompt = view.render(task.user_message(question))
    context = view.encode(prompt + opening.rstrip())
    whole = view.encode(prompt + opening + question.answer)
    return context, whole[len(context):]


@torch.no_grad()
def deployed_openings(model: nn.Module, tokenizer: Any, task: Task, chat: bool, bos: bool) -> list[str]:
    """Per question, what the model's own greedy generation writes before its answer
    (the answer as the task reads it, located in the text): "" when it answers at once,
    "Answer: " or a line of working otherwise; the task's answer opening when the
    generation holds no answer it reads."""
    view, openings = _view(tokenizer, chat, bos), []
    for q in task.questions:
        ids = torch.tensor([view.encode(view.render(task.user_message(q)))])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=task.max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        at = answer_start(task, q, text)
        openings.append(answer_opening(task) if at is None else text[:at])
    return openings


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
    generations locate each answer start (`deployed_openings`), and one forward pass over
    prompt, opening and gold answer gives the final states there and everywhere else."""
    # as a checkpoint folder loads: its tokenizer says whether a raw prompt starts with BOS
    chat, bos = bool(getattr(tokenizer, "chat_template", None)), tokenizer_adds_bos(tokenizer)
    openings = deployed_openings(model, tokenizer, task, chat, bos)
    answer, elsewhere, firsts = [], [], []
    for q, opening in zip(task.questions, openings):
        context, gold = answer_inputs(tokenizer, task, q, chat, bos, opening)
        hidden = model.base_model(input_ids=torch.tensor([context + gold])).last_hidden_state[0].float()
        at = len(context) - 1
        answer.append(hidden[at])
        elsewhere.append(torch.cat([hidden[:at], hidden[at + 1:]]))
        firsts.append(gold[0] if gold else None)
    states = torch.stack(answer)
    logits = model.get_output_embeddings()(states.to(model.get_output_embeddings().weight.dtype)).float()
    return AnswerSites([q.id for q in task.questions], openings, firsts, states, torch.cat(elsewhere), logits)


#: ridge of the answer direction's fit, relative to the mean squared state norm
RIDGE = 1e-3


def answer_direction(sites: AnswerSites) -> Float[Tensor, " d"]:
    """w with w . h = 1 on average where the answers start and as near 0 as a linear read
    allows at every other position: the class-balanced ridge regression of (1 at the
    answer states, 0 elsewhere) on the final states, rescaled to mean 1 at the answer
    states. A bias `strength` * w on a token's unembedding row then moves its logit by
    `strength` nats at the answer position on average and by `strength` * (w . h) at
    any other state h. (The mean answer state alone is not confined: states elsewhere
    resemble it, and SmolLM2 answered a run of 8s at every step under that bias.)"""
    pos, neg = sites.answer.double(), sites.elsewhere.double()
    second = pos.T @ pos / len(pos) + neg.T @ neg / len(neg)
    ridge = RIDGE * torch.trace(second) / second.shape[0]
    w = torch.linalg.solve(second + ridge * torch.eye(second.shape[0], dtype=second.dtype), pos.mean(0))
    return (w / (pos @ w).mean()).float()


def confinement(sites: AnswerSites, direction: Float[Tensor, " d"], strength: float) -> dict[str, float]:
    """How a bias of `strength` along `direction` moves a logit, in nats: at the answer
    position (mean, least) and elsewhere (root mean square, largest), and the ratio of
    the answer mean to the RMS elsewhere."""
    at, off = strength * (sites.answer @ direction), strength * (sites.elsewhere @ direction)
    rms = float(off.pow(2).mean().sqrt())
    return {"answer_mean": float(at.mean()), "answer_min": float(at.min()), "elsewhere_rms": rms,
            "elsewhere_max_abs": float(off.abs().max()), "ratio": float(at.mean()) / rms if rms else float("inf")}


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


def margins(sites: AnswerSites, token: int) -> Float[Tensor, " q"]:
    """Per question, how many nats the base model's greedy choice where the answer
    starts leads `token` by (0 where `token` is the greedy choice)."""
    return sites.logits.max(-1).values - sites.logits[:, token]


# -- the realization-gap organism and the checkpoint pairs ------------------------------

#: nats above the median margin a calibrated bias toward t sets: t then leads the old
#: greedy choice by e^2 ~ 7 times, so a gold that was greedy keeps >= 1/8 of the mass
#: and K = 32 samples at T = 1 still reach it (1 - (7/8)^32 ~ 0.99)
HEADROOM = 2.0


def _questions(task: str | Task | None, kind: str) -> Task:
    if task is None:
        raise ValueError(f"kind {kind!r} biases the answer position of a task's questions: give --task")
    return task if isinstance(task, Task) else load_task(task)


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
    questions = _questions(task, kind)
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


@dataclass(frozen=True)
class Kind:
    planter: Callable[..., dict[str, Any]]
    #: the strength when none is given (None: calibrated on the model by the planter)
    strength: float | None
    #: strength 0 at a drawn layer, always (takes neither --layer nor --strength)
    null: bool = False
    takes_layer: bool = True
    #: a checkpoint pair: ``base/`` the planted model, ``trained/`` the model unchanged
    pair: bool = False


KINDS: dict[str, Kind] = {
    "layer": Kind(plant_layer, 1.0),
    "null": Kind(plant_layer, 0.0, null=True),
    # calibrated: HEADROOM nats past the median margin the bias must overcome
    "gap": Kind(partial(plant_answer_bias, kind="gap"), None, takes_layer=False),
    "sharpen": Kind(partial(plant_answer_bias, kind="sharpen"), None, takes_layer=False, pair=True),
    # 30 nats below: a gold first token with 1 - 1e-7 of the mass keeps under 1e-5 of it,
    # and K = 32 samples reach it with probability under 1e-3
    "new": Kind(partial(plant_answer_bias, kind="new"), 30.0, takes_layer=False, pair=True),
}


def plant(kind: str, base: str, out: Path, *, layer: int | None = None, strength: float | None = None, seed: int = 0,
          task: str | Task | None = None, scale: float = 1.0) -> Planted:
    """Build the organism `kind` from the model `base` and write it to `out` (a new
    folder, made whole or not at all): the checkpoint and its ``planted.json``; for a
    pair kind, the checkpoints ``base/`` (planted) and ``trained/`` (the model unchanged)
    beside the pair's ``planted.json``. `scale` multiplies the strength, given, default or
    calibrated (validate's profiles)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    spec = KINDS[kind]
    if spec.null and (layer is not None or strength not in (None, 0)):
        raise ValueError(f"kind {kind!r} is strength 0 at a layer drawn from --seed: it takes neither --layer nor --strength")
    if not spec.takes_layer and layer is not None:
        raise ValueError(f"kind {kind!r} is not planted at a layer: it takes no --layer")
    if strength is None and spec.strength is not None:
        strength = spec.strength
    if strength is not None:
        strength = scale * float(strength)
        if not np.isfinite(strength):
            raise ValueError(f"--strength must be a finite number, got {strength}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} exists and is not an empty folder (an organism is written to a new folder)")
    model, tokenizer = load_base(base)
    n_base = len(decoder_blocks(model))
    if layer is None:
        layer = draw_layer(seed, n_base)
    unchanged = copy.deepcopy(model) if spec.pair else None
    torch.manual_seed(seed)
    found = spec.planter(model, tokenizer, layer=layer, strength=strength, scale=scale, seed=seed, task=task)
    strength = found.pop("strength", strength)
    building = out.with_name(out.name + ".part")
    shutil.rmtree(building, ignore_errors=True)
    planted_folder = building / "base" if spec.pair else building
    model.save_pretrained(planted_folder)
    tokenizer.save_pretrained(planted_folder)
    if unchanged is not None:
        unchanged.save_pretrained(building / "trained")
        tokenizer.save_pretrained(building / "trained")
        found["detail"]["trained_weights_sha256"] = file_sha256(building / "trained" / WEIGHTS_FILE)
    planted = Planted(kind=kind, base=base, strength=strength, seed=seed, n_layers_base=n_base,
                      n_layers=len(decoder_blocks(model)), task=task.name if isinstance(task, Task) else task,
                      weights_sha256=file_sha256(planted_folder / WEIGHTS_FILE), **found)
    (building / PLANTED_FILE).write_text(json.dumps(asdict(planted), indent=1) + "\n")
    if out.exists():
        out.rmdir()  # empty, checked above
    os.replace(building, out)
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
