"""DockTable: the state of one dock (the table in _dock.py's docstring) and the lock that guards it.

Every part of the dock works on one: the put path (_put), the get path (_take), acks and releases
(_acks), clears and metrics (_lifecycle), state_dict capture and checks (_state, _state_check).
Each takes the table as an argument, so the state is declared once, here, where it is made.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from entrepot.dock._checks import check_name, column_names
from entrepot.dock._columns import ColumnSpec, ScalarColumn, SequenceColumn
from entrepot.dock._errors import UnknownColumnError, UnknownConsumerError
from entrepot.dock._leases import LeaseTable
from entrepot.dock._select import advance_watermark
from entrepot.dock._taken import Taken
from entrepot.dock.signing import new_secret

Store = SequenceColumn | ScalarColumn


class DockTable:
    """Settings, stores, bitmaps and counters of one dock; `cond` guards all but the settings.

    Args:
        capacity: rows (a multiple of `n_samples_per_prompt`).
        specs: column name -> ColumnSpec, in column order.
        consumers: consumer names, in order (consumer k's random sampler is seeded `seed + k`).
        n_samples_per_prompt, seed, rollout_consumer, max_age, max_staleness, group_gets: as in
            `ExperienceDock` (checked there).
    """

    def __init__(
        self,
        capacity: int,
        specs: Mapping[str, ColumnSpec],
        consumers: Sequence[str],
        *,
        n_samples_per_prompt: int,
        seed: int,
        rollout_consumer: str | None,
        max_age: int | None,
        max_staleness: int | None,
        group_gets: bool,
    ) -> None:
        self.capacity = capacity
        self.n_samples_per_prompt = n_samples_per_prompt
        self.specs = dict(specs)
        self.columns = list(specs)
        self.consumers = list(consumers)
        self.seed = seed
        self.rollout_consumer = rollout_consumer
        self.max_age = max_age
        self.max_staleness = max_staleness
        self.group_gets = group_gets
        self.column_index = {name: i for i, name in enumerate(self.columns)}
        self.consumer_index = {name: i for i, name in enumerate(self.consumers)}
        self.cond = threading.Condition(threading.RLock())
        self.lease_secret = new_secret()  # signs this dock's leases (see _leases)
        self.reset()

    def reset(self) -> None:
        """Empty rows, fresh bitmaps, reseeded samplers, zeroed metrics (construction and reset)."""
        capacity, num_consumers = self.capacity, len(self.consumers)
        self.stores: dict[str, Store | None] = {
            name: self.make_store(spec) for name, spec in self.specs.items()
        }
        self.ready = torch.zeros(len(self.columns), capacity, dtype=torch.bool)
        self.consumed = torch.zeros(num_consumers, capacity, dtype=torch.bool)
        self.live = torch.zeros(capacity, dtype=torch.bool)
        self.age = torch.zeros(capacity, dtype=torch.int32)
        self.completed = torch.ones(capacity, dtype=torch.bool)
        self.born = torch.full((capacity,), -1, dtype=torch.int64)
        self.policy_version = 0
        self.rows_stale = 0
        self.num_unfinished = 0  # live rows with completed=False: while 0, gets need no group masks
        self.num_live = 0
        self.num_consumed = [0] * num_consumers
        self.watermark = [0] * num_consumers
        self.generators = [torch.Generator().manual_seed(self.seed + k) for k in range(num_consumers)]
        self.counts = {"puts": 0, "gets": 0, "rows_put": 0}
        self.rows_got = [0] * num_consumers
        self.wait_s = [0.0] * num_consumers
        self.bytes_got = [0] * num_consumers
        self.readers = 0  # gets copying out of snapshots right now
        self.leases = LeaseTable(self.consumers, capacity, self.lease_secret)

    def make_store(self, spec: ColumnSpec) -> Store | None:
        """The store of a column of `spec`; None while its dtype or kind is open (the first put fixes it)."""
        if spec.dtype is None or spec.scalar is None:
            return None  # fixed by the first put
        if spec.scalar:
            return ScalarColumn(self.capacity, spec.dtype)
        return SequenceColumn(self.capacity, spec.dtype)

    def scalar_kind(self, name: str) -> bool | None:
        """Whether column `name` stores scalars: its store's kind, else its spec's (None: still open)."""
        store = self.stores.get(name)
        if store is not None:
            return isinstance(store, ScalarColumn)
        return self.specs[name].scalar

    def check_consumer(self, consumer: str) -> int:
        """The index of `consumer`, or UnknownConsumerError (ArgumentTypeError: not a str)."""
        if check_name("consumer", consumer) not in self.consumer_index:
            raise UnknownConsumerError(consumer, self.consumers)
        return self.consumer_index[consumer]

    def check_columns(self, columns: Sequence[str]) -> list[int]:
        """The indexes of `columns` (a non-empty list of distinct known names), else a DockError."""
        for name in column_names(columns):
            if name not in self.column_index:
                raise UnknownColumnError(name, self.columns)
        return [self.column_index[name] for name in columns]

    def snapshot(self, columns: Sequence[str], rows: torch.Tensor) -> Taken:
        """What to copy out after the lock is released; the caller must call `done_reading` after."""
        self.readers += 1  # while > 0, clear() must not recycle segments
        parts: dict[str, Any] = {}
        for name in columns:
            store = self.stores[name]
            assert store is not None  # the rows are ready in this column, so it was written
            parts[name] = store.read(rows) if isinstance(store, ScalarColumn) else store.snapshot(rows)
        return Taken(rows.clone(), parts, self.age.index_select(0, rows))

    def done_reading(self) -> None:
        """A reader finished copying out of its snapshot (see `snapshot`)."""
        with self.cond:
            self.readers -= 1

    def advance_watermark(self, k: int) -> None:
        """Move consumer `k`'s watermark (its first unconsumed row) past the rows it has consumed."""
        mark = self.watermark[k]
        if mark < self.capacity and bool(self.consumed[k, mark]):
            self.watermark[k] = advance_watermark(self.consumed[k], mark)

    def recount(self) -> None:
        """Counters and watermarks from the bitmaps, after rows were dropped or a state installed."""
        self.num_live = int(self.live.sum())
        self.num_consumed = [int(n) for n in self.consumed.sum(1).tolist()]
        self.num_unfinished = int((self.live & ~self.completed).sum())
        self.watermark = [0] * len(self.consumers)
