"""Shapes, the packed batch, the FLOP count and the measuring helpers the GPU benchmark's sections share.

The benchmark is built from stable pieces only: HF transformers' `Qwen3Config`, entrepot.batching's
packed attention, entrepot.resharding's public API and megatron-core. Its imports of entrepot.grpo
internals, which move while the package is regrouped, all sit in `grpo_internals` below.

Legend: T packed tokens of a micro-batch, R scored (response) tokens, s_i the length of sequence i,
L layers, H query heads, H_kv key/value heads, d head dim, h hidden size, V vocabulary.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# H100 SXM's dense bf16 rate from its datasheet; MFU is also given against a matrix product measured
# in the same run (`matmul_baseline`), which is what the card delivers as found.
H100_BF16_PEAK_FLOPS = 989.4e12


def grpo_internals() -> dict[str, Any]:
    """The entrepot.grpo internals the benchmark uses (the only ones: fix the paths here if they move)."""
    from entrepot.grpo.algo.losses import policy_loss
    from entrepot.grpo.engines.base import SamplingParams
    from entrepot.grpo.engines.rollout_hf import HFRolloutEngine

    return {"policy_loss": policy_loss, "HFRolloutEngine": HFRolloutEngine, "SamplingParams": SamplingParams}


@dataclass(frozen=True)
class Shape:
    """A Qwen3-shaped decoder and the packed micro-batch it trains on."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tokens: int  # T: packed tokens per micro-batch
    prompt: int  # prompt tokens at the start of every sequence (not scored)
    min_len: int  # sequence lengths are drawn uniformly from [min_len, max_len]
    max_len: int

    def hf_config(self) -> Any:
        """transformers' `Qwen3Config` of this shape (tied embeddings, no dropout, Qwen3's RoPE base)."""
        from transformers import Qwen3Config

        return Qwen3Config(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim, max_position_embeddings=max(4096, self.max_len), rms_norm_eps=1e-6,
            rope_theta=1_000_000.0, tie_word_embeddings=True, attention_dropout=0.0,
            bos_token_id=1, eos_token_id=1, architectures=["Qwen3ForCausalLM"],
        )  # fmt: skip

    def body_params(self) -> int:
        """Weights of the linear layers of the transformer blocks (what 6 N T counts)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * q + 2 * self.hidden * kv + q * self.hidden
        return self.layers * (attention + 3 * self.hidden * self.intermediate)


# Qwen3-0.6B's config (hidden 1024, 28 layers, 16 / 8 heads of 128, MLP 3072, vocab 151,936, tied).
QWEN3_06B = Shape("qwen3-0.6b", 1024, 28, 16, 8, 128, 3072, 151_936, 16_384, 256, 1024, 3072)
TINY = Shape("tiny", 64, 2, 4, 2, 16, 128, 512, 256, 8, 24, 72)


def train_flops(shape: Shape, lengths: list[int], scored: int) -> float:
    """FLOPs of one fwd+bwd over the packed micro-batch (the benchmark's MFU numerator).

    FLOPs = 6 N_body T + 6 V h R + 6 L H d sum_i s_i^2

    N_body: linear weights of the blocks; the LM head runs on the R scored tokens only; causal
    attention scores half of each s_i x s_i matrix, QK^T and PV at 2 FLOPs a multiply-add, x3 for
    forward plus backward. Norms, RoPE, softmax and flash attention's backward recomputation are
    not counted (the usual convention, which makes MFU a lower bound).
    """
    tokens = sum(lengths)
    attention = 6 * shape.layers * shape.heads * shape.head_dim * sum(s * s for s in lengths)
    return 6.0 * shape.body_params() * tokens + 6.0 * shape.vocab * shape.hidden * scored + attention


@dataclass(frozen=True)
class PackedBatch:
    """One packed micro-batch of GRPO rows: prompt then response per sequence, end to end.

    Attributes:
        tokens: int64 [T].
        positions: int64 [T] position of each token in its sequence.
        cu_seqlens: int32 [B + 1].
        lengths: the B sequence lengths.
        scored: int64 [R] positions t whose next token t + 1 is a response token.
        labels: int64 [R] those next tokens.
        old_logp, advantages, weights: float32 [R] the rest of the GRPO loss's inputs.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    lengths: list[int]
    scored: torch.Tensor
    labels: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor

    @property
    def max_len(self) -> int:
        return max(self.lengths)

    def to(self, device: torch.device) -> PackedBatch:
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        return PackedBatch(**moved)


def packed_lengths(shape: Shape, seed: int = 0) -> list[int]:
    """Sequence lengths drawn from [min_len, max_len] that fill exactly `shape.tokens` tokens."""
    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < shape.tokens:
        lengths.append(rng.randint(shape.min_len, shape.max_len))
    lengths[-1] -= sum(lengths) - shape.tokens
    if lengths[-1] <= shape.prompt:  # too short to hold a response: give it to the previous sequence
        lengths[-2] += lengths.pop()
    return lengths


def make_batch(shape: Shape, seed: int = 0) -> PackedBatch:
    """Random tokens in `packed_lengths`, with GRPO inputs (old log-probs near uniform, +-1 advantages)."""
    lengths = packed_lengths(shape, seed)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape.vocab, (shape.tokens,), generator=gen)
    starts = list(itertools.accumulate([0, *lengths[:-1]]))
    positions = torch.cat([torch.arange(n) for n in lengths])
    scored = torch.cat(
        [torch.arange(s + shape.prompt - 1, s + n - 1) for s, n in zip(starts, lengths, strict=True)]
    )
    advantages_per_row = torch.randint(0, 2, (len(lengths),), generator=gen).float() * 2 - 1
    response_lengths = torch.tensor([n - shape.prompt for n in lengths])
    num_scored = int(response_lengths.sum())
    return PackedBatch(
        tokens=tokens,
        positions=positions,
        cu_seqlens=torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32),
        lengths=lengths,
        scored=scored,
        labels=tokens[scored + 1],
        old_logp=-math.log(shape.vocab) + 0.1 * torch.randn(num_scored, generator=gen),
        advantages=torch.repeat_interleave(advantages_per_row, response_lengths),
        weights=torch.full((num_scored,), 1.0 / num_scored),  # token-mean over the micro-batch
    )


