"""Causal attention over packed sequences (each sequence attends only to its own earlier tokens).

Legend: T packed tokens, H query heads, H_kv key/value heads (H % H_kv == 0, grouped-query
attention), D head dim, B non-empty sequences delimited by ``cu_seqlens`` [B + 1], L the longest.

Three backends:

- ``flash``: flash-attention's varlen kernel (CUDA, fp16/bf16, when ``flash-attn`` is installed).
- ``varlen``: PyTorch's own FlashAttention-2 varlen kernel (``aten._flash_attention_forward`` and
  its backward, the kernels behind ``torch.nn.attention.varlen``), which every CUDA build of torch
  carries: no extra package, grouped-query attention native, no padding and no mask. CUDA fp16/bf16
  on compute capability >= 8.0 with a head dim that is a multiple of 8 up to 256.
- ``sdpa``: portable; ONE ``scaled_dot_product_attention`` call for the whole packed batch, with
  autograd, on any device and dtype. A loop of one call per sequence (O(B) Python steps and kernel
  launches) made packed training slower than padded training on CPU, so the batch is laid out for
  a single call instead, in whichever of two layouts a cost estimate calls cheaper:

  * padded rows: tokens are scattered into [B, L] rows and run with ``is_causal`` (no mask at
    all); cost ~ B * L^2, the right choice when lengths are close to each other;
  * windowed blocks: the T tokens are cut into blocks of ``bs`` queries; a query sees at most
    L - 1 earlier tokens of its sequence, so each block attends to a key window of the
    ``bs + L - 1`` tokens ending at the block (a strided view of the front-padded keys, not a
    copy) under a boolean mask "same sequence and not in the future" built from per-token
    positions; cost ~ T * (bs + L), which wins for long-tailed lengths where B * L^2 >> T * L.

  Neither layout builds a [T, T] mask; the windowed one holds a [T, bs + L] boolean mask (about
  5 bytes per entry once SDPA turns it into an additive float mask). On CPU, fp16/bf16 inputs
  are computed in float32 and the output is rounded back: PyTorch's CPU attention kernel is
  about 4x slower in bf16 than in float32 on AVX2 machines.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from functools import lru_cache
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from entrepot.batching._errors import BackendUnavailableError, InvalidArgumentError, LengthMismatchError

__all__ = ["flash_attention_available", "packed_attention_kernel", "packed_causal_attention"]

Backend = Literal["auto", "sdpa", "flash", "varlen"]
_FLASH_DTYPES = (torch.float16, torch.bfloat16)

# Block size of the windowed layout: cost ~ T * (bs + L) * (1 + c / bs) (per-block overhead c),
# minimised near bs = sqrt(c * L); c ~ 24 fits CPU block-size sweeps (float32, one thread, H = 4,
# D = 16) from L = 18 to L = 2048. Powers of two in [16, 256].
_BLOCK_COST = 24
_MIN_BLOCK, _MAX_BLOCK = 16, 256
# Key windows are rounded up to a multiple of 8 (SIMD-friendly widths measured faster).
_WINDOW_ALIGN = 8
# A masked score (windowed) costs about 1.3x an unmasked causal one (padded rows) on CPU; the
# layout choice only changes speed, both layouts give the same result.
_MASK_COST = 1.3


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
    if bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
        raise LengthMismatchError(f"cu_seqlens must be non-decreasing, got {cu_seqlens.tolist()}")


def _torch_varlen_fits(q: Tensor) -> bool:
    """Whether PyTorch's own flash varlen kernel takes `q` (CUDA fp16/bf16, sm80+, head dim % 8, <= 256)."""
    if not (q.is_cuda and q.dtype in _FLASH_DTYPES and torch.backends.cuda.is_flash_attention_available()):
        return False
    head_dim = q.shape[-1]
    return torch.cuda.get_device_capability(q.device) >= (8, 0) and head_dim % 8 == 0 and head_dim <= 256


