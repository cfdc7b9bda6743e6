"""The position-mixed checksum: swaps at any distance change it; equal bytes give equal values."""

from __future__ import annotations

import pytest
import torch

from entrepot.resharding import _checksum
from entrepot.resharding._checksum import BLOCK_WORDS, checksum

# The old weights repeated with period 65,521; the new ones are built from blocks of
# BLOCK_WORDS 16-bit words (a bf16 element is one word, an fp32 element two).
DISTANCES = [
    1,
    2,
    BLOCK_WORDS - 1,
    BLOCK_WORDS,
    BLOCK_WORDS + 1,
    65_521,
    2 * 65_521,
    65_536,
    2**19,
    2**19 + 1,
]


def _swapped(tensor: torch.Tensor, pairs: list[tuple[int, int]]) -> torch.Tensor:
    out = tensor.clone()
    flat = out.view(-1)
    for i, k in pairs:
        flat[i], flat[k] = tensor.view(-1)[k], tensor.view(-1)[i]
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("distance", DISTANCES)
def test_swapping_two_elements_changes_the_checksum_at_any_distance(
    dtype: torch.dtype, distance: int
) -> None:
    generator = torch.Generator().manual_seed(distance)
    tensor = torch.randn(2**19 + 2**12, generator=generator).to(dtype)
    first = int(torch.randint(0, tensor.numel() - distance, (1,), generator=generator))
    second = first + distance
    assert tensor[first] != tensor[second]
    assert checksum(_swapped(tensor, [(first, second)])) != checksum(tensor)


def test_random_swaps_and_single_bit_flips_are_all_caught() -> None:
    generator = torch.Generator().manual_seed(0)
    tensor = torch.randn(700, 300, generator=generator).to(torch.bfloat16)
    reference = checksum(tensor)
    for _ in range(200):
        i, k = torch.randint(0, tensor.numel(), (2,), generator=generator).tolist()
        if tensor.view(-1)[i] != tensor.view(-1)[k]:
            assert checksum(_swapped(tensor, [(i, k)])) != reference, (i, k)
        flipped = tensor.clone()
        flipped.view(torch.int16).view(-1)[i] ^= 1 << int(torch.randint(0, 16, (1,), generator=generator))
        assert checksum(flipped) != reference, i


def test_a_sign_swap_is_caught() -> None:
    """x and -x differ only in the top bit of a word: the weakest case of the weighting."""
    tensor = torch.randn(2**18, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    tensor[70_000] = -tensor[3]
    assert checksum(_swapped(tensor, [(3, 70_000)])) != checksum(tensor)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.uint8])
def test_equal_bytes_give_equal_checksums_whatever_the_strides(dtype: torch.dtype) -> None:
    full = (torch.randn(300, 700, generator=torch.Generator().manual_seed(2)) * 50).to(dtype)
    region = full[:, 100:400]  # a TP slice along dim 1: strided
    assert not region.is_contiguous()
    assert int(checksum(region)) == int(checksum(region.contiguous())) == int(checksum(region.clone()))
    assert checksum(region).dtype == torch.int64 and checksum(region).dim() == 0


def test_the_value_does_not_depend_on_the_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks only bound the temporaries (CPU and accelerators use different sizes)."""
    tensor = torch.randn(3 * 2**19 + 5, generator=torch.Generator().manual_seed(3))
    whole = int(checksum(tensor))
    monkeypatch.setitem(_checksum._CHUNK_WORDS, "cpu", 3 * BLOCK_WORDS)
    assert int(checksum(tensor)) == whole
    assert int(checksum(tensor.view(torch.int16))) == whole  # 16-bit words are the unit
    assert int(checksum(torch.zeros(0))) == 0
    assert int(checksum(torch.tensor(1.5))) == int(checksum(torch.tensor([1.5])))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_and_cpu_give_the_same_checksum() -> None:
    tensor = torch.randn(2**20 + 17, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    on_gpu = checksum(tensor.cuda())
    assert on_gpu.device.type == "cuda"
    assert int(on_gpu) == int(checksum(tensor))


def test_the_value_follows_the_documented_formula() -> None:
    """sum_j = sum_i b_i T_j[i mod L] U_j[i div L] mod 2^32, j = 1, 2; value (sum_1 << 32) | sum_2."""
    words = torch.randint(-(2**15), 2**15, (3 * BLOCK_WORDS + 7,), generator=torch.Generator().manual_seed(6))
    words = words.to(torch.int16)
    index = torch.arange(words.numel())
    position, block = index % BLOCK_WORDS, index // BLOCK_WORDS
    sums = []
    for j in range(2):  # T_j = splitmix(4p + j), U_j = splitmix(4b + 2 + j) | 1; int64 wraps mod 2^64
        splitmix = _checksum._splitmix32
        weights = splitmix(position * 4 + j).long() * (splitmix(block * 4 + 2 + j) | 1)
        sums.append(int((words.long() * weights).sum()) & 0xFFFFFFFF)
    expected = (sums[0] << 32) | sums[1]
    assert int(checksum(words)) & 0xFFFFFFFFFFFFFFFF == expected


def test_a_batch_of_checksums_equals_one_checksum_each() -> None:
    """`checksums` (one pass over many slices, as a resharding round verifies) is `checksum` per slice:
    mixed dtypes, strided and empty slices, sizes on and off block boundaries, byte words."""
    from entrepot.resharding._checksum import checksums

    generator = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(5000, generator=generator).to(torch.bfloat16),
        torch.randn(37, 129, generator=generator)[:, 3:70],  # narrowed on dim 1: strided
        torch.zeros(0),
        torch.randint(0, 255, (3000,), dtype=torch.uint8, generator=generator),
        torch.randn(BLOCK_WORDS * 3, generator=generator),
        torch.randn(3, generator=generator).to(torch.float16),
    ]
    assert checksums(tensors).tolist() == [int(checksum(t)) for t in tensors]
    assert checksums([]).numel() == 0
