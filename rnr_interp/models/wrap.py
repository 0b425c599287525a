"""A Hugging Face causal LM wrapped as a `LoadedModel`: the TransformerBridge with its
speed patches (aligned weights, prepacked linear layers, fused attention), the
tokenizer and the stop tokens."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rnr_interp.models.errors import ModelSpecError
from rnr_interp.models.loaded import LoadedModel


def wrap(spec: str, model: nn.Module, tokenizer: Any, prepend_bos: bool | None = None) -> LoadedModel:
    """Wrap a loaded HF causal LM in a TransformerBridge (in place: its submodules
    become the bridge's) and collect the facts the sampler needs: chat template and
    stop tokens."""
    from transformer_lens.model_bridge.sources import build_bridge_from_module

    prepare(model)
    architecture = (model.config.architectures or [type(model).__name__])[0]
    try:
        # The tokenizer is ours, not the bridge's: the bridge would rebuild it from the
        # hub with add_bos_token forced, which changes chat-template tokenization.
        bridge = build_bridge_from_module(model, architecture, hf_config=model.config, tokenizer=None, model_name=spec)
    except Exception as exc:  # the bridge raises many types for unknown adapters
        raise ModelSpecError(f"model spec {spec!r}: architecture {architecture} is not supported by TransformerLens ({exc})") from exc
    return wrap_bridge(spec, bridge, tokenizer, prepend_bos)


def prepare(model: nn.Module) -> None:
    """An HF model readied for inference, in place: eval mode, weights on aligned memory
    and, on a CPU, linear layers on oneDNN-prepacked weights (packed_linear.py: 1.2x the
    engine; float32 rounding only differs)."""
    from rnr_interp.models import packed_linear

    model.eval()
    align_weights(model)
    packed_linear.install(model)


def wrap_bridge(spec: str, bridge: Any, tokenizer: Any, prepend_bos: bool | None = None) -> LoadedModel:
    """A built TransformerBridge (in place) as a `LoadedModel`: eval mode, the fused
    attention, `tokenizer` (given a pad token when it has none), stop tokens and
    whether prompts go through a chat template."""
    from rnr_interp.models import fast_attention  # imports TransformerLens: only when a model is wrapped

    bridge.eval()
    # The bridge's eager attention copies the KV cache every step to expand GQA heads;
    # while no hook reads the attention pattern, a fused SDPA path computes the same
    # (fast_attention.py says when it falls back to eager).
    fast_attention.install(bridge)
    # lets bridge.to_tokens/to_string work for users; not through the public setter, which
    # on a bridge that has a tokenizer (a user's) re-runs TL's tokenizer setup and
    # d_vocab inference, changing padding and BOS from what this tokenizer does
    bridge._tokenizer = tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    stops = stop_token_ids_of(bridge.original_model, tokenizer)
    chat = bool(getattr(tokenizer, "chat_template", None))
    if prepend_bos is None:
        prepend_bos = tokenizer_adds_bos(tokenizer)
    return LoadedModel(spec=spec, bridge=bridge, tokenizer=tokenizer, stop_token_ids=stops, chat=chat, meta={"prepend_bos": prepend_bos})


def tokenizer_adds_bos(tokenizer: Any) -> bool:
    """Whether the tokenizer starts what it encodes with its BOS token, as the model was
    trained. Read from what it does, not from `add_bos_token` alone: a tokenizer
    transformers converts from a GGUF (Gemma 3's) adds BOS in its post-processor and
    reports `add_bos_token` False."""
    if getattr(tokenizer, "add_bos_token", False):
        return True
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("a").input_ids[:1] == [bos]


#: bytes a tensor's start is aligned to in PyTorch's own CPU allocations (and what MKL's
#: kernels assume for their fast paths)
ALIGNMENT = 64


def align_weights(model: nn.Module) -> None:
    """Give every parameter and buffer that does not start on an `ALIGNMENT`-byte
    boundary a copy of its own. Loading safetensors leaves the weights as views into
    the file's memory map, at offsets its header decides: for the demo model 40 bytes
    past a 64-byte boundary, where MKL's matmuls run at half their rate (the model's
    211 linear layers at 64 rows, one thread: 505 ms on the loaded weights, 239 ms on
    copies). Values are unchanged; tied weights stay tied (one Parameter, copied once)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.device.type == "cpu" and tensor.numel() and tensor.data_ptr() % ALIGNMENT:
                tensor.data = tensor.data.clone(memory_format=torch.contiguous_format)


def stop_token_ids_of(model: nn.Module, tokenizer: Any) -> tuple[int, ...]:
    """The ids that end a generation: the eos ids of the generation config, the model config and the tokenizer."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
    # Chat models end a turn with a token that is not always registered as EOS.
    for tok in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok) if tok in tokenizer.get_vocab() else None
        if tid is not None:
            ids.add(int(tid))
    return tuple(sorted(ids))
