"""The checks of every call's arguments, in one place that every client runs (in-process, Ray, sharded).

Each client runs these checks, in the same order, before it sends or takes anything: a bad argument
raises the same typed error (naming the argument) on every client and changes nothing. Those here
need no dock state; the ones that do (a consumer or column the dock has, an index below its
capacity, a lease it issued) run in the dock right after them. A dock actor runs these again on what
it receives: anyone who can reach the Ray cluster can call it.

Counts are ints (numpy and 0-d tensor ints too), never bools; seconds are real numbers, never bools
or NaN, and infinity means no limit; names are strings; indexes are a 1-D sequence or tensor of
integers (one int: one row), and an empty one is a call on no rows (a put stores nothing, a get
returns an empty batch).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from entrepot.dock._batch import LAYOUTS, Layout
from entrepot.dock._errors import (
    ArgumentTypeError,
    DockError,
    DuplicateIndexError,
    IndexOutOfRangeError,
    InvalidArgumentError,
)
from entrepot.dock._leases import Lease
from entrepot.dock._options import FIFO, ZERO_PADDING, Padding, Sampler

# Indexes checked on a Python list up to this many. The list's cost grows with the rows (on warm
# caches it matches the torch ops' at a few hundred and is ~4x theirs at 1,024), while what it saves
# is a fixed cost, larger from cold caches (see SequenceColumn.reserve).
_LIST_CHECK_ROWS = 512


def as_count(argument: str, value: Any, minimum: int = 1) -> int:
    """`value` as an int >= `minimum`; an int-like that is not a bool (True is not a count of 1)."""
    if _is_bool(value):
        raise ArgumentTypeError(f"{argument} must be an int, got the bool {value!r}", argument)
    try:
        count = operator.index(value)
    except TypeError:
        raise ArgumentTypeError(
            f"{argument} must be an int, got {type(value).__name__} {value!r}", argument
        ) from None
    if count < minimum:
        raise InvalidArgumentError(f"{argument} must be >= {minimum}, got {count}", argument)
    return count


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool | np.bool_) or (
        isinstance(value, torch.Tensor) and value.dtype == torch.bool
    )


def as_seconds(argument: str, value: Any, *, positive: bool) -> float | None:
    """`value` as seconds (None or infinity: no limit, returned as None); `positive`: > 0, else >= 0."""
    if value is None:
        return None
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(
            f"{argument} must be a number of seconds, got {type(value).__name__} {value!r}", argument
        )
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0 or (positive and seconds == 0):
        allowed = "> 0" if positive else ">= 0"
        raise InvalidArgumentError(
            f"{argument} must be a number of seconds {allowed} (math.inf: no limit), got {value!r}", argument
        )
    return None if math.isinf(seconds) else seconds


def check_name(argument: str, value: Any) -> str:
    """`value` if it is a str, else ArgumentTypeError naming `argument`."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{argument} must be a str, got {type(value).__name__} {value!r}", argument)
    return value


def column_names(columns: Any, argument: str = "columns") -> list[str]:
    """`columns` as a list of names: a non-empty sequence (not a str) of distinct strings."""
    if isinstance(columns, str) or not isinstance(columns, Sequence):
        raise InvalidArgumentError(
            f"{argument} must be a non-empty list of distinct names, got {columns!r}", argument
        )
    names = list(columns)
    for name in names:
        if not isinstance(name, str):
            raise ArgumentTypeError(
                f"{argument} must be names (str), got {type(name).__name__} {name!r} among them", argument
            )
    if not names or len(set(names)) != len(names):
        raise InvalidArgumentError(
            f"{argument} must be a non-empty list of distinct names, got {columns!r}", argument
        )
    return names


