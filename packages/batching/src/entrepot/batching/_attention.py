"""Causal attention over packed sequences (each sequence attends only to its own earlier tokens).

Legend: T packed tokens, H query heads, H_kv key/value heads (H % H_kv == 0, grouped-query
attention), D head dim, B sequences delimited by ``cu_seqlens`` [B + 1].

Two backends: flash-attention's varlen kernel (CUDA, fp16/bf16, when ``flash-attn`` is installed)
and a portable one that runs ``scaled_dot_product_attention`` once per sequence (O(B) Python steps;
never builds a [T, T] mask).
"""

from __future__ import annotations

import importlib.util
import itertools
from functools import lru_cache
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from entrepot.batching._errors import BackendUnavailableError, InvalidArgumentError, LengthMismatchError

__all__ = ["flash_attention_available", "packed_causal_attention"]

Backend = Literal["auto", "sdpa", "flash"]
_FLASH_DTYPES = (torch.float16, torch.bfloat16)


@lru_cache(maxsize=1)
def flash_attention_available() -> bool:
    """Whether ``flash_attn`` can be imported (checked once)."""
    return importlib.util.find_spec("flash_attn") is not None


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise InvalidArgumentError(
            f"q, k, v must be [T, heads, head_dim]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise LengthMismatchError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must equal [T={q.shape[0]}, H_kv, D={q.shape[2]}]"
        )
    if q.shape[1] % k.shape[1] != 0:
        raise InvalidArgumentError(
            f"query heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or cu_seqlens.is_floating_point():
        raise InvalidArgumentError(f"cu_seqlens must be a 1-D integer tensor [B + 1], got {cu_seqlens!r}")
    first, last = int(cu_seqlens[0]), int(cu_seqlens[-1])
    if first != 0 or last != q.shape[0]:
        raise LengthMismatchError(
            f"cu_seqlens must start at 0 and end at T={q.shape[0]}; got {first}..{last}"
        )


def _use_flash(q: Tensor, backend: Backend) -> bool:
    if backend == "sdpa":
        return False
    fits = q.is_cuda and q.dtype in _FLASH_DTYPES
    if backend == "flash":
        if not flash_attention_available():
            raise BackendUnavailableError(
                "backend='flash' needs flash-attention: pip install flash-attn --no-build-isolation"
            )
        if not fits:
            raise BackendUnavailableError(
                f"backend='flash' needs CUDA fp16/bf16 tensors, got {q.device} {q.dtype}; use backend='sdpa'"
            )
        return True
    if backend != "auto":
        raise InvalidArgumentError(f"backend must be 'auto', 'sdpa' or 'flash', got {backend!r}")
    return fits and flash_attention_available()


def packed_causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    *,
    softmax_scale: float | None = None,
    backend: Backend = "auto",
) -> Tensor:
    """Causal self-attention within each packed sequence.

    Args:
        q: [T, H, D] queries.
        k: [T, H_kv, D] keys.
        v: [T, H_kv, D] values.
        cu_seqlens: [B + 1] cumulative sequence lengths (``PackedBatch.cu_seqlens``).
        max_seqlen: longest sequence (``PackedBatch.max_seqlen``), used by the flash kernel.
        softmax_scale: defaults to 1 / sqrt(D).
        backend: ``"auto"`` takes flash-attention when installed and the tensors are CUDA
            fp16/bf16, else ``"sdpa"``; ``"flash"`` insists (raises ``BackendUnavailableError``).

    Returns:
        [T, H, D] attention output.
    """
    _check_inputs(q, k, v, cu_seqlens)
    if _use_flash(q, backend):
        from flash_attn import flash_attn_varlen_func

        cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
        out: Tensor = flash_attn_varlen_func(
            q, k, v, cu, cu, max_seqlen, max_seqlen, softmax_scale=softmax_scale, causal=True
        )
        return out
    return _sdpa_per_sequence(q, k, v, cu_seqlens, softmax_scale)


def _sdpa_per_sequence(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, softmax_scale: float | None
) -> Tensor:
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)  # [T, H, D]
        v = v.repeat_interleave(groups, dim=1)
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in itertools.pairwise(bounds):
        if end <= start:
            continue
        # [H, n, D] per sequence; is_causal masks future tokens inside the sequence only.
        q_i, k_i, v_i = (t[start:end].transpose(0, 1) for t in (q, k, v))
        o_i = F.scaled_dot_product_attention(q_i, k_i, v_i, is_causal=True, scale=softmax_scale)
        out[start:end] = o_i.transpose(0, 1)
    return out
