"""`engine.rollout_dtype: auto`: a bfloat16 rollout copy only where this machine multiplies bfloat16 fast.

A bfloat16 copy halves the bytes each decode step reads, which is about twice the speed on a CPU with
native bfloat16 matmuls (AMX, AVX-512 BF16) or on a GPU. On a CPU without them (AVX2 only) torch
emulates them: a 1024^2 matmul ran at 0.74 GFLOPS against float32's 32 on one AMD EPYC core, and the
SmolLM2 rollout at 0.57x HF generate instead of 3.4x (packages/grpo/BENCHMARKS.md). So `auto` measures
once per process (`bf16_speedup`: a decode-shaped matmul in both dtypes, about 0.1 s) and picks
bfloat16 when it is at least `MIN_SPEEDUP` faster, and where a bfloat16 copy is allowed at all: the
torch train engine, and a synchronous run without partial rollout (whose ratio would divide by the
copy's log-probs as the old ones).
"""

from __future__ import annotations

import time
from functools import cache
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from entrepot.grpo.config import GRPOConfig

__all__ = ["MIN_SPEEDUP", "bf16_speedup", "resolved_rollout_dtype"]

MIN_SPEEDUP = 1.2  # bfloat16 over float32 matmul throughput from which `auto` takes the copy
_SHAPE = (32, 576, 1536)  # rows x in x out: a batched decode step's MLP matmul on a small model
_REPEATS = 8


@cache
def bf16_speedup(device: str) -> float:
    """How many times faster a decode-shaped bfloat16 matmul runs than a float32 one on `device`.

    A CUDA device that supports bfloat16 is taken as 2.0 without timing; other devices are timed
    here (the best of `_REPEATS` after a warm-up, so a busy moment costs accuracy, not the choice's
    direction: the two outcomes seen differ by 50x).
    """
    if device.startswith("cuda"):
        return 2.0 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 0.0
    rows, inner, outer = _SHAPE
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, inner, dtype=dtype, device=device)
        w = torch.randn(inner, outer, dtype=dtype, device=device)
        x @ w  # warm-up: kernel selection, first-touch pages
        best = float("inf")
        for _ in range(_REPEATS):
            t0 = time.perf_counter()
            x @ w
            best = min(best, time.perf_counter() - t0)
        seconds[dtype] = best
    return seconds[torch.float32] / max(seconds[torch.bfloat16], 1e-9)


def resolved_rollout_dtype(config: GRPOConfig) -> Literal["float32", "bfloat16"]:
    """`engine.rollout_dtype` as the torch rollout engines build it: `auto` decided here, else as set."""
    engine = config.engine
    if engine.rollout_dtype != "auto":
        return engine.rollout_dtype
    off_policy = config.rollout.partial_max_tokens is not None or config.trainer.asynchronous
    if engine.train != "torch" or engine.rollout != "torch" or off_policy:
        return "float32"
    return "bfloat16" if bf16_speedup(engine.device) >= MIN_SPEEDUP else "float32"
