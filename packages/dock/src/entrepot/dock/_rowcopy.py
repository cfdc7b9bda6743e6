"""Row copies between padded [B, L] tensors and rows stored back to back, as bytes through memoryviews.

A put copies each row's valid part out of a padded tensor; a padded get copies each row into a fresh
[B, L] tensor and fills its tail. With a torch op per row, the per-op cost (~2-4 us: a TensorIterator,
a view) outweighs the memcpy of a 2,000-token row, and a gather through an index reads an int64 index
per element; a memoryview slice assignment is one plain memcpy for ~0.2 us of Python. Every byte is
written once (filling the whole output first and copying the rows over it halves the Python per
row, but measured 12% slower while other jobs competed for the cache, 3% faster otherwise).

Measured on the development machine, out of cache, each beside one `torch.Tensor.copy_` of the same
valid bytes between rotating buffers: a 256-row int64 column unpads at ~0.6-0.66x and pads at
~0.6-0.74x the speed of that copy (the padded tensor is ~1.8x those bytes). Rows are handled as
bytes, so every torch dtype (bfloat16 included) takes the same path.
CPU tensors only: rows on another device (a dispatched batch on the GPU) are padded with torch ops.

Shape legend: B rows, L padded width, T = sum of the B lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from entrepot.batching import pad


@dataclass(frozen=True)
class RowSource:
    """Where the B rows of a sequence column are, without copying them.

    Row i is `sources[which[i]][starts[i] : starts[i] + lengths[i]]`; `which` None means every row is
    in `sources[0]`. Sources are flat tensors of one dtype (views of store segments, or of a buffer).
    """

    sources: list[torch.Tensor]
    which: torch.Tensor | None  # int64 [B]
    starts: torch.Tensor  # int64 [B]
    lengths: torch.Tensor  # int64 [B]

    @classmethod
    def packed(cls, flat: torch.Tensor, lengths: torch.Tensor) -> RowSource:
        """Rows back to back in `flat` [T]."""
        return cls([flat], None, torch.cumsum(lengths, 0) - lengths, lengths)

    @property
    def dtype(self) -> torch.dtype:
        return self.sources[0].dtype

    def select(self, index: torch.Tensor) -> RowSource:
        """Rows `index` (int64 [b]) of these rows, still where they are."""
        which = None if self.which is None else self.which[index]
        return RowSource(self.sources, which, self.starts[index], self.lengths[index])


def as_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous 1-D CPU tensor as a writable memoryview (no copy)."""
    return tensor.view(torch.uint8).numpy().data


def unpad_into(padded: torch.Tensor, sizes: list[int], out: torch.Tensor) -> None:
    """Copy the first sizes[i] elements of each row of `padded` [B, L] into `out` [T], back to back."""
    if out.numel() == 0:
        return
    if padded.dtype != out.dtype:
        padded = padded.to(out.dtype)  # checked lossless by the caller
    padded = padded.cpu()
    if padded.stride(-1) != 1:
        padded = padded.contiguous()
    num_rows, width = padded.shape
    span = padded.as_strided(((num_rows - 1) * padded.stride(0) + width,), (1,))  # the rows and gaps
    src, dst, size = as_bytes(span), as_bytes(out), out.element_size()
    row_bytes = padded.stride(0) * size
    at = start = 0
    for n in sizes:
        end = at + n * size
        dst[at:end] = src[start : start + n * size]
        at, start = end, start + row_bytes


def gather_into(rows: RowSource, out: torch.Tensor) -> None:
    """Copy the rows into `out` [T], back to back (sources converted to its dtype).

    One memcpy per row, except for a run of one row repeated (`put_prompts` fans each prompt out to
    its n samples): its first copy is written once, and one broadcasting numpy copy writes the rest
    from it (a memcpy's ~1 us of Python counts more than the bytes of a prompt's few hundred tokens).
    """
    if out.numel() == 0:
        return
    dst, size = as_bytes(out), out.element_size()
    srcs = [as_bytes(source.to(out.dtype).cpu().contiguous()) for source in rows.sources]
    repeat = _Repeater(out)
    at = run_at = run_bytes = run = 0
    previous = None
    for row in zip(*_rows(rows), strict=True):
        if row == previous:
            run += 1
            continue
        at = repeat(run_at, run_bytes, run)
        j, start, n = previous = row
        run_at, run_bytes, run = at, n * size, 1
        dst[at : at + run_bytes] = srcs[j][start * size : (start + n) * size]
    repeat(run_at, run_bytes, run)