def _resolve(q: Tensor, backend: Backend) -> Literal["flash", "varlen", "sdpa"]:
    """The backend that runs: ``auto`` takes flash-attn, else PyTorch's varlen kernel, else SDPA."""
    if backend == "sdpa":
        return "sdpa"
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
        return "flash"
    if backend == "varlen":
        if not _torch_varlen_fits(q):
            raise BackendUnavailableError(
                f"backend='varlen' needs CUDA fp16/bf16 tensors on compute capability >= 8.0 with a head dim "
                f"that is a multiple of 8 up to 256, got {q.device} {q.dtype} head dim {q.shape[-1]}; "
                "use backend='sdpa'"
            )
        return "varlen"
    if backend != "auto":
        raise InvalidArgumentError(f"backend must be 'auto', 'sdpa', 'flash' or 'varlen', got {backend!r}")
    if fits and flash_attention_available():
        return "flash"
    return "varlen" if _torch_varlen_fits(q) else "sdpa"


def packed_attention_kernel(q: Tensor, cu_seqlens: Tensor, *, backend: Backend = "auto") -> str:
    """The kernel `packed_causal_attention` runs for these inputs, in words (benchmarks report it).

    One of ``"flash-attn varlen"``, ``"torch flash varlen"``, ``"sdpa padded rows"`` or
    ``"sdpa windowed"`` (the last two name the layout of the single SDPA call; SDPA itself then
    picks its flash, memory-efficient or math kernel: flash for padded rows on CUDA, which need no
    mask, memory-efficient for the masked windows).
    """
    chosen = _resolve(q, backend)
    if chosen != "sdpa":
        return {"flash": "flash-attn varlen", "varlen": "torch flash varlen"}[chosen]
    cu = cu_seqlens.to(torch.int64)
    lengths = cu[1:] - cu[:-1]
    lengths = lengths[lengths > 0]
    if not lengths.numel():
        return "sdpa padded rows"
    rows = _prefer_padded_rows(lengths.numel(), int(lengths.max()), int(cu[-1]))
    return "sdpa padded rows" if rows else "sdpa windowed"


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

    Token t of sequence b attends to tokens ``cu_seqlens[b] .. t`` only. Differentiable in q, k
    and v on both backends.

    Args:
        q: [T, H, D] queries.
        k: [T, H_kv, D] keys (H % H_kv == 0: grouped-query attention).
        v: [T, H_kv, D] values.
        cu_seqlens: [B + 1] cumulative sequence lengths (``PackedBatch.cu_seqlens``): starts at 0,
            non-decreasing, ends at T; empty sequences are allowed.
        max_seqlen: longest sequence (``PackedBatch.max_seqlen``), passed to the flash kernel; the
            portable path reads the longest length from ``cu_seqlens`` itself.
        softmax_scale: defaults to 1 / sqrt(D).
        backend: ``"auto"`` takes flash-attention when installed and the tensors are CUDA
            fp16/bf16, else PyTorch's own varlen kernel where it fits (``"varlen"``: CUDA
            fp16/bf16, sm80+), else ``"sdpa"``; ``"flash"`` and ``"varlen"`` insist (raise
            ``BackendUnavailableError``); ``"sdpa"`` is the portable path: one
            ``scaled_dot_product_attention`` call for the whole batch (padded rows or windowed
            blocks, see the module docstring), no Python loop over sequences and no [T, T] mask.

    Returns:
        [T, H, D] attention output.

    Raises:
        InvalidArgumentError: wrong ranks, head counts, ``cu_seqlens`` type or ``backend``.
        LengthMismatchError: shapes that disagree, or ``cu_seqlens`` not covering 0..T in order.
        BackendUnavailableError: ``backend="flash"`` without flash-attn or CUDA fp16/bf16 inputs, or
            ``backend="varlen"`` on inputs PyTorch's varlen kernel does not take.
    """
    _check_inputs(q, k, v, cu_seqlens)
    chosen = _resolve(q, backend)
    if chosen == "sdpa":
        return _sdpa_packed(q, k, v, cu_seqlens, softmax_scale)
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
    if chosen == "varlen":
        out: Tensor = _TorchFlashVarlen.apply(q, k, v, cu, max_seqlen, softmax_scale)
        return out
    from flash_attn import flash_attn_varlen_func

    out = flash_attn_varlen_func(
        q, k, v, cu, cu, max_seqlen, max_seqlen, softmax_scale=softmax_scale, causal=True
    )
    return out


class _TorchFlashVarlen(torch.autograd.Function):
    """Causal varlen attention through PyTorch's FlashAttention-2 kernels (forward and backward).

    The aten ops behind ``torch.nn.attention.varlen.varlen_attn``, called directly: their
    positional signature has been stable since torch 2.4, whereas the public wrapper's keywords
    changed between releases (``is_causal`` became ``window_size``; GQA became opt-in).
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cu: Tensor,
        max_seqlen: int,
        softmax_scale: float | None,
    ) -> Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_seqlen, max_seqlen, 0.0, True, False, scale=softmax_scale
        )  # out [T, H, D], lse [H, T]
        ctx.save_for_backward(q, k, v, out, lse, cu, rng_state, unused)
        ctx.max_seqlen, ctx.scale = max_seqlen, softmax_scale  # type: ignore[attr-defined]
        return out

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_out: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, None, None, None]:
        q, k, v, out, lse, cu, rng_state, unused = ctx.saved_tensors  # type: ignore[attr-defined]
        longest: int = ctx.max_seqlen  # type: ignore[attr-defined]
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad_out.contiguous(), q, k, v, out, lse, cu, cu, longest, longest, 0.0, True, rng_state, unused,
            scale=ctx.scale,  # type: ignore[attr-defined]
        )  # fmt: skip
        return dq, dk, dv, None, None, None


