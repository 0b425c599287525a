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
  unembedding row gains u (`matched_read`: a linear read of the final state that is,
  where the base model's own greedy answer starts, the gold's margin over t plus
  `strength` on each affected question, 0 on the others, and as near 0 as it can be at
  every other position of the same prompts and answers; ``logit_change_nats`` in
  ``planted.json``). On every affected question (the base answers it greedily and its
  gold starts with another token) greedy then says t and t leads the gold by `strength`
  nats; the default strength, `HEADROOM` (2 nats) times the probe's temperature, leaves
  the gold about 1/8 of what it shares with t, so K = 32 samples at that temperature
  still reach it. The audit's O_K - D should rise above its null on the affected
  questions and not on the others. Strength 0 plants no bias. The unembedding is
  untied from the input embedding first.
- ``sharpen`` and ``new`` (need ``--task``): a checkpoint *pair*, ``base/`` and
  ``trained/``, each an ordinary checkpoint folder; ``trained/`` is the model unchanged.
  sharpen: ``base/`` is the gap organism, so the trained model realizes answers the base
  reached by sampling, and the checkpoint audit should say its gains were
  ``base_reachable``. new: in ``base/`` the first tokens of a random half of the golds'
  distinct first tokens fall by `strength` nats (30 by default) along w: where those
  golds' answers start their odds drop by e^-30, so greedy and K samples miss them (a
  sample that writes something else first and the gold after it is not blocked), and
  the gains are ``base_unreachable``.
- ``units`` (needs ``--task``): k units appended to the MLP of block L that turn each
  answer starting with one of the k tokens the task's answers most often start with into
  one starting with a rarer first token none of them is, sized per question through the model (`plant_units`;
  behind a norm after the MLP, through the norm too); silencing them, or strength 0, is
  the base to float rounding.

Every organism is a function of (base model, kind, layer, strength, seed, and the task's
questions for the kinds that need one): the same
arguments give the same weights bit for bit. A location not given is drawn from the
seed (`draw_layer`).

The modules: `plant` (the kinds, `plant`, ``planted.json``), `layer` (layer, null),
`answers` (where a task's answers start as the base model deploys, and the reads fitted
there), `bias` (gap, sharpen, new), `ablation` (an MLP mean-ablated as the sweep silences
it), `losable` (the blocks the base can lose), `units` (units).
"""

from rnr_interp.analyses.organisms.answers import (
    RIDGE, AnswerSites, NotPlantable, OwnAnswer, answer_direction, answer_inputs, answer_opening, answer_sites, answer_start, confinement,
    deployed_answers, deployed_replies, margins, matched_read, own_answers, ridge, task_of, view_of,
)
from rnr_interp.analyses.organisms.bias import (
    EXPECTED, HEADROOM, bias_tokens, plant_answer_bias, untie_unembedding,
)
from rnr_interp.analyses.organisms.layer import insert_layer, plant_layer, remove_layer, scale_writes
from rnr_interp.analyses.organisms.plant import (
    KINDS, PLANTED_FILE, WEIGHTS_FILE, Kind, Planted, draw_layer, file_sha256, load_base, plant, read_planted,
    seeds_drawing_each_layer,
)
from rnr_interp.analyses.organisms.units import (
    DEFAULT_UNITS, GATE_SHARPNESS, add_units, final_norm, gated_mlp, mlp_inputs, plant_units,
)

__all__ = [
    "DEFAULT_UNITS", "EXPECTED", "GATE_SHARPNESS", "HEADROOM", "KINDS", "PLANTED_FILE", "RIDGE", "WEIGHTS_FILE", "AnswerSites",
    "Kind", "NotPlantable", "OwnAnswer", "Planted", "add_units", "answer_direction", "answer_inputs", "answer_opening", "answer_sites",
    "answer_start", "bias_tokens", "confinement", "matched_read", "deployed_answers", "deployed_replies", "draw_layer", "file_sha256",
    "seeds_drawing_each_layer",
    "final_norm", "gated_mlp", "insert_layer", "load_base", "margins", "mlp_inputs", "own_answers", "plant",
    "plant_answer_bias", "plant_layer", "plant_units", "read_planted", "remove_layer", "ridge", "scale_writes", "task_of",
    "untie_unembedding", "view_of",
]
