"""One-buffer wire format: many 1-D tensors of any dtypes as a single uint8 buffer plus a small layout.

Used to move a batch through Ray's object store (one large zero-copy buffer instead of one pickled
tensor per row) or a same-node shared-memory channel (`_channel`), and through torch.distributed
(one broadcast instead of one per column).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from entrepot.dock._batch import Batch, Layout
from entrepot.dock._columns import SeqSnapshot
from entrepot.dock._errors import DockMemoryError
from entrepot.dock._leases import Lease
from entrepot.dock._rowcopy import PaddedCopy, padded_width
from entrepot.dock._taken import Taken

if TYPE_CHECKING:
    from entrepot.dock._inputs import ColumnData

_ALIGN = 64  # every tensor starts on a 64-byte boundary, so typed views are aligned

Raw = dict[str, tuple[torch.Tensor, torch.Tensor | None]]


@dataclass(frozen=True)
class WireLayout:
    """Where each tensor lives in the buffer: (key, dtype name, byte offset, numel) per entry."""

    entries: tuple[tuple[str, str, int, int], ...]
    nbytes: int


@dataclass(frozen=True)
class GetReply:
    """A dock actor's answer to a get: where the rows are and what holds them.

    `layout` places them in `array` (a uint8 buffer Ray carried), or with `array` None in the
    client's shared memory: its reply region, laid out as the batch itself (`in_region`, see
    `batch_of`), else its channel in the wire format. `region_bytes`: what the batch needs in a
    region (0: none was offered). `nbytes` and `receipt` let the client give the rows back.
    """

    layout: WireLayout
    array: Any
    lease: Lease | None
    nbytes: int
    receipt: str
    in_region: bool = False
    region_bytes: int = 0


def plan(specs: Iterable[tuple[str, torch.dtype, int]]) -> WireLayout:
    """Byte offsets for tensors given as (key, dtype, numel)."""
    entries = []
    offset = 0
    for key, dtype, numel in specs:
        entries.append((key, str(dtype).removeprefix("torch."), offset, numel))
        size = numel * torch.empty(0, dtype=dtype).element_size()
        offset += -(-size // _ALIGN) * _ALIGN
    return WireLayout(tuple(entries), offset)


def views(layout: WireLayout, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    """key -> typed 1-D view into `buffer` (uint8 [layout.nbytes])."""
    out = {}
    for key, dtype_name, offset, numel in layout.entries:
        dtype = getattr(torch, dtype_name)
        size = numel * torch.empty(0, dtype=dtype).element_size()
        out[key] = buffer.narrow(0, offset, size).view(dtype)
    return out


def as_uint8(array: Any) -> torch.Tensor:
    """A (possibly read-only, e.g. from Ray's object store) numpy uint8 array as a tensor, no copy.

    The tensor must only be read: every consumer here copies out of it.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable array": we only read from it
        return torch.from_numpy(array)


def encode(tensors: Mapping[str, torch.Tensor]) -> tuple[WireLayout, torch.Tensor]:
    """Copy 1-D tensors into one buffer."""
    layout = plan((key, t.dtype, t.numel()) for key, t in tensors.items())
    buffer = torch.empty(layout.nbytes, dtype=torch.uint8)
    for key, view in views(layout, buffer).items():
        view.copy_(tensors[key].reshape(-1))
    return layout, buffer


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation that failed (torch raises RuntimeError for CPU memory)."""
    text = str(error)
    return isinstance(error, MemoryError) or "alloc" in text or "out of memory" in text


def column_buffer(columns: Mapping[str, ColumnData], layout: WireLayout) -> torch.Tensor:
    """An empty uint8 buffer for a put's columns; `DockMemoryError` naming the largest if none can be had."""
    try:
        return torch.empty(layout.nbytes, dtype=torch.uint8)
    except (MemoryError, RuntimeError) as error:
        if not is_out_of_memory(error):
            raise
        sizes = {name: column.numel * entry_size(layout, name) for name, column in columns.items()}
        largest = max(sizes, key=sizes.__getitem__)
        raise DockMemoryError(largest, sizes[largest]) from error


def entry_size(layout: WireLayout, column: str) -> int:
    """Bytes per element of `column`'s values in `layout`."""
    for key, dtype_name, _, _ in layout.entries:
        if key in (f"s:{column}", f"d:{column}"):
            return int(getattr(torch, dtype_name).itemsize)
    raise KeyError(column)


def encode_columns(
    columns: Mapping[str, ColumnData], dtypes: Mapping[str, torch.dtype] | None = None
) -> tuple[WireLayout, torch.Tensor]:
    """A put's columns into one buffer, each in `dtypes[name]` (default: its own); the rows' only copy."""
    layout = columns_layout(columns, dtypes)
    buffer = column_buffer(columns, layout)
    write_columns(columns, layout, buffer)
    return layout, buffer


def columns_layout(
    columns: Mapping[str, ColumnData], dtypes: Mapping[str, torch.dtype] | None = None
) -> WireLayout:
    """The wire layout of a put's columns, before any byte is copied (to pick their buffer)."""
    specs: list[tuple[str, torch.dtype, int]] = []
    for name, column in columns.items():
        dtype = column.dtype if dtypes is None else dtypes[name]
        if column.lengths is None:
            specs.append((f"s:{name}", dtype, column.numel))
        else:
            specs += [(f"d:{name}", dtype, column.numel), (f"l:{name}", torch.int64, column.lengths.numel())]
    return plan(specs)


def write_columns(columns: Mapping[str, ColumnData], layout: WireLayout, buffer: torch.Tensor) -> None:
    """Copy a put's columns into `buffer` (uint8 [layout.nbytes]), as `columns_layout` laid them out."""
    out = views(layout, buffer)
    for name, column in columns.items():
        column.copy_into(out[f"s:{name}" if column.lengths is None else f"d:{name}"])
        if column.lengths is not None:
            out[f"l:{name}"].copy_(column.lengths)


def encode_taken(taken: Taken) -> tuple[WireLayout, torch.Tensor]:
    """The rows of a get straight into one buffer (the gather is the only copy)."""
    layout = taken_layout(taken)
    buffer = torch.empty(layout.nbytes, dtype=torch.uint8)
    write_taken(taken, layout, buffer)
    return layout, buffer


def taken_layout(taken: Taken) -> WireLayout:
    """The wire layout of a get's rows, before any byte is copied (to pick the buffer they go into)."""
    specs: list[tuple[str, torch.dtype, int]] = [("rows", torch.int64, taken.rows.numel())]
    specs.append(("ages", torch.int32, taken.ages.numel()))
    for name, part in taken.parts.items():
        if isinstance(part, SeqSnapshot):
            specs.append((f"d:{name}", part.dtype, part.numel))
            specs.append((f"l:{name}", torch.int64, part.lengths.numel()))
        else:
            specs.append((f"s:{name}", part.dtype, part.numel()))
    return plan(specs)


def write_taken(taken: Taken, layout: WireLayout, buffer: torch.Tensor) -> None:
    """Gather a get's rows into `buffer` (uint8 [layout.nbytes]), as `taken_layout` laid them out."""
    out = views(layout, buffer)
    out["rows"].copy_(taken.rows)
    out["ages"].copy_(taken.ages)
    for name, part in taken.parts.items():
        if isinstance(part, SeqSnapshot):
            part.gather(out=out[f"d:{name}"])
            out[f"l:{name}"].copy_(part.lengths)
        else:
            out[f"s:{name}"].copy_(part)


def encode_raw(
    rows: torch.Tensor, raw: Mapping[str, tuple[torch.Tensor, torch.Tensor | None]], ages: torch.Tensor
) -> tuple[WireLayout, torch.Tensor]:
    """Rows + columns (flat, lengths | None) into one buffer."""
    tensors = {"rows": rows, "ages": ages}
    for name, (flat, lengths) in raw.items():
        if lengths is None:
            tensors[f"s:{name}"] = flat
        else:
            tensors[f"d:{name}"] = flat
            tensors[f"l:{name}"] = lengths
    return encode(tensors)


def decode(layout: WireLayout, buffer: torch.Tensor) -> tuple[torch.Tensor, Raw, torch.Tensor]:
    """(rows, column -> (flat, lengths | None), ages) as views of `buffer`, columns in wire order."""
    parts = views(layout, buffer)
    raw: Raw = {}
    for key, tensor in parts.items():
        kind, _, name = key.partition(":")
        if kind == "d":
            raw[name] = (tensor, parts[f"l:{name}"])
        elif kind == "s":
            raw[name] = (tensor, None)
    empty = torch.empty(0, dtype=torch.int64)
    return parts.get("rows", empty), raw, parts.get("ages", empty.int())


def batch_layout(taken: Taken, layout: str, pad_multiple: int) -> WireLayout:
    """The wire layout of a get's batch as the caller reads it: rows, ages, and per column its
    values [B] (scalars), flat [T] (packed) or padded [B, L] ("p:", B * L elements), plus lengths."""
    specs: list[tuple[str, torch.dtype, int]] = [("rows", torch.int64, taken.rows.numel())]
    specs.append(("ages", torch.int32, taken.ages.numel()))
    num_rows = taken.rows.numel()
    for name, part in taken.parts.items():
        if not isinstance(part, SeqSnapshot):
            specs.append((f"s:{name}", part.dtype, part.numel()))
            continue
        if layout == "packed":
            specs.append((f"d:{name}", part.dtype, part.numel))
        else:
            width = padded_width(part.lengths.tolist(), pad_multiple)
            specs.append((f"p:{name}", part.dtype, num_rows * width))
        specs.append((f"l:{name}", torch.int64, num_rows))
    return plan(specs)


def write_batch(
    taken: Taken, wire: WireLayout, buffer: torch.Tensor, pad_value: float, pad_multiple: int
) -> None:
    """Lay a get's batch out in `buffer` (uint8 [wire.nbytes]) as `batch_layout` planned it: the
    rows' only copy (a padded column's rows straight into its [B, L] place, tails filled)."""
    out = views(wire, buffer)
    out["rows"].copy_(taken.rows)
    out["ages"].copy_(taken.ages)
    num_rows = taken.rows.numel()
    copies = []
    for name, part in taken.parts.items():
        if not isinstance(part, SeqSnapshot):
            out[f"s:{name}"].copy_(part)
            continue
        out[f"l:{name}"].copy_(part.lengths)
        if f"d:{name}" in out:
            part.gather(out=out[f"d:{name}"])
        elif num_rows and out[f"p:{name}"].numel():
            padded = out[f"p:{name}"].view(num_rows, -1)
            copies.append(PaddedCopy(part.rows(), pad_value, pad_multiple, out=padded))
    for copy in copies:  # every copy made before any runs (see PaddedCopy)
        copy.run()


def batch_of(wire: WireLayout, buffer: torch.Tensor, layout: Layout) -> Batch:
    """The batch `write_batch` laid out in `buffer`, its tensors views of it (no copy)."""
    parts = views(wire, buffer)
    rows = parts["rows"]
    columns: dict[str, torch.Tensor] = {}
    lengths: dict[str, torch.Tensor] = {}
    for key, tensor in parts.items():
        kind, _, name = key.partition(":")
        if kind == "s" or kind == "d":
            columns[name] = tensor
        elif kind == "p":
            num_rows = rows.numel()
            columns[name] = tensor.view(num_rows, tensor.numel() // num_rows if num_rows else 0)
        elif kind == "l":
            lengths[name] = tensor
    return Batch(rows, columns, lengths, layout, parts["ages"])