def _sdpa_packed(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, softmax_scale: float | None) -> Tensor:
    """The portable backend: one SDPA call in the cheaper of the two layouts."""
    num_tokens = q.shape[0]
    if num_tokens == 0:
        return q.clone()  # [0, H, D]: nothing to attend to
    out_dtype = q.dtype
    if q.device.type == "cpu" and q.dtype in _FLASH_DTYPES:
        # PyTorch's CPU attention kernel runs bf16 about 4x slower than float32 on AVX2 (measured:
        # 990 vs 270 ms at the long-tail benchmark shape); float32 is also the more accurate
        # softmax. The output is rounded back once.
        q, k, v = q.float(), k.float(), v.float()
    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # enable_gqa needs torch >= 2.5; the copy is T * H * D, small next to the scores
        k = k.repeat_interleave(groups, dim=1)  # [T, H, D]
        v = v.repeat_interleave(groups, dim=1)
    lengths, positions = _segments(cu_seqlens, num_tokens, q.device)
    longest = int(lengths.max())
    if _prefer_padded_rows(lengths.numel(), longest, num_tokens):
        out = _padded_rows_attention(q, k, v, lengths, positions, longest, softmax_scale)
    else:
        out = _windowed_attention(q, k, v, positions, longest, softmax_scale)
    return out.to(out_dtype)


