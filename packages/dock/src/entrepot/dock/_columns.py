"""Per-column storage: one flat buffer per column, rows addressed by (offset, length).

Layout (one `_SequenceColumn` per variable-length column):

    buffer   [N]         the column's dtype; the valid tokens of every row written, back to back
    offsets  [capacity]  int64; where row r starts in `buffer`
    lengths  [capacity]  int64; how many elements row r has

A write appends the rows of one put to the end of `buffer` (one copy, rows stay contiguous, so a
later get of consecutive rows is one memcpy); a rewritten row leaves garbage behind, which is
dropped by compaction when the buffer would otherwise grow. Existing bytes are never modified in
place: a reader that took a snapshot (buffer reference + offsets) under the dock lock can copy out
after releasing the lock, concurrently with puts. Scalar columns are one dense [capacity] tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

_MIN_BUFFER = 1 << 12
_INT_FLOAT_MANTISSA = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


class _Copyable(Protocol):
    @property
    def numel(self) -> int: ...

    def copy_into(self, out: torch.Tensor) -> None: ...


Source = torch.Tensor | _Copyable


@dataclass(frozen=True)
class ColumnSpec:
    """What a column stores.

    Args:
        dtype: the stored dtype; None lets the first put fix it (later puts must convert losslessly).
        scalar: True for one value per row (lengths, scores), False for a variable-length 1-D tensor per
            row; None lets the first put decide from the data's shape.
    """

    dtype: torch.dtype | None = None
    scalar: bool | None = None


def is_lossless(src: torch.dtype, dst: torch.dtype) -> bool:
    """True if every value of `src` is exactly representable in `dst`."""
    if src == dst or src == torch.bool:
        return True
    if dst == torch.bool or src.is_complex or dst.is_complex:
        return False
    if not src.is_floating_point and not dst.is_floating_point:
        return torch.promote_types(src, dst) == dst
    if src.is_floating_point and dst.is_floating_point:
        return torch.promote_types(src, dst) == dst
    if src.is_floating_point:  # float -> int
        return False
    bits = torch.iinfo(src).bits - (1 if src.is_signed else 0)
    return bits <= _INT_FLOAT_MANTISSA.get(dst, 0)


@dataclass
class SeqSnapshot:
    """What a reader needs to copy rows out after releasing the dock lock (buffers are append-only)."""

    buffer: torch.Tensor  # [N] the column's buffer at snapshot time
    offsets: torch.Tensor  # int64 [B]
    lengths: torch.Tensor  # int64 [B]

    @property
    def numel(self) -> int:
        return int(self.lengths.sum())

    def _runs(self) -> tuple[list[int], list[int], list[int]]:
        """Runs of rows adjacent in the buffer: (buffer start, elements, rows) per run."""
        offsets, lengths = self.offsets, self.lengths
        breaks = (offsets[1:] != offsets[:-1] + lengths[:-1]).nonzero().squeeze(1) + 1
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), breaks])
        ends = torch.cat([breaks, torch.tensor([offsets.numel()])])
        run_elems = torch.cumsum(lengths, 0)
        run_lengths = run_elems[ends - 1] - torch.where(starts > 0, run_elems[starts - 1], 0)
        return offsets[starts].tolist(), run_lengths.tolist(), (ends - starts).tolist()

    def views(self) -> list[torch.Tensor]:
        """One view of the buffer per row (no copy), split run by run in C++."""
        if self.offsets.numel() == 0:
            return []
        out: list[torch.Tensor] = []
        sizes = self.lengths.tolist()
        first = 0
        for start, size, num_rows in zip(*self._runs(), strict=True):
            out.extend(torch.split(self.buffer.narrow(0, start, size), sizes[first : first + num_rows]))
            first += num_rows
        return out

    def gather(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Copy the rows into one flat tensor [sum(lengths)], one memcpy per run of adjacent rows."""
        total = self.numel
        if out is None:
            out = torch.empty(total, dtype=self.buffer.dtype)
        if total == 0:
            return out
        # A run continues while the next row starts where this one ends (rows put together are adjacent).
        starts, sizes, _ = self._runs()
        dst = 0
        for start, size in zip(starts, sizes, strict=True):
            out.narrow(0, dst, size).copy_(self.buffer.narrow(0, start, size))
            dst += size
        return out


