"""The decoding engine: batched, KV-cached generation through the bridge with the
hook registry active.

One call prefills B prompts once, then fans each prompt out to `n` sample rows that
share its KV cache (column j of a prompt may use its own temperature, so the deployed
greedy candidate and the K probe samples come from one prefill). Rows stop at the
model's stop tokens or at a stop string; finished rows leave the batch in groups
(`COMPACT_SHARE`), and the batch ends when every row is done. The cache (`new_cache`)
writes each step in place instead of copying itself per step as transformers'
`DynamicCache` does.

Sampling is reproducible row by row: each (prompt, column) has its own seed, from which
all of its uniforms are drawn up front, and a token is drawn by inverting the CDF of the
(top-p truncated, tempered) distribution. A candidate therefore depends on its seed and
prompt only, not on what else shared its batch.

It meets `decoding.Engine`, the contract `vllm_backend.generate` meets too.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from rnr_interp.engine.decoding import Decoding, Generation, cut_at_stop, plan_columns
from rnr_interp.engine.batch import Batch, batch_applied, replaying
from rnr_interp.interventions import Intervention, applied, capturing, sequence_span, site_hook
from rnr_interp.models import LoadedModel


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device=None) -> tuple[Int[Tensor, "b t"], Int[Tensor, "b t"]]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s) == 0:
            raise ValueError("empty prompt")
        ids[i, width - len(s):] = torch.tensor(list(s), dtype=torch.long)
        mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)


def forward(
    lm: LoadedModel, ids: Int[Tensor, "b t"], mask: Int[Tensor, "b total"], cache=None, last_only: bool = False,
    prompt_end: int | None = None,
) -> tuple[Float[Tensor, "b t_out v"], object]:
    """One bridge forward over `ids` (the last t positions of `mask`), extending `cache`.
    Positions come from the mask, so left padding does not shift them. `last_only`
    unembeds the last position alone (t_out = 1): a prefill needs nothing else, and the
    vocabulary projection of every prompt position dominates its cost. `prompt_end`:
    the sequence index of the prompt's last position, for interventions confined to it
    (`interventions.sequence_span`; None: the call's last position)."""
    lm.check_fits(mask.shape[1], "a sequence")
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1]:]
    extra = {"logits_to_keep": 1} if last_only else {}
    with sequence_span(mask.shape[1] - ids.shape[1], prompt_end):
        if cache is None:
            logits = lm.bridge(ids, attention_mask=mask, position_ids=positions, **extra)
            return logits, None
        logits, cache = lm.bridge(ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                                  return_type="logits_and_cache", **extra)
    return logits, cache


@torch.inference_mode()
def last_logits(lm: LoadedModel, prompts: Sequence[Sequence[int]], interventions: Sequence[Intervention] = ()) -> Float[Tensor, "n v"]:
    """Next-token logits after each prompt, with one intervention set for all rows."""
    ids, mask = left_pad(prompts, lm.pad_id, lm.device)
    with applied(lm, list(interventions)):
        return forward(lm, ids, mask, last_only=True)[0][:, -1].float()


def new_cache():
    from transformers import DynamicCache

    # No config: layers are appended as slots are first written, so a route longer
    # than the model (repeats) gets one slot per position.
    cache = DynamicCache()
    cache.layer_class_to_replicate = _growing_layer_class()
    return cache


#: free positions a cache layer keeps after its last token (a new buffer every this many steps)
CACHE_HEADROOM = 32


