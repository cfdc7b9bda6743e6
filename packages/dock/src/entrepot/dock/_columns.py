"""Per-column storage: flat append-only segments per column, rows addressed by (offset, length).

Layout (one `SequenceColumn` per variable-length column):

    segments [S] x [N_s]  the column's dtype; the valid elements of every row written, back to back
    bases    [S]          where segment s starts in one virtual address space (gaps between segments)
    offsets  [capacity]   int64; where row r starts in that address space
    lengths  [capacity]   int64; how many elements row r has

A write appends the rows of one put to the end of the last segment (one copy; the rows of a put
stay adjacent, so a later get of consecutive rows is one memcpy). When it does not fit, a new
segment is added (as large as everything so far: geometric growth with no copy of old data) or,
when at least half of what is allocated is garbage from rewritten or cleared rows, the live rows are
compacted into one fresh segment. Existing bytes are never modified: a reader that took a snapshot
(segments + offsets) under the dock lock copies out after releasing it, concurrently with puts.
Scalar columns are one dense [capacity] tensor.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np
import torch

from entrepot.dock._rowcopy import RowSource, as_bytes

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
    """What a reader needs to copy rows out after releasing the dock lock (segments are append-only)."""

    segments: list[torch.Tensor]  # the column's segments at snapshot time
    bases: list[int]  # their start addresses
    offsets: torch.Tensor  # int64 [B] row start addresses
    lengths: torch.Tensor  # int64 [B]

    @property
    def dtype(self) -> torch.dtype:
        return self.segments[0].dtype

    @cached_property
    def numel(self) -> int:
        return int(self.lengths.sum())  # read twice by a packed get (its bytes, its output)

    def _runs(self) -> list[torch.Tensor]:
        """Runs of rows adjacent in one segment, in row order: a view of the segment per run.

        Worked out on numpy views of the [B] offsets and lengths: at this size numpy's per-call cost is
        a fraction of a torch op's, and a get pays it for every column.
        """
        offsets, lengths = self.offsets.numpy(), self.lengths.numpy()
        if offsets.size == 0:
            return []
        # A run continues while the next row starts where this one ends (rows put together are adjacent;
        # segments are separated by a gap, so a run never crosses two).
        breaks = (np.flatnonzero(offsets[1:] != offsets[:-1] + lengths[:-1]) + 1).tolist()
        ends = np.cumsum(lengths).tolist()  # elements up to and including each row
        runs = []
        for first, end in zip([0, *breaks], [*breaks, offsets.size], strict=True):
            start, size = int(offsets[first]), ends[end - 1] - (ends[first - 1] if first else 0)
            seg = bisect.bisect_right(self.bases, start) - 1
            runs.append(self.segments[seg].narrow(0, start - self.bases[seg], size))
        return runs

    def rows(self) -> RowSource:
        """Where each row is in the segments (for a padded copy, row by row); no copy."""
        if len(self.segments) == 1:
            return RowSource(self.segments, None, self.offsets - self.bases[0], self.lengths)
        bases = torch.tensor(self.bases)
        which = torch.searchsorted(bases, self.offsets, right=True) - 1
        return RowSource(self.segments, which, self.offsets - bases[which], self.lengths)

    def gather(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Copy the rows into one flat tensor [sum(lengths)], one memcpy per run of adjacent rows."""
        if out is None:
            out = torch.empty(self.numel, dtype=self.dtype)
        if out.numel() == 0:
            return out
        dst, at = as_bytes(out), 0  # a memoryview copy is a plain memcpy: ~2x torch's copy_ here
        for run in self._runs():
            nbytes = run.numel() * run.element_size()
            dst[at : at + nbytes] = as_bytes(run)
            at += nbytes
        return out


@dataclass
class Room:
    """Memory a sequence column's next write needs, allocated before any change (`SequenceColumn.room`).

    segment: the new last segment; base: its start address. Compacted (`kept` not None): the segment
    holds the live rows `kept` (int64), at `kept_offsets`, in its first `used` elements, and replaces
    every segment; else it is added, empty.
    """

    segment: torch.Tensor
    base: int
    kept: torch.Tensor | None = None
    kept_offsets: torch.Tensor | None = None
    used: int = 0


