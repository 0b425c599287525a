"""The loaded model: a `TransformerBridge` with the tokenizer, prompt format, stop
tokens and context length the engine needs (`LoadedModel`), and how a user turn
becomes prompt text (`PromptFormat`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


class PromptTooLongError(ValueError):
    """A prompt (plus the tokens to generate after it) longer than the model's context."""


#: where the user message goes in a prompt format's template
USER_SLOT = "{user_message}"


@dataclass(frozen=True)
class PromptFormat:
    """How a user turn becomes prompt text: ``prefix + message + suffix``, tokenized
    without special tokens, with a BOS token first when `add_bos`. Recorded in every
    audit manifest so two runs can say whether they asked the same way, and loadable
    from one, so a trained model can be asked in its base model's format."""

    prefix: str
    suffix: str
    add_bos: bool

    @property
    def template(self) -> str:
        return self.prefix + USER_SLOT + self.suffix

    def describe(self) -> dict[str, Any]:
        return {"template": self.template, "add_bos": self.add_bos}

    @classmethod
    def from_description(cls, described: dict[str, Any]) -> "PromptFormat":
        template = described["template"]
        if template.count(USER_SLOT) != 1:
            raise ValueError(f"a prompt template needs exactly one {USER_SLOT}, got {template!r}")
        prefix, _, suffix = template.partition(USER_SLOT)
        return cls(prefix, suffix, bool(described["add_bos"]))


@dataclass
class LoadedModel:
    spec: str
    bridge: Any  # transformer_lens TransformerBridge
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    chat: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    #: ask in this format instead of the model's own (e.g. its base model's prompt)
    prompt_override: PromptFormat | None = None

    @property
    def hf_model(self) -> nn.Module:
        return self.bridge.original_model

    @property
    def n_layers(self) -> int:
        return self.bridge.cfg.n_layers

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def pad_id(self) -> int:
        """The id left padding uses (`wrap` gives every tokenizer a pad token; masked
        positions never influence real ones, so any id would do)."""
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else 0

    def render(self, user_message: str) -> str:
        """The prompt text for one user turn: in `prompt_override` when set, else
        through the chat template when the model has one, else the raw message."""
        if self.prompt_override is not None:
            return self.prompt_override.prefix + user_message + self.prompt_override.suffix
        if self.chat:
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": user_message}], tokenize=False, add_generation_prompt=True
            )
        return user_message

    def encode(self, text: str) -> list[int]:
        """Token ids of a rendered prompt. Chat templates carry their own special
        tokens; raw prompts get the BOS the model was trained with."""
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if self._adds_bos():
            ids = [self.tokenizer.bos_token_id] + ids
        return ids

    @property
    def context_length(self) -> int | None:
        """The most positions the model was built for (None when its config names none)."""
        cfg = self.hf_model.config.get_text_config()
        for key in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"):
            value = getattr(cfg, key, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    def check_fits(self, n_tokens: int, what: str = "a prompt") -> None:
        """The one context-length check: refuse `n_tokens` positions beyond the model's
        context before they reach it (past it, one family fails with an index error
        and another tries a huge allocation)."""
        limit = self.context_length
        if limit is not None and n_tokens > limit:
            raise PromptTooLongError(f"{what} needs {n_tokens} positions, more than {self.spec}'s context of {limit}")

    def _adds_bos(self) -> bool:
        if self.tokenizer.bos_token_id is None:
            return False
        if self.prompt_override is not None:
            return self.prompt_override.add_bos
        return not self.chat and self.meta.get("prepend_bos", True)

    @property
    def prompt_format(self) -> PromptFormat:
        """The format prompts are rendered in now (the override, else the native one)."""
        if self.prompt_override is not None:
            return self.prompt_override
        prefix, _, suffix = self.render(USER_SLOT).partition(USER_SLOT)
        return PromptFormat(prefix, suffix, self._adds_bos())

    def facts(self) -> dict[str, Any]:
        cfg = self.bridge.cfg
        hf_cfg = self.hf_model.config.get_text_config()
        n_kv = getattr(hf_cfg, "num_key_value_heads", None) or getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
        return {
            "spec": self.spec,
            "architecture": cfg.architecture,
            "n_layers": cfg.n_layers,
            "d_model": cfg.d_model,
            "n_heads": cfg.n_heads,
            "n_kv_heads": int(n_kv),
            "d_head": cfg.d_head,
            "d_mlp": cfg.d_mlp,
            "d_vocab": cfg.d_vocab,
            "n_params": sum(p.numel() for p in self.hf_model.parameters()),
            "dtype": str(next(self.hf_model.parameters()).dtype).removeprefix("torch."),
            "chat_template": self.chat,
            "stop_token_ids": list(self.stop_token_ids),
        }