def check_tensor(argument: str, tensor: torch.Tensor) -> None:
    """ArgumentTypeError unless `tensor` holds its elements in memory: not meta, sparse or nested."""
    if tensor.is_meta or tensor.layout != torch.strided or tensor.is_nested:
        kind = "meta" if tensor.is_meta else "nested" if tensor.is_nested else str(tensor.layout)
        raise ArgumentTypeError(
            f"{argument} must be a dense tensor holding its data, got a {kind} tensor", argument
        )


def index_tensor(indexes: Any, argument: str = "indexes") -> torch.Tensor:
    """`indexes` as int64 [B] on the CPU: a 1-D sequence or tensor of integers, or one integer.

    Values are not checked against a capacity here (see `check_rows`), except those past 64 bits.
    """
    if isinstance(indexes, torch.Tensor):
        if (
            indexes.dtype == torch.int64 and indexes.ndim == 1 and indexes.layout == torch.strided
            and indexes.device.type == "cpu"
        ):  # fmt: skip
            return indexes  # the usual case (a batch's indexes), in a fraction of the checks below
        check_tensor(argument, indexes)
        rows = indexes.detach()
    elif isinstance(indexes, str | bytes | bool) or indexes is None or isinstance(indexes, Lease):
        raise ArgumentTypeError(
            f"{argument} must be integers, got {type(indexes).__name__} {indexes!r}", argument
        )
    else:
        if isinstance(indexes, list | tuple) and any(v is True or v is False for v in indexes):
            raise ArgumentTypeError(f"{argument} must be integers, got a bool among them", argument)
        try:
            rows = torch.as_tensor(indexes)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise _not_indexes(argument, indexes) from None
    if rows.ndim == 0:
        rows = rows.reshape(1)
    if rows.ndim != 1:
        raise InvalidArgumentError(
            f"{argument} must be 1-D (one index per row), got shape {tuple(rows.shape)}", argument
        )
    if rows.numel() and (rows.dtype.is_floating_point or rows.dtype.is_complex or rows.dtype == torch.bool):
        raise ArgumentTypeError(f"{argument} must be integers, got {rows.dtype}", argument)
    if rows.dtype != torch.int64 or rows.device.type != "cpu":
        rows = rows.to("cpu", torch.int64)
    return rows


def _not_indexes(argument: str, indexes: Any) -> DockError:
    """The error for a sequence torch cannot read as int64 indexes: an int past 64 bits, else a type."""
    try:
        items = list(indexes)
    except TypeError:
        items = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and not -(2**63) <= item < 2**63:
            return IndexOutOfRangeError(item, None)
    return ArgumentTypeError(
        f"{argument} must be a 1-D sequence of integers, got {type(indexes).__name__} {indexes!r:.80}",
        argument,
    )


def check_rows(rows: torch.Tensor, capacity: int) -> torch.Tensor:
    """`rows` (from `index_tensor`) after checking each is in [0, capacity) and none repeats.

    Up to `_LIST_CHECK_ROWS` indexes in ascending order (the usual case: a put of the rows a get
    returned) are checked on a Python list, without a torch op: a put's first ops run from cold
    caches, where each one costs many times its warm cost (see SequenceColumn.reserve).
    """
    if rows.numel() == 0:
        return rows
    if rows.numel() <= _LIST_CHECK_ROWS:
        values = rows.tolist()
        if values[0] >= 0 and values[-1] < capacity and all(map(operator.lt, values, values[1:])):
            return rows  # strictly ascending, so distinct, and both ends in range
    low, high = (int(bound) for bound in torch.aminmax(rows))
    if low < 0 or high >= capacity:
        bad = ((rows < 0) | (rows >= capacity)).nonzero()
        raise IndexOutOfRangeError(int(rows[bad[0, 0]]), capacity)
    if bool((rows[1:] > rows[:-1]).all()):
        return rows  # strictly ascending, so distinct (the usual case): no sort
    sorted_rows, _ = torch.sort(rows)
    dup = (sorted_rows[1:] == sorted_rows[:-1]).nonzero()
    if dup.numel():
        raise DuplicateIndexError(int(sorted_rows[dup[0, 0]]))
    return rows


