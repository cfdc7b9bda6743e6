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
"""

from __future__ import annotations

import torch

__all__ = ["checksum"]

BLOCK_WORDS = 1024  # L: words per block of the weight table
_CHUNK_WORDS = {"cpu": 2**19}  # words per pass: 6 MiB of int32 temporaries stay in the L3 cache
_ACCELERATOR_CHUNK_WORDS = 2**24  # fewer kernel launches; 192 MiB of int32 temporaries
_MASK64 = (1 << 64) - 1

# device -> (T [2, L], U [2, num_blocks]) int32, U grown on demand.
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
    if cached is not None and cached[1].shape[1] >= num_blocks:
        return cached
    size = 1 << max(num_blocks - 1, 1).bit_length()  # next power of two: few regrowths
    # Four disjoint hash streams: T_1, T_2, U_1, U_2.
    positions = torch.arange(BLOCK_WORDS, dtype=torch.int64)
    blocks = torch.arange(size, dtype=torch.int64)
    position_weights = torch.stack([_splitmix32(positions * 4), _splitmix32(positions * 4 + 1)])
    block_weights = torch.stack([_splitmix32(blocks * 4 + 2), _splitmix32(blocks * 4 + 3)]) | 1
    _TABLES[device] = (position_weights.to(device), block_weights.to(device))
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
    total = torch.zeros(2, dtype=torch.int32, device=device)
    position_weights, block_weights = _tables(device, -(-num_words // BLOCK_WORDS))
    chunk = _CHUNK_WORDS.get(device.type, _ACCELERATOR_CHUNK_WORDS)
    chunk = min(chunk, -(-num_words // BLOCK_WORDS) * BLOCK_WORDS)
    buffer = torch.empty(chunk, dtype=torch.int32, device=device)  # [chunk]
    products = torch.empty(2, chunk, dtype=torch.int32, device=device)  # [2, chunk]
    for start in range(0, num_words, chunk):
        size = min(chunk, num_words - start)
        num_blocks = -(-size // BLOCK_WORDS)
        padded = buffer[: num_blocks * BLOCK_WORDS]
        padded[:size].copy_(words[start : start + size])  # widen to int32
        padded[size:].zero_()  # a zero word adds nothing
        product = products.view(2, -1, BLOCK_WORDS)[:, :num_blocks]  # [2, blocks, L]
        torch.mul(padded.view(1, num_blocks, BLOCK_WORDS), position_weights.unsqueeze(1), out=product)
        block_sums = product.sum(-1, dtype=torch.int32)  # [2, blocks]
        first = start // BLOCK_WORDS
        block_sums.mul_(block_weights[:, first : first + num_blocks])
        total.add_(block_sums.sum(-1, dtype=torch.int32))
    high, low = total.to(torch.int64).unbind()
    return (high << 32) | (low & 0xFFFFFFFF)