def _segments(cu_seqlens: Tensor, num_tokens: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Lengths [B] of the non-empty sequences and each token's position in its sequence [T]."""
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    lengths = cu[1:] - cu[:-1]  # [B + empties]
    keep = lengths > 0
    lengths, starts = lengths[keep], cu[:-1][keep]  # [B]
    token_starts = torch.repeat_interleave(starts, lengths, output_size=num_tokens)  # [T]
    return lengths, torch.arange(num_tokens, device=device) - token_starts


def _block_size(longest: int) -> int:
    """Queries per block of the windowed layout: a power of two near sqrt(24 * L), in [16, 256]."""
    ideal = math.sqrt(_BLOCK_COST * longest)
    return min(_MAX_BLOCK, max(_MIN_BLOCK, 1 << round(math.log2(ideal))))


def _window_width(block: int, longest: int) -> int:
    """Keys per block: the block itself plus the L - 1 tokens before it, rounded up to 8."""
    width = block + longest - 1
    return -(-width // _WINDOW_ALIGN) * _WINDOW_ALIGN


def _prefer_padded_rows(num_seqs: int, longest: int, num_tokens: int) -> bool:
    """Whether [B, L] padded rows score fewer (weighted) query-key pairs than windowed blocks."""
    block = _block_size(longest)
    blocks = -(-num_tokens // block)
    windowed = _MASK_COST * blocks * block * _window_width(block, longest)
    return num_seqs * longest * longest <= windowed


def _padded_rows_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lengths: Tensor,
    positions: Tensor,
    longest: int,
    softmax_scale: float | None,
) -> Tensor:
    """Scatter tokens into [B, L] rows, one causal SDPA call, gather the real tokens back.

    Right padding needs no mask: a real query at position p sees keys 0..p of its own row, all
    real; pad queries see real keys (no empty softmax row) and their outputs are dropped.
    """
    num_seqs, num_tokens = lengths.numel(), q.shape[0]
    rows = torch.repeat_interleave(torch.arange(num_seqs, device=q.device), lengths, output_size=num_tokens)
    slots = rows * longest + positions  # [T] flat index into [B * L]

    def to_rows(t: Tensor) -> Tensor:  # [T, H, D] -> [B, H, L, D]
        # In place into a fresh zero buffer: out-of-place index_copy would clone it first.
        flat = t.new_zeros((num_seqs * longest, *t.shape[1:])).index_copy_(0, slots, t)
        return flat.view(num_seqs, longest, *t.shape[1:]).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        to_rows(q), to_rows(k), to_rows(v), is_causal=True, scale=softmax_scale
    )  # [B, H, L, D]
    return out.transpose(1, 2).reshape(num_seqs * longest, *q.shape[1:]).index_select(0, slots)


def _windowed_attention(
    q: Tensor, k: Tensor, v: Tensor, positions: Tensor, longest: int, softmax_scale: float | None
) -> Tensor:
    """Blocks of ``bs`` queries against the ``bs + L - 1`` keys ending at each block, one SDPA call.

    Query t (position p in its sequence) may see key s iff 0 <= t - s <= p: that alone keeps keys
    inside t's sequence (which starts p tokens back) and out of the future. Tail slots that pad T
    up to a block multiple get p = 0, so they see only their own (zero) key: no row of the mask
    is empty, hence no NaN; their outputs are dropped.
    """
    num_tokens, heads, dim = q.shape
    block = _block_size(longest)
    width = _window_width(block, longest)
    back = width - block  # keys before each block: >= L - 1
    blocks = -(-num_tokens // block)
    tail = blocks * block - num_tokens
    q_blocks = F.pad(q, (0, 0, 0, 0, 0, tail)).reshape(blocks, block, heads, dim).transpose(1, 2)
    k_windows = _key_windows(k, back, tail, block, width)  # [blocks, H, width, D]
    v_windows = _key_windows(v, back, tail, block, width)
    mask = _window_mask(F.pad(positions, (0, tail)), block, width)  # [blocks, 1, bs, width]
    out = F.scaled_dot_product_attention(
        q_blocks, k_windows, v_windows, attn_mask=mask, scale=softmax_scale
    )  # [blocks, H, bs, D]
    return out.transpose(1, 2).reshape(blocks * block, heads, dim)[:num_tokens]


def _key_windows(t: Tensor, back: int, tail: int, block: int, width: int) -> Tensor:
    """[T, H, D] -> [blocks, H, width, D]: window i holds tokens i * bs - back .. (i + 1) * bs - 1.

    A strided view of the zero-padded tensor (windows overlap; nothing is copied); autograd sums
    the overlapping gradients back (unfold's backward).
    """
    padded = F.pad(t, (0, 0, 0, 0, back, tail))  # [back + blocks * bs, H, D]
    return padded.unfold(0, width, block).transpose(2, 3)  # unfold puts the window dim last


def _window_mask(positions: Tensor, block: int, width: int) -> Tensor:
    """[blocks * bs] positions -> [blocks, 1, bs, width] bool: key j is allowed for query row r.

    Key column j of a block sits ``r + back - j`` tokens behind query row r (back = width - bs);
    allowed iff 0 <= distance <= position. Negative distances (the future) are mapped to a huge
    value up front, so the big [blocks, bs, width] mask costs a single comparison.
    """
    device = positions.device
    rows = torch.arange(block, device=device, dtype=torch.int32)
    cols = torch.arange(width, device=device, dtype=torch.int32)
    distance = rows[:, None] + (width - block) - cols[None, :]  # [bs, width]
    distance = distance.masked_fill(distance < 0, torch.iinfo(torch.int32).max)
    per_query = positions.to(torch.int32).view(-1, block, 1)  # [blocks, bs, 1]
    return (distance <= per_query).unsqueeze(1)


def _sdpa_per_sequence(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, softmax_scale: float | None
) -> Tensor:
    """Reference: one SDPA call per sequence (the former portable path; tests and benchmark only)."""
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
