"""Random-weight test models, one per family of the paper's models, built in-process
with an offline character tokenizer: one table of configs (`TINY`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rnr_interp.models.errors import ModelSpecError


@dataclass(frozen=True)
class TinyFamily:
    """A tiny model's family: its transformers config class, the architecture the
    bridge adapts, the shape arguments beside the depth, and the config's name for
    the depth."""

    config: str
    architecture: str
    shape: dict[str, Any] = field(default_factory=dict)
    layers_key: str = "num_hidden_layers"
    #: whether its tokenizer has a chat template
    chat: bool = True


#: the shape every family but GPT-2 shares: 64 wide, 4 heads, 512 positions
DECODER = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, max_position_embeddings=512)
#: one key-value head of width 16 (the Gemma families)
GEMMA = dict(DECODER, num_key_value_heads=1, head_dim=16)

TINY: dict[str, TinyFamily] = {
    "tiny-llama": TinyFamily("LlamaConfig", "LlamaForCausalLM", dict(DECODER, num_key_value_heads=2)),
    "tiny-qwen2": TinyFamily("Qwen2Config", "Qwen2ForCausalLM", dict(DECODER, num_key_value_heads=2)),
    "tiny-gpt2": TinyFamily("GPT2Config", "GPT2LMHeadModel", dict(n_embd=64, n_head=4, n_positions=512),
                            layers_key="n_layer", chat=False),
    "tiny-gemma": TinyFamily("GemmaConfig", "GemmaForCausalLM", GEMMA),
    # an RMSNorm after the MLP (the site table's post-MLP-norm family)
    "tiny-gemma2": TinyFamily("Gemma2Config", "Gemma2ForCausalLM", GEMMA),
    # the paper's other families: RMSNorm after attention and MLP instead of before,
    # with norms on queries and keys (OLMo 2); Gemma 3's q/k norms and sliding-window
    # layers interleaved with global ones (a window shorter than the test prompts, so
    # the local layers really are local)
    "tiny-olmo2": TinyFamily("Olmo2Config", "Olmo2ForCausalLM", dict(DECODER, num_key_value_heads=2)),
    "tiny-gemma3": TinyFamily("Gemma3TextConfig", "Gemma3ForCausalLM",
                              dict(GEMMA, sliding_window=16, sliding_window_pattern=2)),
}
TINY_ARCHITECTURES = {name: family.architecture for name, family in TINY.items()}
MAX_TINY_LAYERS = 64


def char_tokenizer(chat: bool = True):
    """An offline character-level tokenizer (printable ASCII + newline) with BOS/EOS/PAD
    and, optionally, a ChatML template with its own turn-end token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for c in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab[c] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    if chat:
        tok.chat_template = (
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        )
    return tok


def tiny_family(name: str) -> TinyFamily:
    if name not in TINY:
        raise ModelSpecError(f"unknown tiny model {name!r}")
    return TINY[name]


def tiny_config(name: str, n_layers: int, vocab_size: int):
    import transformers as tf

    family = tiny_family(name)
    config_class = getattr(tf, family.config)
    return config_class(**family.shape, **{family.layers_key: n_layers}, vocab_size=vocab_size, bos_token_id=1,
                        eos_token_id=2, pad_token_id=0)


def build_tiny(name: str, n_layers: int = 3, seed: int = 0) -> tuple[nn.Module, Any]:
    """A random-weight model of the named family and its char tokenizer. Weights are
    scaled up from HF's 0.02 init so that different inputs give visibly different
    next tokens (otherwise every greedy continuation is the same token)."""
    import transformers as tf

    tok = char_tokenizer(chat=tiny_family(name).chat)
    cfg = tiny_config(name, n_layers, len(tok))
    cfg.initializer_range = 0.2
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model.config.architectures = [TINY_ARCHITECTURES[name]]
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model.eval(), tok