def scored_logp(
    logits_of: Callable[[int, int], torch.Tensor], labels: torch.Tensor, chunk: int
) -> torch.Tensor:
    """Log-prob [R] of each label, computing the [R, V] logits `chunk` rows at a time, in float32.

    `logits_of(start, stop)` gives the logits of rows start..stop. Only one chunk's logits exist at a
    time; autograd keeps each chunk's float32 log-softmax (R x V x 4 bytes in all).
    """
    parts = []
    for start in range(0, labels.numel(), chunk):
        stop = min(start + chunk, labels.numel())
        logits = logits_of(start, stop).float()  # [chunk, V]
        parts.append(-F.cross_entropy(logits, labels[start:stop], reduction="none"))
    return torch.cat(parts)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, *, warmup: int, repeat: int) -> list[float]:
    """Seconds of each of `repeat` calls of `fn` after `warmup` calls, the device synchronised around each."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def matmul_baseline(device: torch.device, size: int) -> dict[str, float]:
    """bf16 matrix product rate measured now (random data): the same-run ceiling MFU is also given against."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=gen)
    seconds = median(timed(lambda: a @ b, device, warmup=3, repeat=10))
    return {"size": size, "seconds": seconds, "flops_per_s": 2 * size**3 / seconds}


def copy_baseline(num_bytes: int, device: torch.device) -> dict[str, float]:
    """A device-to-device copy of `num_bytes` (one flat buffer): the weight sync's bound."""
    source = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = median(timed(lambda: target.copy_(source), device, warmup=3, repeat=20))
    return {"bytes": num_bytes, "seconds": seconds, "gb_per_s": num_bytes / seconds / 1e9}


def device_peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def device_peak_bytes(device: torch.device) -> int | None:
    """The allocator's peak since the last reset (None on CPU, which has no allocator statistics)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


def _proc_status(key: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def host_peak_reset() -> bool:
    """Reset the process's peak resident set (Linux: clear_refs 5); False where that is refused."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def host_bytes() -> dict[str, int | None]:
    """Resident host memory now and its peak since `host_peak_reset` (pinned buffers included)."""
    return {"rss": _proc_status("VmRSS"), "peak": _proc_status("VmHWM")}


def gib(num_bytes: float | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**30:.2f}"


def thread_env() -> dict[str, str]:
    """OMP_WAIT_POLICY=PASSIVE and explicit thread counts, for this process's children."""
    threads = str(torch.get_num_threads())
    return {
        **os.environ,
        "OMP_WAIT_POLICY": "PASSIVE",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }
