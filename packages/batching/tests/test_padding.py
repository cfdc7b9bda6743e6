"""pad / unpad / pack / unpack: exact round trips, views, alignment and typed errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entrepot.batching import (
    InvalidArgumentError,
    InvalidLengthError,
    LengthMismatchError,
    pack,
    pad,
    unpack,
    unpad,
)

DTYPES = [torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.bool]


def _sequences(lengths: list[int], dtype: torch.dtype, trailing: tuple[int, ...] = ()) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(sum(lengths) + len(lengths))
    out = []
    for n in lengths:
        values = torch.randn((n, *trailing), generator=gen) * 100
        out.append(values > 0 if dtype == torch.bool else values.to(dtype))
    return out


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), max_size=8),
    dtype=st.sampled_from(DTYPES),
    trailing=st.sampled_from([(), (3,), (2, 2)]),
    multiple=st.integers(1, 5),
)
def test_pad_unpad_round_trip_exact(
    lengths: list[int], dtype: torch.dtype, trailing: tuple[int, ...], multiple: int
) -> None:
    seqs = _sequences(lengths, dtype, trailing)
    padded, got_lengths = pad(seqs, pad_value=0, multiple=multiple)
    assert got_lengths.tolist() == lengths
    assert got_lengths.dtype == torch.int64
    if seqs:
        assert padded.shape[0] == len(lengths)
        assert padded.shape[1] % multiple == 0
        assert padded.shape[1] - max(lengths) < multiple
        assert padded.dtype == dtype
    back = unpad(padded, got_lengths)
    assert len(back) == len(seqs)
    for original, restored in zip(seqs, back, strict=True):
        assert torch.equal(original, restored)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), max_size=8),
    dtype=st.sampled_from(DTYPES),
    trailing=st.sampled_from([(), (4,)]),
)
def test_pack_unpack_round_trip_exact(
    lengths: list[int], dtype: torch.dtype, trailing: tuple[int, ...]
) -> None:
    seqs = _sequences(lengths, dtype, trailing)
    flat, got_lengths = pack(seqs)
    assert got_lengths.tolist() == lengths
    assert flat.shape[0] == sum(lengths)
    back = unpack(flat, got_lengths)
    for original, restored in zip(seqs, back, strict=True):
        assert torch.equal(original, restored)


def test_pad_fills_pad_value_and_rounds_width() -> None:
    padded, lengths = pad([torch.tensor([1, 2, 3]), torch.tensor([4])], pad_value=-1, multiple=4)
    assert padded.tolist() == [[1, 2, 3, -1], [4, -1, -1, -1]]
    assert lengths.tolist() == [3, 1]


def test_pad_accepts_packed_pair() -> None:
    flat = torch.tensor([1, 1, 1, 2, 2, 2, 2, 3, 3, 3])
    padded, lengths = pad((flat, torch.tensor([3, 4, 3])), pad_value=-1, multiple=2)
    assert padded.tolist() == [[1, 1, 1, -1], [2, 2, 2, 2], [3, 3, 3, -1]]
    assert lengths.tolist() == [3, 4, 3]


def test_unpad_and_unpack_return_views() -> None:
    padded = torch.arange(12).reshape(3, 4)
    rows = unpad(padded, torch.tensor([1, 4, 2]))
    rows[1][0] = 100
    assert padded[1, 0] == 100
    flat = torch.arange(6)
    parts = unpack(flat, [2, 0, 4])
    parts[2][0] = -5
    assert flat[2] == -5
    assert [p.numel() for p in parts] == [2, 0, 4]


def test_empty_inputs_return_empty() -> None:
    flat, lengths = pack([])
    assert flat.numel() == 0 and lengths.numel() == 0
    padded, lengths = pad([])
    assert padded.shape == (0, 0) and lengths.numel() == 0
    assert unpack(torch.empty(0), []) == []
    assert unpad(torch.empty(0, 3), []) == []


def test_errors_name_the_problem() -> None:
    with pytest.raises(LengthMismatchError, match="sum to 5 but flat has 4"):
        unpack(torch.arange(4), [2, 3])
    with pytest.raises(InvalidLengthError, match=r"lengths\[1\] = -1"):
        unpack(torch.arange(4), [5, -1])
    with pytest.raises(LengthMismatchError, match=r"lengths\[0\] = 5 exceeds the padded width L = 4"):
        unpad(torch.zeros(2, 4), [5, 1])
    with pytest.raises(LengthMismatchError, match="3 lengths for 2 padded rows"):
        unpad(torch.zeros(2, 4), [1, 1, 1])
    with pytest.raises(InvalidArgumentError, match=r"sequences\[1\] has dtype torch.float32"):
        pack([torch.zeros(2, dtype=torch.int64), torch.zeros(2)])
    with pytest.raises(InvalidArgumentError, match="multiple must be an int >= 1"):
        pad([torch.zeros(2)], multiple=0)
    with pytest.raises(InvalidLengthError, match="integer dtype"):
        unpack(torch.arange(4), torch.tensor([2.0, 2.0]))


@pytest.mark.parametrize("multiple", [1, 4])
def test_mismatched_rank_or_trailing_shape_is_named(multiple: int) -> None:
    for bad in (
        [torch.zeros(2), torch.zeros(2, 2)],
        [torch.zeros(2, 3), torch.zeros(2, 2)],
        [torch.zeros(2), 5],
    ):
        with pytest.raises(InvalidArgumentError, match=r"sequences\[1\]"):
            pack(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match=r"sequences\[1\]"):
            pad(bad, multiple=multiple)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match=r"sequences\[1\]"):
            pad(bad, multiple=8)  # type: ignore[arg-type]  (the row-copy path)
    with pytest.raises(InvalidArgumentError, match=r"sequences\[0\] is a 0-d tensor"):
        pack([torch.tensor(1), torch.zeros(2)])