@functools.cache
def _growing_layer_class():
    """`DynamicLayer` appends by `torch.cat`, copying a layer's whole cache every
    decoding step (and the K rows of a fanned-out prompt each hold a copy). This layer
    keeps keys and values in a buffer with `CACHE_HEADROOM` free positions and writes a
    step's token in place; `keys`/`values` are views of the filled part, and the batch
    selections (rows fanned out, finished rows leaving) act on the buffer, headroom and
    all. A position once written is never rewritten: whenever anything else replaces
    `keys` (crop, reset, offload: DynamicLayer's own methods), the next update copies into
    a fresh buffer, so views handed out earlier (`prompt_states`) keep their values."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        _key_buffer: Float[Tensor, "batch kv_heads capacity d_head"] | None = None
        _value_buffer: Float[Tensor, "batch kv_heads capacity d_head"] | None = None
        #: the `keys`, `values` views this layer last handed out (anything else there: rebuffer)
        _views: tuple[Tensor, Tensor] | None = None

        def update(self, key_states: Float[Tensor, "batch kv_heads new d_head"],
                   value_states: Float[Tensor, "batch kv_heads new d_head"], *args, **kwargs):
            if torch.is_grad_enabled() and (key_states.requires_grad or value_states.requires_grad):
                return super().update(key_states, value_states, *args, **kwargs)  # no in-place writes under autograd
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, end = self.get_seq_length(), self.get_seq_length() + key_states.shape[-2]
            if (not self._holds_views() or end > self._key_buffer.shape[-2]
                    or self._key_buffer.shape[:-2] != key_states.shape[:-2]):
                self._key_buffer = _rebuffer(self.keys, key_states, end)
                self._value_buffer = _rebuffer(self.values, value_states, end)
            self._key_buffer[..., n:end, :] = key_states
            self._value_buffer[..., n:end, :] = value_states
            self._show(end)
            return self.keys, self.values

        def batch_repeat_interleave(self, repeats: int) -> None:
            if not self._holds_views():
                return super().batch_repeat_interleave(repeats)
            self._key_buffer = self._key_buffer.repeat_interleave(repeats, dim=0)
            self._value_buffer = self._value_buffer.repeat_interleave(repeats, dim=0)
            self._show(self.get_seq_length())

        def batch_select_indices(self, indices: Tensor) -> None:
            if not self._holds_views():
                return super().batch_select_indices(indices)
            self._key_buffer, self._value_buffer = self._key_buffer[indices], self._value_buffer[indices]
            self._show(self.get_seq_length())

        def get_seq_length(self) -> int:
            # The filled length also for an entry of no rows (a route position that
            # none of the batch's rows runs): the masks read it from entry 0.
            return self.keys.shape[-2] if self._holds_views() else super().get_seq_length()

        def _holds_views(self) -> bool:
            return self._views is not None and self.keys is self._views[0] and self.values is self._views[1]

        def _show(self, length: int) -> None:
            self.keys, self.values = self._key_buffer[..., :length, :], self._value_buffer[..., :length, :]
            self._views = (self.keys, self.values)

    return GrowingLayer


def _rebuffer(filled: Tensor, incoming: Tensor, length: int) -> Tensor:
    """A buffer for `length` positions plus the headroom, holding `filled` at its start."""
    buffer = incoming.new_empty((*incoming.shape[:-2], length + CACHE_HEADROOM, incoming.shape[-1]))
    if filled.numel():
        buffer[..., :filled.shape[-2], :] = filled
    return buffer


@dataclass
class PromptStates:
    """The full path's prefill of one prompt, unpadded: the residual stream entering
    each block and each block's keys/values. A row that runs blocks 0..p-1 unchanged (a
    route that starts like the full path, an intervention in block p or later) reuses
    the first p of them instead of recomputing its prefill there."""

    resid_pre: Float[Tensor, "layer_plus_1 pos d_model"]
    keys: list[Float[Tensor, "kv_heads pos d_head"]]
    values: list[Float[Tensor, "kv_heads pos d_head"]]


def replay_pays(lm: LoadedModel) -> bool:
    """Whether replaying stored prefills (`prompt_states`) is worth it on `lm`'s device,
    for callers that leave the choice to the device. On a CPU the replayed blocks are
    arithmetic saved: a silencing sweep on the demo model ran 1.26x faster with it. On a
    GPU the arithmetic is nearly free and the prefill runs once per group of rows
    instead of once: the same sweep ran 0.61-0.82x as fast with it on an H200
    (README, "Silencing sweep cost"). So it is on for the CPU only."""
    return lm.device.type == "cpu"


@torch.inference_mode()
def prompt_states(lm: LoadedModel, prompts: Sequence[Sequence[int]]) -> list[PromptStates]:
    """One batched full-path prefill, kept per prompt for later routes and
    interventions to reuse."""
    ids, mask = left_pad(prompts, lm.pad_id, lm.device)
    L = lm.n_layers
    # Entry l is the residual entering block l; entry L is the last block's output.
    names = [site_hook(lm, "hook_resid_pre", l) for l in range(L)] + [site_hook(lm, "hook_resid_post", L - 1)]
    with capturing(lm, names) as got:
        _, cache = forward(lm, ids, mask, new_cache(), last_only=True)
    resid = [got[name][0] for name in names]
    layers = [cache.layers[i] for i in range(lm.n_layers)]
    states = []
    for b, prompt in enumerate(prompts):
        t = len(prompt)
        states.append(PromptStates(
            resid_pre=torch.stack([resid[l][b, -t:] for l in range(L + 1)]),
            keys=[layer.keys[b, :, -t:] for layer in layers],
            values=[layer.values[b, :, -t:] for layer in layers],
        ))
    return states


def _padded(rows: Sequence[Tensor], width: int) -> Tensor:
    """Left-pad [..., pos, d] tensors on the position axis (dim -2) to `width`."""
    out = rows[0].new_zeros((len(rows), *rows[0].shape[:-2], width, rows[0].shape[-1]))
    for i, r in enumerate(rows):
        out[i, ..., width - r.shape[-2]:, :] = r
    return out


def _replay_args(states: Sequence[PromptStates], p: int, width: int):
    resid = _padded([s.resid_pre[p] for s in states], width)
    keys = [_padded([s.keys[l] for s in states], width) for l in range(p)]
    values = [_padded([s.values[l] for s in states], width) for l in range(p)]
    return resid, keys, values


def _prefill(
    lm: LoadedModel, ids: Int[Tensor, "b t"], mask: Int[Tensor, "b t"], active: Batch,
    reuse: Sequence[PromptStates] | None,
) -> tuple[Float[Tensor, "b v"], object]:
    """The prompts' forward into a new cache: the last position's logits and the cache.
    With `reuse`, rows go in groups of equal `Batch.row_prefixes`, each group replaying
    its leading unchanged blocks, and the groups' caches are joined in row order (a
    batch silencing every layer recomputes, row by row, only the blocks from its own
    silenced one on)."""
    prefixes = active.row_prefixes() if reuse is not None else [0] * ids.shape[0]
    groups: dict[int, list[int]] = {}
    for row, p in enumerate(prefixes):
        groups.setdefault(p, []).append(row)
    parts = []
    for p, rows in groups.items():
        cache = new_cache()
        index = torch.tensor(rows, device=ids.device)
        with contextlib.ExitStack() as stack:
            if len(groups) > 1:
                stack.enter_context(active.restricted(rows))
            if p:
                stack.enter_context(replaying(lm, *_replay_args([reuse[r] for r in rows], p, ids.shape[1]), cache))
            logits, cache = forward(lm, ids[index], mask[index], cache, last_only=True)
        parts.append((rows, logits[:, -1].float(), cache))
    if len(parts) == 1:
        return parts[0][1], parts[0][2]
    in_parts = [r for rows, _, _ in parts for r in rows]
    order = torch.tensor(in_parts).argsort().to(ids.device)
    joined = new_cache()
    for i in range(len(parts[0][2].layers)):
        # An entry holds every row, or (sparse route slots) the rows that run it; a
        # group's entry of no rows is a placeholder (`batch._hold_length`).
        held = active.entry_rows(i)
        at = order if held is None else torch.tensor([r for r in in_parts if held[r]], dtype=torch.long).argsort().to(ids.device)
        layers = [cache.layers[i] for _, _, cache in parts]
        layers = [layer for layer in layers if layer.keys.shape[0]] or layers[:1]
        keys = torch.cat([layer.keys for layer in layers])[at]
        values = torch.cat([layer.values for layer in layers])[at]
        joined.update(keys, values, i)
    return torch.cat([last for _, last, _ in parts])[order], joined


#: rows per slice of the sampler's vocabulary-wide passes: a 64-row batch's logits are
#: 12.6 MB on the demo model (49,152 tokens), and the passes over them (temperature,
#: softmax, cumulative sum, log-softmax), each writing a tensor that size, ran 2x slower
#: than over 8-row slices that stay in cache (end to end about 1.02x, within the noise of
#: 8 interleaved rounds; demo model, CPU). Every pass is row-wise: the same bits. Off
#: the CPU the batch goes whole: slices would only add kernel launches.
SAMPLER_ROWS = 8


def _sample(
    logits: Float[Tensor, "r v"], temps: Float[Tensor, "r"], top_p: Float[Tensor, "r"], u: Float[Tensor, "r"]
) -> tuple[Int[Tensor, "r"], Float[Tensor, "r"]]:
    """Each row's next token (`_pick`) and its log-probability under the untempered
    logits, SAMPLER_ROWS rows at a time on a CPU."""
    step = SAMPLER_ROWS if logits.device.type == "cpu" else max(logits.shape[0], 1)
    toks, logps = [], []
    for s in range(0, logits.shape[0], step):
        rows = slice(s, s + step)
        tok = _pick(logits[rows], temps[rows], top_p[rows], u[rows])
        toks.append(tok)
        logps.append(torch.log_softmax(logits[rows], -1).gather(-1, tok[:, None]).squeeze(-1))
    return torch.cat(toks), torch.cat(logps)


def _pick(
    logits: Float[Tensor, "r v"], temps: Float[Tensor, "r"], top_p: Float[Tensor, "r"], u: Float[Tensor, "r"]
) -> Int[Tensor, "r"]:
    """Greedy for rows with temperature 0; else inverse-CDF sampling from the tempered,
    top-p-truncated distribution (each row its own top-p) with the row's uniform `u`.
    Rows at top-p 1 and truncated rows draw apart, so a row's token never depends on
    which other rows share its batch."""
    hot = temps > 0
    if not bool(hot.any()):
        return logits.argmax(-1)
    cut = hot & (top_p < 1.0)
    if bool(hot.all()) and (bool(cut.all()) or not bool(cut.any())):
        # the usual case (K samples at one top-p): no row copies, no argmax
        return _draw(logits, temps, top_p if bool(cut.any()) else None, u)
    out = logits.argmax(-1)
    for rows, truncated in ((hot & ~cut, False), (cut, True)):
        if bool(rows.any()):
            out[rows] = _draw(logits[rows], temps[rows], top_p[rows] if truncated else None, u[rows])
    return out


def _draw(
    logits: Float[Tensor, "r v"], temps: Float[Tensor, "r"], top_p: Float[Tensor, "r"] | None, u: Float[Tensor, "r"]
) -> Int[Tensor, "r"]:
    probs = torch.softmax(logits / temps[:, None], dim=-1)
    if top_p is not None:
        # Keep the smallest prefix (by probability) whose mass reaches top_p, always at
        # least one token. Sorting the vocabulary is costly, so only top-p pays for it.
        probs, order = probs.sort(dim=-1, descending=True)
        probs = probs * ((probs.cumsum(-1) - probs) < top_p[:, None])
    cum = probs.cumsum(-1)
    target = u[:, None] * cum[:, -1:]
    # right=True: a token of zero probability (cum does not grow) is never drawn.
    idx = torch.searchsorted(cum, target, right=True).clamp(max=probs.shape[-1] - 1)
    return (order.gather(-1, idx) if top_p is not None else idx).squeeze(-1)


def _uniforms(seeds: Sequence[int], steps: int) -> Float[Tensor, "r steps"]:
    rows = []
    for s in seeds:
        g = torch.Generator().manual_seed(int(s) & ((1 << 63) - 1))
        rows.append(torch.rand(steps, generator=g, dtype=torch.float64))
    return torch.stack(rows).float()


@torch.inference_mode()
def generate(
    lm: LoadedModel,
    prompts: Sequence[Sequence[int]],
    *,
    n: int = 1,
    decoding: Decoding | None = None,
    columns: Sequence[Decoding] | None = None,
    seeds: Sequence[Sequence[int]] | None = None,
    interventions: Sequence[Sequence[Intervention]] | Sequence[Intervention] | None = None,
    stop_strings: Sequence[str] = (),
    use_cache: bool = True,
    reuse: Sequence[PromptStates] | None = None,
    sparse_slots: bool | None = None,
) -> list[list[Generation]]:
    """Generate `n` continuations for each prompt (token ids, already rendered).

    decoding: every column's (default greedy, 64 new tokens); or columns: one per column
    j < n (its temperature and top-p; they share max_new_tokens);
    seeds: seeds[b][j] for prompt b, column j (needed when any temperature > 0);
    interventions: one set for all, or one set per prompt (shared by its n columns).
    reuse: `prompt_states` of these prompts; each row's prefill replays the leading
    blocks it runs unchanged (`Batch.row_prefixes`: before its route departs from the
    full path, or before the first block its interventions hook) instead of
    recomputing them.
    sparse_slots: rows on different routes run only their own route positions
    (`batch.batch_applied`; default: where that pays, `sparse_slots_pay`).
    Returns result[b][j].
    """
    B = len(prompts)
    cols, seeds = plan_columns(n, B, decoding, columns, seeds)
    device = lm.device
    steps = cols[0].max_new_tokens
    longest = max((len(p) for p in prompts), default=0)
    # Before the prefill, so a generation that would outgrow the context never starts.
    lm.check_fits(longest + steps, f"a prompt of {longest} tokens plus {steps} new tokens")
    u = _uniforms([s for row in seeds for s in row[:n]], steps).to(device)
    temps = torch.tensor([c.temperature for c in cols] * B, dtype=torch.float32, device=device)
    top_ps = torch.tensor([c.top_p for c in cols] * B, dtype=torch.float32, device=device)
    stop_ids = torch.tensor(sorted(lm.stop_token_ids), dtype=torch.long, device=device)

    ids, mask = left_pad(prompts, lm.pad_id, device)
    prompt_end = ids.shape[1] - 1  # left padding ends every prompt here
    with batch_applied(lm, interventions, batch_size=B, sparse_slots=sparse_slots) as active:
        if use_cache:
            last, cache = _prefill(lm, ids, mask, active, reuse)
        else:
            last, cache = forward(lm, ids, mask, None, last_only=True)[0][:, -1].float(), None
        # Fan each prompt out to its n columns: rows b*n .. b*n+n-1 share prompt b.
        last = last.repeat_interleave(n, 0)
        mask = mask.repeat_interleave(n, 0)
        if use_cache:
            cache.batch_repeat_interleave(n)
        else:
            ids = ids.repeat_interleave(n, 0)
        active.repeat_interleave(n)

        R = B * n
        rows = torch.arange(R, device=device)  # original row of each batch row
        live = torch.ones(R, dtype=torch.bool, device=device)  # batch rows still generating
        out_tokens: list[list[int]] = [[] for _ in range(R)]
        out_logp: list[list[float]] = [[] for _ in range(R)]
        finish = ["length"] * R
        for t in range(steps):
            tok, logp = _sample(last, temps[rows], top_ps[rows], u[rows, t])
            done = torch.isin(tok, stop_ids) & live
            for i, (r, tk, lp, d, lv) in enumerate(zip(rows.tolist(), tok.tolist(), logp.tolist(), done.tolist(), live.tolist())):
                if not lv:
                    continue
                if d:
                    finish[r] = "stop"
                    continue
                out_tokens[r].append(tk)
                out_logp[r].append(lp)
                if stop_strings and _hits_stop_string(lm.tokenizer, out_tokens[r], stop_strings):
                    finish[r] = "stop"
                    done[i] = True
            live &= ~done
            if t == steps - 1 or not bool(live.any()):
                break
            if _worth_compacting(int(live.sum()), live.numel()):
                keep = live.nonzero().squeeze(-1)
                rows, tok, mask, live = rows[keep], tok[keep], mask[keep], live[keep]
                if not use_cache:
                    ids = ids[keep]
                active.select(keep, cache if use_cache else None)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            if use_cache:
                logits, cache = forward(lm, tok[:, None], mask, cache, prompt_end=prompt_end)
            else:
                ids = torch.cat([ids, tok[:, None]], dim=1)
                logits, _ = forward(lm, ids, mask, None, last_only=True, prompt_end=prompt_end)
            last = logits[:, -1].float()

    results = []
    for b in range(B):
        row = []
        for j in range(n):
            r = b * n + j
            text = lm.tokenizer.decode(out_tokens[r], skip_special_tokens=True)
            if stop_strings:
                text = cut_at_stop(text, stop_strings)
            row.append(Generation(tokens=out_tokens[r], text=text, logprob=sum(out_logp[r]), finish=finish[r],
                                  token_logprobs=out_logp[r]))
        results.append(row)
    return results


#: finished rows stay in the batch until they are this share of it: removing them copies
#: every row's KV cache, and with many long rows finishing one by one (K samples of 256
#: tokens) those copies took a third of the decoding time; a finished row left in costs
#: one row's compute per step instead, and its tokens are thrown away
COMPACT_SHARE = 1 / 8


def _worth_compacting(n_live: int, n_batch: int) -> bool:
    return n_batch - n_live >= max(1, COMPACT_SHARE * n_batch)


def _hits_stop_string(tokenizer, tokens: list[int], stop_strings: Sequence[str]) -> bool:
    # Only the tail can complete a stop string that was absent one token ago.
    width = max(len(s) for s in stop_strings) + 8
    tail = tokenizer.decode(tokens[-width:], skip_special_tokens=True)
    return any(s in tail for s in stop_strings)
