"""Column-dict variants of pad / unpad / pack / unpack: experience moves as several columns at once.

A "column dict" maps a column name (``"prompts"``, ``"responses"``, ``"old_log_prob"``...) to that
column's B rows. Every column must have the same B; each keeps its own per-row lengths.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from torch import Tensor

from entrepot.batching._errors import BatchingError, LengthMismatchError
from entrepot.batching._padding import PadValue, pack, pad, unpack, unpad

__all__ = ["pack_columns", "pad_columns", "unpack_columns", "unpad_columns"]


@contextmanager
def _column(name: str) -> Iterator[None]:
    """Re-raise a batching error with the offending column's name in front of its message."""
    try:
        yield
    except BatchingError as error:
        raise type(error)(f"column {name!r}: {error}") from error


def _check_row_counts(counts: Mapping[str, int]) -> None:
    if len(set(counts.values())) > 1:
        raise LengthMismatchError(f"columns have different row counts {dict(counts)}; all must be equal")


def _lengths_for(lengths: Mapping[str, Tensor | Sequence[int]], name: str) -> Tensor | Sequence[int]:
    if name not in lengths:
        raise LengthMismatchError(f"no lengths for column {name!r}; lengths has {sorted(lengths)}")
    return lengths[name]


def pack_columns(columns: Mapping[str, Sequence[Tensor]]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """:func:`pack` every column.

    Returns:
        ``(flat, lengths)``: column -> [T_c, *F_c] and column -> int64 [B].
    """
    _check_row_counts({name: len(rows) for name, rows in columns.items()})
    flat: dict[str, Tensor] = {}
    lengths: dict[str, Tensor] = {}
    for name, rows in columns.items():
        with _column(name):
            flat[name], lengths[name] = pack(rows)
    return flat, lengths


def unpack_columns(
    flat: Mapping[str, Tensor], lengths: Mapping[str, Tensor | Sequence[int]]
) -> dict[str, list[Tensor]]:
    """:func:`unpack` every column (views of the flat tensors)."""
    out: dict[str, list[Tensor]] = {}
    for name, values in flat.items():
        with _column(name):
            out[name] = unpack(values, _lengths_for(lengths, name))
    _check_row_counts({name: len(rows) for name, rows in out.items()})
    return out


def pad_columns(
    columns: Mapping[str, Sequence[Tensor] | tuple[Tensor, Tensor]],
    pad_value: PadValue | Mapping[str, PadValue] = 0,
    multiple: int = 1,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """:func:`pad` every column (each column to its own width, rounded up to ``multiple``).

    Args:
        columns: column -> list of B sequences, or column -> packed ``(flat, lengths)`` pair.
        pad_value: one fill value for all columns, or column -> fill value (missing columns use 0).
        multiple: width alignment, e.g. ``tp * cp``.

    Returns:
        ``(padded, lengths)``: column -> [B, L_c, *F_c] and column -> int64 [B].
    """
    padded: dict[str, Tensor] = {}
    lengths: dict[str, Tensor] = {}
    for name, rows in columns.items():
        value = pad_value.get(name, 0) if isinstance(pad_value, Mapping) else pad_value
        with _column(name):
            padded[name], lengths[name] = pad(rows, value, multiple)
    _check_row_counts({name: len(rows) for name, rows in lengths.items()})
    return padded, lengths


def unpad_columns(
    padded: Mapping[str, Tensor], lengths: Mapping[str, Tensor | Sequence[int]] | Tensor | Sequence[int]
) -> dict[str, list[Tensor]]:
    """:func:`unpad` every column (views).

    Args:
        padded: column -> [B, L_c, *F_c].
        lengths: column -> B lengths, or one set of B lengths shared by every column.
    """
    out: dict[str, list[Tensor]] = {}
    for name, values in padded.items():
        column_lengths = _lengths_for(lengths, name) if isinstance(lengths, Mapping) else lengths
        with _column(name):
            out[name] = unpad(values, column_lengths)
    _check_row_counts({name: len(rows) for name, rows in out.items()})
    return out