class SequenceColumn:
    """A variable-length column: append-only segments + per-row offsets and lengths."""

    def __init__(self, capacity: int, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.offsets = torch.zeros(capacity, dtype=torch.int64)
        self.lengths = torch.zeros(capacity, dtype=torch.int64)
        self.segments: list[torch.Tensor] = [torch.empty(0, dtype=dtype)]
        self.bases: list[int] = [0]
        self.used = 0  # elements written into the last segment
        self.allocated = 0  # elements over all segments

    @property
    def live(self) -> int:
        """Elements that belong to ready rows (allocated - live is garbage or free).

        Summed when asked (metrics, and a segment running full) rather than kept up to date by every
        put, which saves a put three torch ops (see `reserve` on why each counts): a row's length
        is 0 while it is not ready (see `forget`).
        """
        return int(self.lengths.sum())

    @property
    def nbytes_live(self) -> int:
        return self.live * self.segments[0].element_size()

    @property
    def nbytes_allocated(self) -> int:
        return self.allocated * self.segments[0].element_size()

    def write(self, rows: torch.Tensor, source: Source, lengths: torch.Tensor, ready: torch.Tensor) -> None:
        """Append the rows' values back to back and point `rows` at them (`room`, `reserve`, the copy).

        Args:
            rows: int64 [B] row indexes (distinct).
            source: a flat [T] tensor, or anything with `numel` and `copy_into(out)` (T = lengths.sum()).
            lengths: int64 [B].
            ready: bool [capacity] this column's ready bits before the write (for garbage accounting).
        """
        total = source.numel() if isinstance(source, torch.Tensor) else source.numel
        target = self.reserve(rows, lengths, total, self.room(rows, total, ready))
        if isinstance(source, torch.Tensor):
            target.copy_(source)
        else:
            source.copy_into(target)

    def room(self, rows: torch.Tensor, total: int, ready: torch.Tensor) -> Room | None:
        """Allocate what `reserve` needs to place `total` more elements for `rows`, changing nothing.

        None when they fit after the last write; else a new segment (empty, as large as all so far), or
        one holding the live rows compacted. This is where a put's memory is allocated: a put gets the
        room of every column before it changes any (a failed allocation leaves the column as it was).
        """
        if self.used + total <= self.segments[-1].numel():
            return None
        live = self.live - int(self.lengths.index_select(0, rows).sum())  # `rows` are being rewritten
        base = self.bases[-1] + self.segments[-1].numel() + 1  # +1: runs never span segments
        if live >= self.allocated // 2:
            return Room(torch.empty(max(_MIN_BUFFER, total, self.allocated), dtype=self.dtype), base)
        keep = ready.clone()
        keep[rows] = False  # being rewritten
        kept = keep.nonzero().squeeze(1)
        kept = kept[torch.argsort(self.offsets[kept], stable=True)]  # address order keeps runs adjacent
        snap = self.snapshot(kept)
        fresh = torch.empty(max(_MIN_BUFFER, 2 * (live + total)), dtype=self.dtype)
        snap.gather(out=fresh.narrow(0, 0, snap.numel))
        return Room(fresh, base, kept, base + torch.cumsum(snap.lengths, 0) - snap.lengths, snap.numel)

    def reserve(
        self, rows: torch.Tensor, lengths: torch.Tensor, total: int, room: Room | None
    ) -> torch.Tensor:
        """Point `rows` at `total` fresh elements after the last write (in `room`, when `room` made one)
        and return them, for the caller to fill before anyone reads the rows (the dock does so under
        its lock). Allocates nothing but a [B] cumsum: `room` did.

        Bookkeeping and copy are apart so that a put can do the bookkeeping of all its columns before
        it moves any bulk bytes: after a copy of a few MiB, the small tensor ops that follow run from
        cold caches (many times slower; see BENCHMARKS.md's notes), and this way they pay that
        once per put, not once per column.
        """
        if room is not None and room.kept is None:
            self._add_segment(room.segment, room.base)
            self.used = 0
        elif room is not None:  # compacted: readers holding the old segments keep them alive
            assert room.kept_offsets is not None
            self.offsets[room.kept] = room.kept_offsets
            self.segments, self.bases, self.allocated = [room.segment], [room.base], room.segment.numel()
            self.used = room.used
        target = self.segments[-1].narrow(0, self.used, total)
        self.offsets.index_copy_(
            0, rows, torch.cumsum(lengths, 0).sub_(lengths).add_(self.bases[-1] + self.used)
        )
        self.lengths.index_copy_(0, rows, lengths)
        self.used += total
        return target

    def _add_segment(self, segment: torch.Tensor, base: int) -> None:
        self.bases.append(base)
        self.segments.append(segment)
        self.allocated += segment.numel()

    def snapshot(self, rows: torch.Tensor) -> SeqSnapshot:
        offsets, lengths = self.offsets.index_select(0, rows), self.lengths.index_select(0, rows)
        return SeqSnapshot(list(self.segments), list(self.bases), offsets, lengths)

    def forget(self, rows: torch.Tensor) -> None:
        """Rows stop being ready: their elements become garbage (a row's length is 0 while not ready)."""
        self.lengths[rows] = 0

    def drop_all(self, reuse: bool) -> None:
        """Forget every row. With `reuse` (no reader holds a snapshot) the memory is kept, as one
        segment, for the next round of puts: no page faults on already-touched memory."""
        self.lengths.zero_()
        self.used = 0
        if reuse and len(self.segments) == 2 and self.bases[0] == 0 and self.segments[0].numel() == 0:
            self.segments, self.bases = [self.segments[1]], [0]
            return
        if reuse and len(self.segments) == 1:
            self.bases = [0]
            return
        # Several segments: one fresh one as large as all of them (reused from the next clear on).
        # Without reuse, fresh memory: readers may still be copying out of the old segments.
        size = self.allocated if reuse else 0
        self.segments, self.bases, self.allocated = [torch.empty(size, dtype=self.dtype)], [0], size


class ScalarColumn:
    """One value per row in a dense [capacity] tensor."""

    def __init__(self, capacity: int, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.values = torch.zeros(capacity, dtype=dtype)

    @property
    def nbytes_allocated(self) -> int:
        return self.values.numel() * self.values.element_size()

    def write(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        self.values.index_copy_(0, rows, values.to(self.dtype))

    def read(self, rows: torch.Tensor) -> torch.Tensor:
        return self.values.index_select(0, rows)  # a copy: safe to use outside the lock
