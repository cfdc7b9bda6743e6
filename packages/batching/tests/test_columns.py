"""Column-dict variants: every column round-trips; errors name the column."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entrepot.batching import (
    LengthMismatchError,
    pack_columns,
    pad_columns,
    unpack_columns,
    unpad_columns,
)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=6), multiple=st.integers(1, 4))
def test_columns_round_trip(rows: list[tuple[int, int]], multiple: int) -> None:
    columns = {
        "prompts": [torch.arange(a, dtype=torch.int64) + 1 for a, _ in rows],
        "old_log_prob": [torch.linspace(-1, 0, b) for _, b in rows],
    }
    flat, lengths = pack_columns(columns)
    assert lengths["prompts"].tolist() == [a for a, _ in rows]
    unpacked = unpack_columns(flat, lengths)
    padded, pad_lengths = pad_columns(unpacked, pad_value={"prompts": -1}, multiple=multiple)
    back = unpad_columns(padded, pad_lengths)
    for name, original in columns.items():
        assert len(back[name]) == len(original)
        for a, b in zip(original, back[name], strict=True):
            assert torch.equal(a, b)


def test_pad_columns_from_packed_pairs_matches_reference_layout() -> None:
    flat = {
        "prompts": torch.tensor([1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, 4]),
        "attention_mask": torch.tensor([1, 2, 2, 3, 3, 3, 4, 4, 4, 4]),
    }
    lengths = {"prompts": torch.tensor([3, 4, 3, 4]), "attention_mask": torch.tensor([1, 2, 3, 4])}
    padded, _ = pad_columns({k: (flat[k], lengths[k]) for k in flat}, pad_value=-1, multiple=2)
    assert padded["prompts"].tolist() == [[1, 1, 1, -1], [2, 2, 2, 2], [3, 3, 3, -1], [4, 4, 4, 4]]
    assert padded["attention_mask"].tolist() == [[1, -1, -1, -1], [2, 2, -1, -1], [3, 3, 3, -1], [4, 4, 4, 4]]


def test_unpad_columns_with_shared_lengths() -> None:
    padded = {"a": torch.arange(6).reshape(2, 3), "b": torch.arange(6).reshape(2, 3) * 2}
    out = unpad_columns(padded, torch.tensor([1, 3]))
    assert out["b"][1].tolist() == [6, 8, 10]


def test_column_errors_name_the_column() -> None:
    with pytest.raises(LengthMismatchError, match="column 'b': lengths sum to 3"):
        unpack_columns({"a": torch.arange(2), "b": torch.arange(4)}, {"a": [2], "b": [3]})
    with pytest.raises(LengthMismatchError, match="no lengths for column 'b'"):
        unpack_columns({"a": torch.arange(2), "b": torch.arange(4)}, {"a": [2]})
    with pytest.raises(LengthMismatchError, match="different row counts"):
        pack_columns({"a": [torch.zeros(1)], "b": [torch.zeros(1), torch.zeros(2)]})