class _Repeater:
    """Copies of a row already written in `out`, right after it (a numpy broadcast: one call)."""

    def __init__(self, out: torch.Tensor) -> None:
        self.bytes = out.view(-1).view(torch.uint8).numpy()

    def __call__(self, at: int, row_bytes: int, count: int) -> int:
        """Fill `out` after the row of `row_bytes` at byte `at` up to `count` copies; their end."""
        end = at + row_bytes * count
        if count > 1 and row_bytes:
            copies = self.bytes[at + row_bytes : end].reshape(count - 1, row_bytes)
            np.copyto(copies, self.bytes[at : at + row_bytes])
        return end


def pad_rows(rows: RowSource, pad_value: float = 0, pad_multiple: int = 1) -> torch.Tensor:
    """[B, L] right-padded copy of the rows; L = the longest row rounded up to `pad_multiple`."""
    padding = PaddedCopy(rows, pad_value, pad_multiple)
    padding.run()
    return padding.out


class PaddedCopy:
    """A padded copy of rows in two steps: the constructor allocates the [B, L] output and lists the rows,
    `run` copies them in and fills their tails.

    A batch of several columns makes every column's copy before it runs any: the small tensor ops of
    the first step run from cold caches after a copy of a few MiB (see SequenceColumn.reserve), so
    this way they pay that once per batch, not once per column.
    """

    def __init__(
        self, rows: RowSource, pad_value: float = 0, pad_multiple: int = 1, out: torch.Tensor | None = None
    ) -> None:
        self.which, self.starts, self.sizes = _rows(rows)
        width = padded_width(self.sizes, pad_multiple)
        self.rows, self.pad_value, self.pad_multiple = rows, pad_value, pad_multiple
        self.on_cpu = rows.sources[0].device.type == "cpu"
        if out is not None:  # memory the caller chose (a Ray client's shared-memory region)
            assert self.on_cpu and out.shape == (len(self.sizes), width) and out.dtype == rows.dtype
            self.out = out
        else:
            self.out = (
                torch.empty((len(self.sizes), width), dtype=rows.dtype) if self.on_cpu else torch.empty(0)
            )
        if self.on_cpu and self.out.numel():
            self.filler = _filler(rows.dtype, pad_value, width)
            self.dst, self.srcs = as_bytes(self.out.view(-1)), [as_bytes(source) for source in rows.sources]

    def run(self) -> None:
        """Copy the rows in (one memcpy each) and fill each row's tail (one more)."""
        if not self.on_cpu:
            placed = zip(self.which, self.starts, self.sizes, strict=True)
            views = [self.rows.sources[j][s : s + n] for j, s, n in placed]
            self.out = pad(views, self.pad_value, self.pad_multiple)[0]
            return
        if self.out.numel() == 0:
            return
        dst, filler, srcs = self.dst, self.filler, self.srcs
        size = self.out.element_size()
        row_bytes = self.out.shape[1] * size
        at = 0
        for j, start, n in zip(self.which, self.starts, self.sizes, strict=True):
            data_end, row_end = at + n * size, at + row_bytes
            dst[at:data_end] = srcs[j][start * size : (start + n) * size]
            dst[data_end:row_end] = filler[: row_end - data_end]
            at = row_end


def padded_width(sizes: list[int], pad_multiple: int) -> int:
    """The padded layout's width L: the longest row rounded up to `pad_multiple` (0 without rows)."""
    return -(-max(sizes, default=0) // pad_multiple) * pad_multiple


_FILLERS: dict[tuple[torch.dtype, str], memoryview] = {}


def _filler(dtype: torch.dtype, pad_value: float, width: int) -> memoryview:
    """The bytes of at least `width` elements of `pad_value`: made once per (dtype, value) and kept,
    grown when a wider batch needs more (two more torch ops a column saved on every get).

    Keyed by the value's repr: -0.0 and 0.0, or two NaNs, must not share (or miss) an entry."""
    key = (dtype, repr(pad_value))
    filler = _FILLERS.get(key)
    if filler is None or len(filler) < width * dtype.itemsize:
        size = max(width, 4096)
        filler = _FILLERS[key] = as_bytes(torch.full((size,), pad_value, dtype=dtype))
    return filler


def _rows(rows: RowSource) -> tuple[list[int], list[int], list[int]]:
    """(source, start, length) of every row, as lists."""
    which = [0] * rows.lengths.numel() if rows.which is None else rows.which.tolist()
    return which, rows.starts.tolist(), rows.lengths.tolist()