class SequenceColumn:
    """A variable-length column: flat append-only buffer + per-row offsets and lengths."""

    def __init__(self, capacity: int, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.offsets = torch.zeros(capacity, dtype=torch.int64)
        self.lengths = torch.zeros(capacity, dtype=torch.int64)
        self.buffer = torch.empty(0, dtype=dtype)
        self.used = 0  # elements of `buffer` written so far
        self.live = 0  # elements that belong to ready rows (used - live is garbage)

    @property
    def nbytes_live(self) -> int:
        return self.live * self.buffer.element_size()

    @property
    def nbytes_allocated(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def write(self, rows: torch.Tensor, source: Source, lengths: torch.Tensor, ready: torch.Tensor) -> None:
        """Append the rows' values back to back and point `rows` at them.

        Args:
            rows: int64 [B] row indexes (distinct).
            source: a flat [T] tensor, or anything with `numel` and `copy_into(out)` (T = lengths.sum()).
            lengths: int64 [B].
            ready: bool [capacity] this column's ready bits before the write (for garbage accounting).
        """
        total = source.numel() if isinstance(source, torch.Tensor) else source.numel
        self.live -= int(self.lengths[rows][ready[rows]].sum())
        if self.used + total > self.buffer.numel():
            self._make_room(total, ready, rows)
        starts = self.used + torch.cumsum(lengths, 0) - lengths
        target = self.buffer.narrow(0, self.used, total)
        if isinstance(source, torch.Tensor):
            target.copy_(source)
        else:
            source.copy_into(target)
        self.offsets[rows] = starts
        self.lengths[rows] = lengths
        self.used += total
        self.live += total

    def _make_room(self, incoming: int, ready: torch.Tensor, rows: torch.Tensor) -> None:
        """Compact live rows into a new buffer, at least twice what is needed (amortised O(1) appends)."""
        keep = ready.clone()
        keep[rows] = False  # being rewritten
        size = max(_MIN_BUFFER, 2 * (self.live + incoming), self.buffer.numel())
        if self.live + incoming <= self.buffer.numel() // 2:
            size = self.buffer.numel()  # enough garbage to reclaim: compact without growing
        kept = keep.nonzero().squeeze(1)
        kept = kept[torch.argsort(self.offsets[kept], stable=True)]  # buffer order keeps runs adjacent
        fresh = torch.empty(size, dtype=self.dtype)
        snap = SeqSnapshot(self.buffer, self.offsets[kept], self.lengths[kept])
        snap.gather(out=fresh.narrow(0, 0, snap.numel))
        self.offsets[kept] = torch.cumsum(snap.lengths, 0) - snap.lengths
        self.buffer = fresh  # readers holding the old buffer keep it alive until they finish
        self.used = snap.numel

    def snapshot(self, rows: torch.Tensor) -> SeqSnapshot:
        return SeqSnapshot(self.buffer, self.offsets[rows], self.lengths[rows])

    def forget(self, rows: torch.Tensor, ready: torch.Tensor) -> None:
        """Rows stop being ready: count their elements as garbage."""
        self.live -= int(self.lengths[rows][ready[rows]].sum())
        self.lengths[rows] = 0

    def drop_all(self) -> None:
        # A fresh buffer, never the old one: readers may still be copying out of it.
        self.buffer = torch.empty(0, dtype=self.dtype)
        self.lengths.zero_()
        self.used = 0
        self.live = 0


class ScalarColumn:
    """One value per row in a dense [capacity] tensor."""

    def __init__(self, capacity: int, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.values = torch.zeros(capacity, dtype=dtype)

    @property
    def nbytes_allocated(self) -> int:
        return self.values.numel() * self.values.element_size()

    def write(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        self.values[rows] = values.to(self.dtype)

    def read(self, rows: torch.Tensor) -> torch.Tensor:
        return self.values[rows]  # advanced indexing copies: safe to use outside the lock
