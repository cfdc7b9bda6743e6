"""A position-mixed checksum of a tensor's bits: moving any element changes it, at any distance.

The tensor's bytes are read as 16-bit words ``b_i`` (bytes for 1-byte dtypes), flat index
``i`` in row-major order, and summed with pseudo-random position weights, twice, with two
independent weight sets, each in wrapping int32 arithmetic:

    sum_j = sum_i b_i * T_j[i mod L] * U_j[i div L]  (mod 2^32),  j = 1, 2

``T_j`` (length ``L``) and ``U_j`` (one entry per block of ``L`` words, odd) are splitmix64
hashes of the position, so the weight sequence has no period: the old weights
``i % 65521 + 1`` repeated every 65,521 elements, and elements 65,521 apart could
swap places unseen. Swapping words ``a != b`` at ``i != k`` changes ``sum_j`` by
``(a - b) * (w_j(i) - w_j(k))``, which is zero mod 2^32 for random weights with probability
``2^-(32 - v)``, ``v`` the trailing zero bits of ``a - b`` (at most 15): both sums miss a swap
with probability about 2^-62 for most pairs, and at most 2^-34 (two words that differ only
in their top bit, e.g. ``x`` and ``-x`` in bf16).

Why int32 twice rather than int64 once: CPUs without AVX-512 have no vector 64-bit multiply,
so one int64 multiply-and-sum pass costs more than two int32 ones (measured on one core: 1.4
vs 3.2 GB/s of bf16). Integer sums are exact and order-free, so the value is the same on every
rank, device and chunking: the words are processed in chunks (cache-sized on CPU, larger on
accelerators) only to bound the temporaries.

A resharding checksums every slice twice, hundreds of calls of a few MB each, so on an
accelerator the cost is the host's per-op overhead, not bandwidth (one H100 run: 182 us per
2 MiB call, 0.14 s of a 0.16 s verified sync of Qwen3-0.6B). A call is therefore four kernels
per chunk: the words are widened inside the position-weight multiply (int16 x int32 promotes),
and the two int32 sums are kept as ``[sum_2, sum_1]`` so that their 8 bytes, read as one
little-endian int64, are ``(sum_1 << 32) | (sum_2 mod 2^32)``: no combining op.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["checksum", "checksums"]

BLOCK_WORDS = 1024  # L: words per block of the weight table
_CHUNK_WORDS = {"cpu": 2**19}  # words per pass: 6 MiB of int32 temporaries stay in the L3 cache
_ACCELERATOR_CHUNK_WORDS = 2**24  # fewer kernel launches; 192 MiB of int32 temporaries
_MASK64 = (1 << 64) - 1

# device -> (T [2, L], U^T [num_blocks, 2]) int32 (rows: set 2, set 1), U grown on demand.
_TABLES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _signed64(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic, which would copy the sign bit)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix32(index: torch.Tensor) -> torch.Tensor:
    """splitmix64 of each int64 in ``index`` (wrapping arithmetic), its top 32 bits as int32."""
    z = index * _signed64(0x9E3779B97F4A7C15) + _signed64(0x9E3779B97F4A7C15)
    z = (z ^ _shift_right(z, 30)) * _signed64(0xBF58476D1CE4E5B9)
    z = (z ^ _shift_right(z, 27)) * _signed64(0x94D049BB133111EB)
    z = z ^ _shift_right(z, 31)
    return (z >> 32).to(torch.int32)  # in [-2^31, 2^31): exact


def _tables(device: torch.device, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Both weight sets on ``device``, computed on the CPU so every device gets the same bits."""
    cached = _TABLES.get(device)
    if cached is not None and cached[1].shape[0] >= num_blocks:
        return cached
    size = 1 << max(num_blocks - 1, 1).bit_length()  # next power of two: few regrowths
    # Four disjoint hash streams: T_1, T_2, U_1, U_2.
    positions = torch.arange(BLOCK_WORDS, dtype=torch.int64)
    blocks = torch.arange(size, dtype=torch.int64)
    # Rows in the order [set 2, set 1]: see `checksum` for why.
    position_weights = torch.stack([_splitmix32(positions * 4 + 1), _splitmix32(positions * 4)])
    block_weights = torch.stack([_splitmix32(blocks * 4 + 3), _splitmix32(blocks * 4 + 2)]) | 1
    # U transposed ([num_blocks, 2], contiguous) so that a chunk's block weights are one row slice.
    _TABLES[device] = (position_weights.to(device), block_weights.t().contiguous().to(device))
    return _TABLES[device]


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat contiguous int16 (uint8 for 1-byte dtypes) view, in row-major order."""
    flat = tensor.reshape(-1)  # a copy only when the tensor is strided (e.g. narrowed on dim 1)
    return flat.view(torch.uint8 if tensor.element_size() == 1 else torch.int16)


def checksum(tensor: torch.Tensor) -> torch.Tensor:
    """Position-mixed checksum of ``tensor``'s bits: a 0-d int64 on its device (no host sync).

    Equal for two tensors with the same bytes in row-major order, whatever their strides;
    different, with overwhelming probability, when an element changed or two swapped places.
    """
    words = _words(tensor)
    num_words = words.numel()
    device = words.device
    if num_words == 0:
        return torch.zeros((), dtype=torch.int64, device=device)
    num_blocks = -(-num_words // BLOCK_WORDS)
    if num_words % BLOCK_WORDS:  # a zero word adds nothing
        words = torch.nn.functional.pad(words, (0, num_blocks * BLOCK_WORDS - num_words))
    blocks = words.view(num_blocks, 1, BLOCK_WORDS)  # [blocks, 1, L]
    position_weights, block_weights = _tables(device, num_blocks)  # [2, L], [>= blocks, 2]
    chunk = max(_CHUNK_WORDS.get(device.type, _ACCELERATOR_CHUNK_WORDS) // BLOCK_WORDS, 1)  # blocks per pass
    total: torch.Tensor | None = None  # [2] int32: [sum_2, sum_1]
    for first in range(0, num_blocks, chunk):
        part = blocks[first : first + chunk]  # [c, 1, L]
        block_sums = (part * position_weights).sum(-1, dtype=torch.int32)  # [c, 2]: widened in the multiply
        block_sums = (block_sums * block_weights[first : first + part.shape[0]]).sum(0, dtype=torch.int32)
        total = block_sums if total is None else total.add_(block_sums)
    assert total is not None  # num_words > 0
    # [sum_2, sum_1] read as one little-endian int64 is (sum_1 << 32) | (sum_2 mod 2^32).
    return total.view(torch.int64)[0]


def checksums(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """`checksum` of each of `tensors` (all on one device) in a few kernels: int64 [len(tensors)].

    A resharding checksums hundreds of slices a round; one call each costs the host's per-op
    overhead hundreds of times on an accelerator. Here the slices' words are laid end to end, each
    padded to whole blocks (so every slice's positions start at 0 as in `checksum`), and weighted,
    summed per block and added into their slice's row in one pass. 1-byte dtypes (byte words) take
    `checksum` one by one.
    """
    if not tensors:
        return torch.zeros(0, dtype=torch.int64)
    device = tensors[0].device
    totals = torch.zeros(len(tensors), 2, dtype=torch.int32, device=device)  # [n, (sum_2, sum_1)]
    out = totals.view(torch.int64).squeeze(1)  # [n]: each row read as `checksum` reads its total
    pieces: list[torch.Tensor] = []
    rows: list[int] = []
    counts: list[int] = []
    for row, tensor in enumerate(tensors):
        if tensor.element_size() == 1:
            out[row] = checksum(tensor)
            continue
        words = _words(tensor)
        num_blocks = -(-words.numel() // BLOCK_WORDS)
        if not num_blocks:
            continue
        pieces.append(words)
        pad = num_blocks * BLOCK_WORDS - words.numel()
        if pad:  # a zero word adds nothing
            pieces.append(torch.zeros(pad, dtype=torch.int16, device=device))
        rows.append(row)
        counts.append(num_blocks)
    if not pieces:
        return out
    blocks = torch.cat(pieces).view(-1, 1, BLOCK_WORDS)  # [B, 1, L] every slice's blocks
    sizes = torch.tensor(counts)
    block_row = torch.repeat_interleave(torch.tensor(rows), sizes)  # [B] the slice of each block
    starts = torch.cumsum(sizes, 0) - sizes
    local = torch.arange(int(sizes.sum())) - torch.repeat_interleave(starts, sizes)  # [B] block in slice
    block_row, local = block_row.to(device), local.to(device)
    position_weights, block_weights = _tables(device, max(counts))  # [2, L], [>= blocks, 2]
    chunk = max(_CHUNK_WORDS.get(device.type, _ACCELERATOR_CHUNK_WORDS) // BLOCK_WORDS, 1)  # blocks per pass
    for first in range(0, blocks.shape[0], chunk):
        part = blocks[first : first + chunk]  # [c, 1, L]
        block_sums = (part * position_weights).sum(-1, dtype=torch.int32)  # [c, 2]
        block_sums.mul_(block_weights[local[first : first + chunk]])  # wrapping int32, as in `checksum`
        totals.index_add_(0, block_row[first : first + chunk], block_sums)
    return out
