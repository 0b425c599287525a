"""Sampling throughput: this engine vs plain `transformers` `generate`.

Same model (the demo SmolLM2-135M-Instruct), same prompts (built-in arithmetic task),
same K samples per prompt, temperature and max new tokens. Tokens counted are the
generated tokens up to and excluding each row's stop token (padding after a row has
stopped is not counted for either engine). Greedy outputs are checked to be identical.

    python benchmarks/sampling.py [--quick] [--k 32] [--questions 8] [--max-new-tokens 24]

The last line reads ``ratio_vs_transformers: X`` (this engine's tokens/s over
transformers'). Target: X >= 2 at K=32.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM

from rnr_interp.generate import Decoding, generate, left_pad
from rnr_interp.models import _smollm2_dir, load_model
from rnr_interp.sampling import candidate_seed, prompt_ids
from rnr_interp.tasks import load_task


def useful_tokens(rows: list[list[int]], stops: set[int]) -> int:
    total = 0
    for row in rows:
        total += next((i for i, t in enumerate(row) if t in stops), len(row))
    return total


def bench_ours(lm, prompts, k, temperature, max_new, batch):
    t = time.perf_counter()
    tokens = 0
    for start in range(0, len(prompts), batch):
        chunk = prompts[start:start + batch]
        seeds = [[candidate_seed(0, str(start + i), j) for j in range(k)] for i in range(len(chunk))]
        gens = generate(lm, chunk, n=k, decoding=Decoding(temperature=temperature, max_new_tokens=max_new), seeds=seeds)
        tokens += sum(g.n_tokens for row in gens for g in row)
    return tokens, time.perf_counter() - t


@torch.inference_mode()
def bench_hf(model, lm, prompts, k, temperature, max_new, batch):
    stops = set(lm.stop_token_ids)
    t = time.perf_counter()
    tokens = 0
    for start in range(0, len(prompts), batch):
        ids, mask = left_pad(prompts[start:start + batch], lm.tokenizer.pad_token_id)
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                             num_return_sequences=k, max_new_tokens=max_new, eos_token_id=sorted(stops),
                             pad_token_id=lm.tokenizer.pad_token_id)
        tokens += useful_tokens(out[:, ids.shape[1]:].tolist(), stops)
    return tokens, time.perf_counter() - t


@torch.inference_mode()
def greedy_identical(model, lm, prompts, max_new) -> bool:
    ours = [r[0].tokens for r in generate(lm, prompts, decoding=Decoding(max_new_tokens=max_new))]
    ids, mask = left_pad(prompts, lm.tokenizer.pad_token_id)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                         eos_token_id=list(lm.stop_token_ids), pad_token_id=lm.tokenizer.pad_token_id)
    stops = set(lm.stop_token_ids)
    theirs = [row[:next((i for i, t in enumerate(row) if t in stops), len(row))] for row in out[:, ids.shape[1]:].tolist()]
    return ours == theirs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a ~1 minute version (4 questions)")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8, help="prompts per batch (both engines)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()
    n_q = 4 if args.quick else args.questions
    torch.manual_seed(0)
    lm = load_model("smollm2")
    plain = AutoModelForCausalLM.from_pretrained(_smollm2_dir(), dtype=torch.float32).eval()
    task = load_task("arithmetic", n=n_q)
    prompts = [prompt_ids(lm, task, q) for q in task.questions]
    batch = min(args.batch, 4 if args.quick else args.batch)
    print(f"model=smollm2 questions={n_q} K={args.k} T={args.temperature} max_new_tokens={args.max_new_tokens} batch={batch} threads={torch.get_num_threads()}")
    same = greedy_identical(plain, lm, prompts, args.max_new_tokens)
    print(f"greedy_identical: {same}")
    hf_tok, hf_s = bench_hf(plain, lm, prompts, args.k, args.temperature, args.max_new_tokens, batch)
    our_tok, our_s = bench_ours(lm, prompts, args.k, args.temperature, args.max_new_tokens, batch)
    hf_rate, our_rate = hf_tok / hf_s, our_tok / our_s
    print(f"transformers_generate: {hf_tok} tokens in {hf_s:.1f} s = {hf_rate:.1f} tokens/s")
    print(f"rnr_interp_engine:     {our_tok} tokens in {our_s:.1f} s = {our_rate:.1f} tokens/s")
    print(f"ratio_vs_transformers: {our_rate / hf_rate:.2f}")


if __name__ == "__main__":
    main()
