"""The put path: check every column of a put, then store all of them, or raise having stored none.

Under the lock a put converts every column first (conversions allocate, so they come before any
change), then does the bookkeeping of every column, and copies the rows last, when nothing is left
that can fail. Copies last also because the small ops that follow a MiB-sized copy run from cold
caches, so a put that interleaved them paid that once per column (see SequenceColumn.reserve).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from entrepot.dock._acks import ack_rows
from entrepot.dock._columns import ColumnSpec, ScalarColumn, SequenceColumn, is_lossless
from entrepot.dock._errors import (
    ColumnLayoutError,
    DockConfigError,
    InvalidArgumentError,
    LossyDtypeError,
    RowCountMismatchError,
    UnknownColumnError,
)
from entrepot.dock._inputs import ColumnData, as_index_tensor, normalize_put
from entrepot.dock._leases import Lease
from entrepot.dock._table import DockTable


def put(
    t: DockTable,
    data: Mapping[str, Any],
    indexes: Sequence[int] | torch.Tensor,
    *,
    lengths: Mapping[str, Any] | None = None,
    completed: Sequence[bool] | torch.Tensor | None = None,
    ack: Lease | None = None,
) -> None:
    """`ExperienceDock.put` on table `t` (arguments and errors are documented there)."""
    rows = as_index_tensor(indexes, t.capacity)
    data = dict(data.items())  # a TensorDict iterates over rows, not keys
    if not data:
        raise InvalidArgumentError("put needs at least one column")
    for name in data:
        if name not in t.column_index:
            raise UnknownColumnError(name, t.columns)
    done = completed_flags(completed, rows.numel(), t.rollout_consumer)
    if rows.numel() == 0:
        return
    hints = {name: t.scalar_kind(name) for name in data}
    columns = normalize_put(data, lengths, rows.numel(), hints)
    with t.cond:
        if ack is not None:
            t.leases.expire(time.monotonic())
            t.leases.held_rows(ack, rows)
        for name, column in columns.items():
            _check_column(t, name, column)
        # Conversions allocate, so they come before any change; then the bookkeeping of every
        # column; the bulk copies last (see SequenceColumn.reserve): nothing left that can fail.
        columns = {name: column.to(_stored_dtype(t, name, column)) for name, column in columns.items()}
        copies = [_write(t, name, rows, column) for name, column in columns.items()]
        if ack is not None:
            ack_rows(t, ack, rows)
        t.num_live += rows.numel() - int(t.live.index_select(0, rows).sum())
        t.live.index_fill_(0, rows, True)
        if done is not None:
            _mark_completed(t, rows, done)
        t.counts["puts"] += 1
        t.counts["rows_put"] += rows.numel()
        for copy in copies:
            if copy is not None:  # a sequence column's rows (scalars are stored already)
                target, column = copy
                column.copy_into(target)
        t.cond.notify_all()


def completed_flags(completed: Any, num_rows: int, rollout_consumer: str | None) -> torch.Tensor | None:
    """`put(completed=...)` as bool [num_rows] (None if not given), checked against the dock's settings.

    Raises:
        DockConfigError: the dock has no `rollout_consumer` (partial rollout is off).
        RowCountMismatchError: not one flag per row.
    """
    if completed is None:
        return None
    if rollout_consumer is None:
        raise DockConfigError("put(completed=...) needs a dock built with rollout_consumer (partial rollout)")
    done = torch.as_tensor(completed, dtype=torch.bool).reshape(-1)
    if done.numel() != num_rows:
        raise RowCountMismatchError("completed", num_rows, done.numel())
    return done


def _mark_completed(t: DockTable, rows: torch.Tensor, done: torch.Tensor) -> None:
    if t.max_age is not None:
        done = done | (t.age[rows] >= t.max_age - 1)  # too old to wait another round
    t.completed[rows] = done
    fresh = rows[t.born[rows] < 0]
    t.born[fresh] = t.policy_version  # the version this row's response began under
    t.num_unfinished = int((t.live & ~t.completed).sum())


def _check_column(t: DockTable, name: str, column: ColumnData) -> None:
    """Raise if `column` cannot be stored in `name` (called under the lock, before any write)."""
    store = t.stores[name]
    spec = t.specs[name]
    scalar = isinstance(store, ScalarColumn) if store is not None else spec.scalar
    if scalar is not None and scalar != column.scalar:
        want, got = ("one scalar per row", "sequences") if scalar else ("sequences", "one scalar per row")
        raise ColumnLayoutError(name, f"the column stores {want}, got {got}")
    dtype = store.dtype if store is not None else spec.dtype
    if dtype is not None and not is_lossless(column.dtype, dtype):
        raise LossyDtypeError(name, str(column.dtype), str(dtype))


def _stored_dtype(t: DockTable, name: str, column: ColumnData) -> torch.dtype:
    """The dtype column `name` stores (`column`'s own where the store is not made yet)."""
    store = t.stores[name]
    return store.dtype if store is not None else t.specs[name].dtype or column.dtype


def _write(
    t: DockTable, name: str, rows: torch.Tensor, column: ColumnData
) -> tuple[torch.Tensor, ColumnData] | None:
    """Store a scalar column, or make room for a sequence column's rows and return (room, rows): the
    copy still to do."""
    store = t.stores[name]
    if store is None:
        spec = ColumnSpec(column.dtype, column.scalar)  # `column` is in the stored dtype already
        store = t.stores[name] = t.make_store(spec)
    c = t.column_index[name]
    copy = None
    if isinstance(store, ScalarColumn):
        store.write(rows, column.flat)
    else:
        assert column.lengths is not None and isinstance(store, SequenceColumn)  # checked above
        copy = (store.reserve(rows, column.lengths, column.numel, t.ready[c]), column)
    t.ready[c].index_fill_(0, rows, True)
    return copy
