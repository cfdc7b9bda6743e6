"""Remove padding in training: packed vs padded time per step, same model, same rows, same run.

A "step" here is what the actor computes on a step's rows: the reference log-prob pass plus one
PPO update (forward + backward + AdamW) over all rows (`entrepot.grpo.algo.update`), with
`batching.remove_padding` on (one packed row, varlen attention) and off (a right-padded grid).

Shapes: the embedded default (256 rows of 9 prompt + 1-9 response tokens, nearly equal lengths) and
a long-tail mix (64 rows, prompt 8 tokens, prompt + response uniform in 16..512).

Then GPT-2's written-out packed forward (`entrepot.grpo.embedded.gpt2_forward`) against HF's forward (the
baseline: what ran before it), on GRPO groups (32 prompts x 8 responses, prefix sharing) over one
and two lanes (`entrepot.grpo.embedded.lanes`).

    python packages/grpo/benchmarks/bench_packing.py [--repeats 5]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import contextlib
import dataclasses
import statistics
import time
from collections.abc import Iterator

import torch

from entrepot.grpo import gpt2_forward, load_config
from entrepot.grpo.algo.optim import build_optimizer
from entrepot.grpo.algo.sequences import ResponseBatch
from entrepot.grpo.algo.update import UpdateInputs, compute_logprobs, ppo_update
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.engines.models import build_model


def _rows(prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, vocab: int) -> ResponseBatch:
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (int(prompt_lengths.sum()),), generator=gen)
    responses = torch.randint(3, vocab, (int(response_lengths.sum()),), generator=gen)
    return ResponseBatch.from_packed(prompts, prompt_lengths, responses, response_lengths)


def _step_seconds(
    config: GRPOConfig, batch: ResponseBatch, packed: bool, repeats: int, lanes: int = 1
) -> float:
    """Median seconds of (reference pass + one update) over `repeats` runs, after one warm-up."""
    torch.manual_seed(0)
    model = build_model(config.model, 16, pad_token_id=0, eos_token_id=1)
    reference = build_model(config.model, 16, pad_token_id=0, eos_token_id=1).requires_grad_(False)
    optimizer, scheduler = build_optimizer(model, config.algorithm, total_steps=100)
    batching = dataclasses.replace(config.batching, remove_padding=packed)
    advantages = torch.randn(batch.num_rows)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        ref = compute_logprobs(reference, batch, batching, "ref_log_prob", lanes=lanes)
        inputs = UpdateInputs(batch, advantages, None, ref, [torch.arange(batch.num_rows)])
        ppo_update(model, optimizer, scheduler, inputs, config.algorithm, batching, lanes=lanes)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


@contextlib.contextmanager
def _hf_forward() -> Iterator[None]:
    """The baseline: GPT-2's packed passes through HF's forward, as before `gpt2_forward`."""
    supports = gpt2_forward.supports
    gpt2_forward.supports = lambda model: False
    try:
        yield
    finally:
        gpt2_forward.supports = supports


def _grpo_groups(gen: torch.Generator) -> ResponseBatch:
    """32 prompts of 9 tokens, each with 8 responses of 1-9 tokens (the default run's step)."""
    prompts = torch.randint(3, 16, (32, 9), generator=gen).repeat_interleave(8, 0)
    response_lengths = torch.randint(1, 10, (256,), generator=gen)
    responses = torch.randint(3, 16, (int(response_lengths.sum()),), generator=gen)
    return ResponseBatch.from_packed(prompts.reshape(-1), torch.full((256,), 9), responses, response_lengths)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    args, _ = parser.parse_known_args()  # nox passes every bench_*.py the same arguments
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    default = load_config(None, [])
    long_tail = load_config(None, ["model.max_positions=512", "batching.max_tokens_per_micro_batch=16384"])
    shapes = {
        "default (256 x 10-18 tokens)": (
            default,
            _rows(torch.full((256,), 9), torch.randint(1, 10, (256,), generator=gen), 16),
        ),
        "long tail (64 x 16-512 tokens)": (
            long_tail,
            _rows(torch.full((64,), 8), torch.randint(8, 505, (64,), generator=gen), 16),
        ),
    }
    print(f"\nremove padding: seconds per actor step (reference pass + update), median of {args.repeats}")
    print(f"{'shape':<32}{'padded s':>10}{'packed s':>10}{'packed/padded':>15}{'pad share':>11}")
    for name, (config, batch) in shapes.items():
        padded = _step_seconds(config, batch, False, args.repeats)
        packed = _step_seconds(config, batch, True, args.repeats)
        pad_share = 1 - float(batch.lengths.sum()) / (batch.num_rows * int(batch.lengths.max()))
        print(f"{name:<32}{padded:>10.4f}{packed:>10.4f}{packed / padded:>14.2f}x{pad_share:>10.0%}")

    groups = _grpo_groups(gen)
    title = "GPT-2 written-out forward vs HF's: seconds per actor step, GRPO groups"
    print(f"\n{title}, median of {args.repeats}")
    print(f"{'lanes':<8}{'HF s':>10}{'written s':>11}{'written/HF':>12}")
    for lanes in (1, 2):
        with _hf_forward():
            hf = _step_seconds(default, groups, True, args.repeats, lanes)
        written = _step_seconds(default, groups, True, args.repeats, lanes)
        print(f"{lanes:<8}{hf:>10.4f}{written:>11.4f}{written / hf:>11.2f}x")


if __name__ == "__main__":
    main()
