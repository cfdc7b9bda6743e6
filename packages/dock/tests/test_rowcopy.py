"""Row copies (_rowcopy): what goes in padded comes out padded, byte for byte, whatever the layout."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from entrepot.dock import ColumnSpec, ExperienceDock, Padding
from entrepot.dock._rowcopy import RowSource, gather_into, pad_rows, unpad_into

DTYPES = [torch.int64, torch.int32, torch.int8, torch.float32, torch.float16, torch.bfloat16, torch.bool]


def _padded(lengths: list[int], dtype: torch.dtype, extra: int = 0) -> torch.Tensor:
    """[B, max(lengths) + extra] random values of `dtype` (bool: alternating)."""
    gen = torch.Generator().manual_seed(len(lengths))
    values = torch.randint(-50, 50, (len(lengths), max(lengths, default=0) + extra), generator=gen)
    return values % 2 == 0 if dtype == torch.bool else values.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unpad_then_pad_round_trips_every_dtype(dtype):
    lengths = [3, 0, 5, 1]
    padded = _padded(lengths, dtype, extra=2)
    flat = torch.empty(sum(lengths), dtype=dtype)
    unpad_into(padded, lengths, flat)
    assert torch.equal(flat, torch.cat([row[:n] for row, n in zip(padded, lengths, strict=True)]))
    pad_value = True if dtype == torch.bool else 7
    out = pad_rows(RowSource.packed(flat, torch.tensor(lengths)), pad_value, pad_multiple=4)
    rows = list(torch.split(flat, lengths))
    expected = pad_sequence(rows, batch_first=True, padding_value=pad_value)
    expected = torch.nn.functional.pad(expected, (0, 8 - expected.shape[1]), value=pad_value)
    assert out.dtype == dtype and torch.equal(out, expected)


LAYOUTS = ["rows of a wider tensor", "every other row", "column-major", "int32", "0 wide"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_put_of_unusual_padded_layouts_stores_the_valid_values(layout):
    base = _padded([4, 4, 4, 4, 4, 4], torch.int64, extra=3)  # [6, 7]
    padded = {
        "rows of a wider tensor": base[:4, :4],  # row stride 7
        "every other row": base[::2, :4],  # row stride 14
        "column-major": base[:4, :4].t().contiguous().t(),
        "int32": base[:4, :4].to(torch.int32),  # converted to the column's int64
        "0 wide": base[:4, :0],
    }[layout]
    lengths = torch.tensor([0, 0, 0, 0] if layout == "0 wide" else [2, 4, 0, 3])[: padded.shape[0]]
    dock = ExperienceDock(8, columns={"x": ColumnSpec(dtype=torch.int64, scalar=False)}, consumers=["c"])
    rows = torch.arange(padded.shape[0])
    dock.put({"x": padded}, rows, lengths={"x": lengths})
    batch = dock.peek(["x"], rows, layout="packed")
    expected = torch.cat([row[:n] for row, n in zip(padded, lengths.tolist(), strict=True)])
    assert torch.equal(batch.data["x"], expected.to(torch.int64))


def test_padded_get_of_rows_in_several_segments_and_orders():
    dock = ExperienceDock(64, columns=["x"], consumers=["c"])
    expected = {}
    for start in range(0, 64, 8):  # 8 puts grow the store over several segments
        lengths = [(start + i) % 7 * 300 for i in range(8)]
        padded = _padded(lengths, torch.int64)
        dock.put({"x": padded}, range(start, start + 8), lengths={"x": torch.tensor(lengths)})
        expected.update({start + i: padded[i, :n] for i, n in enumerate(lengths)})
    assert len(dock._table.stores["x"].segments) > 2  # the point of the test: rows come from several
    order = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    batch = dock.peek(["x"], order, padding=Padding(value=-1))
    assert torch.equal(batch.data["x"], pad_sequence([expected[int(r)] for r in order], True, -1))


def test_padding_is_the_asked_value_whatever_came_before():
    """The pad bytes are kept per (dtype, value) between gets: a wider batch, another value, -0.0
    after 0.0 and NaN each get their own."""
    flat = torch.arange(1, 7, dtype=torch.float32)
    for width, pad_value in [(3, 0.0), (9000, 0.0), (3, -0.0), (5, float("nan")), (5, float("nan")), (4, 7)]:
        lengths = torch.tensor([1, 2, 3])
        out = pad_rows(RowSource.packed(flat, lengths), pad_value, pad_multiple=width)
        assert out.shape == (3, width)
        tails = torch.cat([out[0, 1:], out[1, 2:], out[2, 3:]])
        expected = torch.full_like(tails, pad_value)
        assert torch.equal(tails.view(torch.int32), expected.view(torch.int32))  # bit for bit: -0.0, NaN
        assert out[2, :3].tolist() == [4.0, 5.0, 6.0]


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, torch.bool])
def test_gather_writes_repeated_rows_as_one_memcpy_per_row_would(dtype):
    """Runs of one row repeated (a fan-out: 1, 2, 3, 8 and 13 copies, empty rows among them) are
    written once and doubled in place; the result is the rows one after another."""
    first, second = _padded([40], dtype).reshape(-1), _padded([25], dtype, extra=6).reshape(-1)
    plan = [
        (0, 0, 5, 1),
        (1, 3, 7, 2),
        (0, 10, 0, 3),
        (0, 2, 9, 8),
        (1, 0, 30, 1),
        (0, 1, 3, 13),
        (1, 4, 2, 3),
    ]
    which, starts, lengths = [], [], []
    for source, start, length, copies in plan:
        which += [source] * copies
        starts += [start] * copies
        lengths += [length] * copies
    rows = RowSource([first, second], torch.tensor(which), torch.tensor(starts), torch.tensor(lengths))
    out = torch.empty(sum(lengths), dtype=dtype)
    gather_into(rows, out)
    sources = (first, second)
    expected = torch.cat([sources[j][s : s + n] for j, s, n in zip(which, starts, lengths, strict=True)])
    assert torch.equal(out, expected)
