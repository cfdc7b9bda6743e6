"""The put path: check every column of a put, then store all of them, or raise having stored none.

Under the lock a put checks and converts every column first, then allocates what every column
needs (a new store, a new segment: `_room`), and only then changes anything: the bookkeeping of
every column, and the row copies last, when nothing is left that can fail. So a put whose last
column cannot get memory raises `DockMemoryError` with the dock byte-identical. Copies last also
because the small ops that follow a MiB-sized copy run from cold caches, so a put that interleaved
them paid that once per column (see SequenceColumn.reserve).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import torch

from entrepot.dock._acks import ack_rows
from entrepot.dock._checks import check_rows, put_request
from entrepot.dock._columns import ColumnSpec, Room, ScalarColumn, SequenceColumn, is_lossless
from entrepot.dock._errors import (
    ColumnLayoutError,
    DockConfigError,
    DockMemoryError,
    LossyDtypeError,
    RowCountMismatchError,
    UnknownColumnError,
)
from entrepot.dock._inputs import ColumnData, normalize_put
from entrepot.dock._leases import Lease
from entrepot.dock._table import DockTable, Store
from entrepot.dock._wire import is_out_of_memory

T = TypeVar("T")


class CheckedPut(NamedTuple):
    """A put's arguments checked as one dock checks them (`check_put`), its columns normalised."""

    columns: dict[str, ColumnData]
    rows: torch.Tensor
    completed: torch.Tensor | None
    ack: Lease | None


ScalarHints = Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, "bool | None"]]
"""(data, lengths) -> column -> whether it stores scalars (None: not known yet); see _inputs."""


def check_put(
    data: Any, indexes: Any, lengths: Any, completed: Any, ack: Any, *, capacity: int,
    columns: Collection[str], rollout_consumer: str | None, scalar_hints: ScalarHints,
) -> CheckedPut:  # fmt: skip
    """Every check of a put that needs no lock, in one dock's order; every client runs it first.

    The dock, holding its lock, then checks the lease and each column's kind and dtype (`put`).
    """
    request = put_request(data, indexes, lengths, completed, ack)
    rows = check_rows(request.rows, capacity)
    for name in request.data:
        if name not in columns:
            raise UnknownColumnError(name, list(columns))
    done = completed_flags(request.completed, rows.numel(), rollout_consumer)
    hints = scalar_hints(request.data, request.lengths or {})
    normalized = normalize_put(request.data, request.lengths, rows.numel(), hints)
    return CheckedPut(normalized, rows, done, request.ack)


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
    checked = check_put(
        data, indexes, lengths, completed, ack, capacity=t.capacity, columns=t.column_index,
        rollout_consumer=t.rollout_consumer,
        scalar_hints=lambda data, _: {name: t.scalar_kind(name) for name in data},
    )  # fmt: skip
    rows, columns, done, ack = checked.rows, checked.columns, checked.completed, checked.ack
    if rows.numel() == 0:
        return  # no rows: nothing stored, no dtype fixed (the data was checked all the same)
    with t.cond:
        if ack is not None:
            t.leases.expire(time.monotonic())
            t.leases.held_rows(ack, rows)
        for name, column in columns.items():
            _check_column(t, name, column)
        # Everything that allocates comes before any change (conversions, new stores, new segments);
        # then the bookkeeping of every column; the bulk copies last (see SequenceColumn.reserve).
        columns = {name: _converted(t, name, column) for name, column in columns.items()}
        rooms = {name: _room(t, name, rows, column) for name, column in columns.items()}
        copies = [_write(t, name, rows, column, *rooms[name]) for name, column in columns.items()]
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
    """`put(completed=...)` (bool [B] from `put_request`, or None) checked against the dock's settings.

    Raises:
        DockConfigError: the dock has no `rollout_consumer` (partial rollout is off).
        RowCountMismatchError: not one flag per row.
    """
    if completed is None:
        return None
    if rollout_consumer is None:
        raise DockConfigError("put(completed=...) needs a dock built with rollout_consumer (partial rollout)")
    if completed.numel() != num_rows:
        raise RowCountMismatchError("completed", num_rows, completed.numel())
    return completed


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


def _allocating(name: str, column: ColumnData, allocate: Callable[[], T]) -> T:
    """`allocate()`, with a failure to get memory raised as `DockMemoryError` naming column `name`."""
    try:
        return allocate()
    except (MemoryError, RuntimeError) as error:
        if not is_out_of_memory(error):
            raise  # not about memory: a bug to report as it is
        raise DockMemoryError(name, column.numel * column.dtype.itemsize) from error


def _converted(t: DockTable, name: str, column: ColumnData) -> ColumnData:
    """`column` in the dtype column `name` stores (a copy when it is not: allocated here)."""
    return _allocating(name, column, lambda: column.to(_stored_dtype(t, name, column)))


def _room(t: DockTable, name: str, rows: torch.Tensor, column: ColumnData) -> tuple[Store, Room | None]:
    """The store of column `name` (made now if it has none yet, not installed) and the room its rows
    need in it: every allocation of the put's column, with nothing changed."""

    def allocate() -> tuple[Store, Room | None]:
        store = t.stores[name]
        if store is None:
            spec = ColumnSpec(column.dtype, column.scalar)  # `column` is in the stored dtype already
            store = t.make_store(spec)
            assert store is not None  # a spec with dtype and kind
        if isinstance(store, SequenceColumn):
            return store, store.room(rows, column.numel, t.ready[t.column_index[name]])
        return store, None

    return _allocating(name, column, allocate)


def _write(
    t: DockTable, name: str, rows: torch.Tensor, column: ColumnData, store: Store, room: Room | None
) -> tuple[torch.Tensor, ColumnData] | None:
    """Install `store`, store a scalar column, or point a sequence column's rows at their `room` and
    return (room, rows): the copy still to do."""
    t.stores[name] = store
    c = t.column_index[name]
    copy = None
    if isinstance(store, ScalarColumn):
        store.write(rows, column.flat)
    else:
        assert column.lengths is not None  # checked above
        copy = (store.reserve(rows, column.lengths, column.numel, room), column)
    t.ready[c].index_fill_(0, rows, True)
    return copy