def as_index_tensor(indexes: Any, capacity: int) -> torch.Tensor:
    """`index_tensor` then `check_rows`: valid, distinct row indexes as int64 [B]."""
    return check_rows(index_tensor(indexes), capacity)


def check_lease(argument: str, lease: Any) -> Lease:
    """`lease` if it is a `Lease` (whether this dock issued it is the dock's check)."""
    if not isinstance(lease, Lease):
        raise ArgumentTypeError(
            f"{argument} must be a Lease (a leased batch's .lease), got {type(lease).__name__} {lease!r:.80}",
            argument,
        )
    return lease


def check_layout(layout: Any) -> Layout:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise InvalidArgumentError(f"layout must be one of {LAYOUTS}, got {layout!r}", "layout")
    return layout  # type: ignore[return-value]


def check_sampler(sampler: Any) -> Sampler:
    """`sampler` if it is a valid Sampler (checked again: one unpickled from a caller skipped its checks)."""
    if sampler is FIFO:  # the default: checked when this module was imported
        return sampler
    if not isinstance(sampler, Sampler):
        raise ArgumentTypeError(
            f"sampler must be a Sampler, e.g. Sampler(kind='random'), got {sampler!r}", "sampler"
        )
    sampler.__post_init__()
    return sampler


def check_padding(padding: Any) -> Padding:
    """`padding` if it is a valid Padding (checked again, as a Sampler is)."""
    if not isinstance(padding, Padding):
        raise ArgumentTypeError(
            f"padding must be a Padding, e.g. Padding(value=-1), got {padding!r}", "padding"
        )
    padding.__post_init__()
    return padding


def check_pad_value(padding: Padding, column: str, dtype: torch.dtype) -> None:
    """InvalidArgumentError unless the padded layout can fill sequence column `column` (of `dtype`)
    with `padding.value` exactly: an integer in range for integer columns, 0 or 1 for bool ones, a
    finite value within range (or inf, -inf, NaN) for floating ones."""
    value = padding.value
    if dtype.is_complex:
        return
    if dtype.is_floating_point:
        fits = not math.isfinite(value) or abs(value) <= torch.finfo(dtype).max
    elif dtype == torch.bool:
        fits = value in (0, 1)
    else:
        info = torch.iinfo(dtype)
        fits = math.isfinite(value) and value == int(value) and info.min <= value <= info.max
    if not fits:
        raise InvalidArgumentError(
            f"padding value {value!r} cannot fill column {column!r} of {dtype} exactly", "padding"
        )


@dataclass(slots=True)
class GetRequest:
    """A get's arguments after `get_request` checked them (what a client sends to a dock actor).

    Not frozen, as a get builds one per call and a frozen dataclass of 12 fields costs ~2 us more:
    treat it as read-only.
    """

    consumer: str
    columns: list[str]
    count: int
    indexes: torch.Tensor | None
    min_count: int | None
    timeout: float | None
    groups: bool | None
    layout: Layout
    lease: float | None
    lease_key: str | None
    sampler: Sampler
    padding: Padding


def checked_again(request: Any) -> GetRequest:
    """A request that crossed Ray, checked again: it was unpickled, without running its checks."""
    if not isinstance(request, GetRequest):
        raise ArgumentTypeError(f"expected a GetRequest, got {type(request).__name__}", "request")
    return get_request(
        request.consumer, request.columns, request.count, indexes=request.indexes,
        min_count=request.min_count, timeout=request.timeout, groups=request.groups,
        layout=request.layout, lease=request.lease, lease_key=request.lease_key,
        sampler=request.sampler, padding=request.padding,
    )  # fmt: skip


