"""Typed errors of entrepot.dock: one base class, one subclass per kind of mistake.

Every message names the offending column / index / consumer and what was allowed, so a caller can
fix the call without reading the dock's source. A put or get that raises has changed nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _rebuild(cls: type[DockError], message: str, state: dict[str, Any]) -> DockError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class DockError(Exception):
    """Base class of every error raised by entrepot.dock."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take structured arguments; rebuild from the message so errors cross Ray intact.
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


class DockConfigError(DockError, ValueError):
    """The dock was constructed with impossible settings (capacity, columns, consumers, ...)."""


class UnknownColumnError(DockError, KeyError):
    """A column name that the dock was not built with."""

    def __init__(self, column: str, known: Sequence[str]) -> None:
        self.column = column
        super().__init__(f"unknown column {column!r}; the dock has columns {sorted(known)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownConsumerError(DockError, KeyError):
    """A consumer name that the dock was not built with."""

    def __init__(self, consumer: str, known: Sequence[str]) -> None:
        self.consumer = consumer
        super().__init__(f"unknown consumer {consumer!r}; the dock has consumers {sorted(known)}")

    def __str__(self) -> str:
        return str(self.args[0])


class IndexOutOfRangeError(DockError, IndexError):
    """A row index outside [0, capacity) (capacity None: one too large for any dock, past 64 bits)."""

    def __init__(self, index: int, capacity: int | None) -> None:
        self.index = index
        bound = "the dock's capacity" if capacity is None else capacity
        super().__init__(f"row index {index} is out of range; allowed 0 <= index < {bound}")


class DuplicateIndexError(DockError, ValueError):
    """The same row index appears twice in one put or get."""

    def __init__(self, index: int) -> None:
        self.index = index
        super().__init__(f"row index {index} appears more than once; each row may appear once per call")


class RowCountMismatchError(DockError, ValueError):
    """A column holds a different number of rows than the indexes given."""

    def __init__(self, column: str, expected: int, got: int) -> None:
        self.column = column
        super().__init__(f"column {column!r} holds {got} rows but {expected} indexes were given")


class LengthMismatchError(DockError, ValueError):
    """Lengths that do not fit the data they describe (negative, longer than the padding, wrong sum)."""

    def __init__(self, column: str, detail: str) -> None:
        self.column = column
        super().__init__(f"column {column!r}: {detail}")


class ColumnLayoutError(DockError, ValueError):
    """Data whose shape or kind does not fit the column (a 3-D tensor, sequences into a scalar column)."""

    def __init__(self, column: str, detail: str) -> None:
        self.column = column
        super().__init__(f"column {column!r}: {detail}")


class LossyDtypeError(DockError, TypeError):
    """Data whose dtype cannot be stored in the column's dtype without losing information."""

    def __init__(self, column: str, got: str, stored: str) -> None:
        self.column = column
        super().__init__(
            f"column {column!r} stores {stored}; {got} cannot be converted to it losslessly "
            f"(cast explicitly if the loss is intended)"
        )


class GroupSizeError(DockError, ValueError):
    """A count or index set that is not made of whole prompt groups in group mode."""


class DockStateError(DockError, ValueError):
    """A saved dock file or a state_dict that cannot be loaded: corrupt, truncated, unverified, or
    inconsistent with itself or with this dock. Nothing was loaded; the dock is as it was."""

    def __init__(self, source: str, detail: str) -> None:
        self.source = source
        super().__init__(f"{source}: {detail}")


class DockFullError(DockError, RuntimeError):
    """No free rows (or prompt groups) are left for new data."""


class DockTimeout(DockError, TimeoutError):
    """A get did not find enough rows before its timeout; nothing was consumed."""

    def __init__(self, consumer: str, columns: Sequence[str], wanted: str, timeout: float) -> None:
        self.consumer = consumer
        self.columns = list(columns)
        super().__init__(
            f"consumer {consumer!r} waited {timeout:g}s for {wanted} ready in columns {list(columns)}"
        )


class InvalidArgumentError(DockError, ValueError):
    """A get/put/clear argument outside what is allowed (count < 1, unknown sampler or layout, ...).

    `argument` names it (``"count"``, ``"timeout"``, ...) where one argument is to blame.
    """

    def __init__(self, message: str, argument: str | None = None) -> None:
        self.argument = argument
        super().__init__(message)


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong Python type: a str where a count goes, a bool as a count, a list of str
    as indexes, a meta or sparse tensor as data. Also a TypeError, which it replaces."""


class NotReadyError(DockError, LookupError):
    """A peek at a cell that holds no data yet."""

    def __init__(self, column: str, index: int) -> None:
        self.column = column
        self.index = index
        super().__init__(f"row {index} of column {column!r} is not ready")


class AlreadyConsumedError(DockError, ValueError):
    """A get with explicit indexes names a row this consumer already received."""

    def __init__(self, consumer: str, index: int) -> None:
        self.consumer = consumer
        self.index = index
        super().__init__(
            f"consumer {consumer!r} already received row {index}; each row is delivered to a consumer once"
        )


class LeaseError(DockError, LookupError):
    """An ack, release or put(ack=...) with a lease that this dock did not issue as given (forged,
    relabelled to another consumer, or another dock's), or that no longer holds the rows it names."""

    def __init__(self, lease_id: Any, consumer: Any, reason: str) -> None:
        self.lease_id = lease_id
        self.consumer = consumer
        super().__init__(f"lease {lease_id} of consumer {consumer!r} cannot be used: {reason}")


class DockMemoryError(DockError, MemoryError):
    """A put's rows could not get memory (the store's, or the buffer that carries them to an actor).

    Nothing was stored: a put reserves every column's room before it marks any cell ready.
    """

    def __init__(self, column: str, nbytes: int) -> None:
        self.column = column
        self.nbytes = nbytes
        super().__init__(
            f"column {column!r}: its rows need {nbytes} bytes, which could not be allocated (the "
            "allocator's error is this one's __cause__)"
        )


class NotOnClientError(DockError, AttributeError):
    """A call a client of a dock in another process does not carry (an `ExperienceDock` call such as
    ``state_dict``, or a name no dock has); the message lists the client's calls."""

    def __init__(self, client: str, name: str, calls: Sequence[str], hint: str = "") -> None:
        self.client = client
        self.call = name
        super().__init__(
            f"{client} has no {name!r}: the call is not on the client{hint}; its calls: {', '.join(calls)}"
        )


class DockShardLostError(DockError, RuntimeError):
    """A dock actor, or a sharded dock's shard or controller, died (its node or process is gone); the
    node is named (address and id)."""

    def __init__(self, part: str, node: str, detail: str) -> None:
        self.part = part
        self.node = node
        super().__init__(
            f"the dock's {part} on node {node} is lost ({detail}); the rows it held are gone: resume the "
            "run from its last checkpoint"
        )