def get_request(
    consumer: Any,
    columns: Any,
    count: Any,
    *,
    indexes: Any = None,
    min_count: Any = None,
    timeout: Any = None,
    groups: Any = None,
    layout: Any = "padded",
    lease: Any = None,
    lease_key: Any = None,
    sampler: Any = FIFO,
    padding: Any = ZERO_PADDING,
) -> GetRequest:
    """Check a get's arguments that need no dock state, in the order every client checks them."""
    consumer = check_name("consumer", consumer)
    names = column_names(columns)
    num = as_count("count", count)
    rows = None if indexes is None else index_tensor(indexes)
    least = None if min_count is None else as_count("min_count", min_count)
    wait = as_seconds("timeout", timeout, positive=False)
    if groups is not None and not isinstance(groups, bool):
        raise ArgumentTypeError(f"groups must be True, False or None, got {groups!r}", "groups")
    layout = check_layout(layout)
    hold = None if lease is None else as_seconds("lease", lease, positive=True)
    if lease is not None and hold is None:
        hold = math.inf  # a lease without expiry: held until ack or release
    if lease_key is not None:
        check_name("lease_key", lease_key)
        if lease is None:
            raise InvalidArgumentError(f"lease_key {lease_key!r} needs a lease (seconds)", "lease_key")
    return GetRequest(
        consumer, names, num, rows, least, wait, groups, layout, hold, lease_key,
        check_sampler(sampler), check_padding(padding),
    )  # fmt: skip


def peek_request(columns: Any, indexes: Any, layout: Any, padding: Any) -> tuple[list[str], torch.Tensor]:
    """Check a peek's arguments that need no dock state: (column names, int64 [B] indexes)."""
    names = column_names(columns)
    rows = index_tensor(indexes)
    check_layout(layout)
    check_padding(padding)
    return names, rows


class PutRequest(NamedTuple):
    """A put's arguments after `put_request` checked their types (the data's forms: see _inputs)."""

    data: dict[str, Any]
    rows: torch.Tensor
    lengths: dict[str, Any] | None
    completed: torch.Tensor | None
    ack: Lease | None


def put_request(data: Any, indexes: Any, lengths: Any, completed: Any, ack: Any) -> PutRequest:
    """Check a put's arguments that need no dock state, in the order every client checks them."""
    if not hasattr(data, "items") or not hasattr(data, "keys"):
        raise ArgumentTypeError(
            f"data must be a mapping of column name -> values, got {type(data).__name__}", "data"
        )
    rows = index_tensor(indexes)
    columns = dict(data.items())  # a TensorDict iterates over rows, not keys
    if not columns:
        raise InvalidArgumentError("put needs at least one column in data, got none", "data")
    for name in columns:
        if not isinstance(name, str):
            raise ArgumentTypeError(f"data's keys must be column names (str), got {name!r}", "data")
    if lengths is not None and not hasattr(lengths, "items"):
        raise ArgumentTypeError(
            f"lengths must be a mapping of column name -> lengths, got {type(lengths).__name__}", "lengths"
        )
    done = None if completed is None else completed_tensor(completed)
    lease = None if ack is None else check_lease("ack", ack)
    return PutRequest(columns, rows, None if lengths is None else dict(lengths.items()), done, lease)


def completed_tensor(completed: Any) -> torch.Tensor:
    """`put(completed=...)` as bool [B]: a bool tensor or a sequence of bools (its length: the dock's)."""
    if isinstance(completed, torch.Tensor):
        check_tensor("completed", completed)
        done = completed.detach().cpu()
    elif isinstance(completed, str | bytes):
        done = torch.empty(0, dtype=torch.uint8)  # refused below
    else:
        try:
            done = torch.as_tensor(completed)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            done = torch.empty(0, dtype=torch.uint8)
        if isinstance(completed, Sequence) and len(completed) == 0:
            done = torch.empty(0, dtype=torch.bool)  # no rows: as_tensor reads [] as float32
    if done.dtype != torch.bool:
        raise ArgumentTypeError(f"completed must be bools (one per row), got {completed!r:.80}", "completed")
    return done.reshape(-1)
