"""ExperienceDock: the rows x columns store between rollout and training.

State (capacity R rows, C columns, K consumers):
    columns    one flat buffer + offsets/lengths per sequence column, a dense tensor per scalar column
    ready      bool [C, R]  cell (column, row) holds data
    consumed   bool [K, R]  consumer k has received row r (acked, with a leased get)
    leases     bool [K, R]  row r is held for consumer k under a lease (see _leases), not yet acked
    live       bool [R]     row holds data in at least one column
    age        int32 [R]    clears a row survived unfinished (partial rollout)
    completed  bool [R]     False while the row's response is unfinished (partial rollout)
    born       int64 [R]    policy version the row's response began under; -1 before (see _partial)

One lock guards all of it; waiting getters sleep on a condition variable that every put, ack,
release and clear notifies (and wake by themselves when a lease they wait on expires). A get
selects and marks rows under the lock (a few vectorised bitmap operations) and copies the data out
after releasing it, so copies of different consumers run in parallel.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

import torch

from entrepot.dock._batch import LAYOUTS, Batch, Layout, build_batch
from entrepot.dock._columns import ColumnSpec, ScalarColumn, SequenceColumn, is_lossless
from entrepot.dock._errors import (
    AlreadyConsumedError,
    ColumnLayoutError,
    DockConfigError,
    DockTimeout,
    GroupSizeError,
    InvalidArgumentError,
    LeaseError,
    LossyDtypeError,
    NotReadyError,
    RowCountMismatchError,
    UnknownColumnError,
    UnknownConsumerError,
)
from entrepot.dock._inputs import ColumnData, as_index_tensor, normalize_put
from entrepot.dock._leases import ACKED, Lease, LeaseTable
from entrepot.dock._lifecycle import DockLifecycle
from entrepot.dock._partial import finished_groups
from entrepot.dock._sampling import balanced_order
from entrepot.dock._select import advance_watermark, expand_units, scan
from entrepot.dock._taken import Taken

Sampler = Literal["fifo", "random", "balanced"]
SAMPLERS = ("fifo", "random", "balanced")
Store = SequenceColumn | ScalarColumn


class ExperienceDock(DockLifecycle):
    """A fixed-capacity table of rows x columns with per-cell ready bits and per-consumer consumed bits.

    Args:
        capacity: number of rows; defaults to `prompts_num * n_samples_per_prompt`.
        columns: column names, or a mapping name -> ColumnSpec to fix dtype / scalar-ness up front.
        consumers: names of the stages that get rows (each receives every row at most once).
        prompts_num: number of prompt groups (alternative to `capacity`).
        n_samples_per_prompt: rows per prompt group; group-mode gets take whole groups.
        seed: seeds the per-consumer random samplers.
        rollout_consumer: the consumer that generates responses; rows put with `completed=False` go
            back to it after `clear()` (partial rollout). None disables partial rollout.
        max_age: with partial rollout, a row that survived `max_age - 1` clears unfinished is marked
            completed on its next put (the rollout must finish or truncate it).
        max_staleness: with partial rollout, the most policy versions a group's oldest row may lag
            behind `set_policy_version`'s; older groups are dropped when the version advances. None: no limit.
        group_gets: default of `get(groups=...)`.
    """

    def __init__(
        self,
        capacity: int | None = None,
        *,
        columns: Sequence[str] | Mapping[str, ColumnSpec],
        consumers: Sequence[str],
        prompts_num: int | None = None,
        n_samples_per_prompt: int = 1,
        seed: int = 0,
        rollout_consumer: str | None = None,
        max_age: int | None = None,
        max_staleness: int | None = None,
        group_gets: bool = False,
    ) -> None:
        if n_samples_per_prompt < 1:
            raise DockConfigError(f"n_samples_per_prompt must be >= 1, got {n_samples_per_prompt}")
        if capacity is None:
            if prompts_num is None:
                raise DockConfigError("give either capacity or prompts_num (with n_samples_per_prompt)")
            capacity = prompts_num * n_samples_per_prompt
        if capacity < 1 or capacity % n_samples_per_prompt:
            raise DockConfigError(
                f"capacity ({capacity}) must be >= 1 and a multiple of "
                f"n_samples_per_prompt ({n_samples_per_prompt})"
            )
        specs = dict(columns) if isinstance(columns, Mapping) else {name: ColumnSpec() for name in columns}
        for names, what in ((list(specs), "column"), (list(consumers), "consumer")):
            if not names or len(set(names)) != len(names):
                raise DockConfigError(f"{what} names must be non-empty and distinct, got {names}")
        if rollout_consumer is not None and rollout_consumer not in consumers:
            raise DockConfigError(
                f"rollout_consumer {rollout_consumer!r} is not one of the consumers {list(consumers)}"
            )
        if max_age is not None and (max_age < 1 or rollout_consumer is None):
            raise DockConfigError(f"max_age ({max_age}) must be >= 1 and needs a rollout_consumer")
        if max_staleness is not None and (max_staleness < 0 or rollout_consumer is None):
            raise DockConfigError(
                f"max_staleness ({max_staleness}) must be >= 0 and needs a rollout_consumer"
            )
        self.capacity = capacity
        self.n_samples_per_prompt = n_samples_per_prompt
        self.columns = list(specs)
        self.consumers = list(consumers)
        self.seed = seed
        self.rollout_consumer = rollout_consumer
        self.max_age = max_age
        self.max_staleness = max_staleness
        self.group_gets = group_gets
        self._specs = specs
        self._column_index = {name: i for i, name in enumerate(self.columns)}
        self._consumer_index = {name: i for i, name in enumerate(self.consumers)}
        self._cond = threading.Condition(threading.RLock())
        self._init_state()

    def _init_state(self) -> None:
        """Empty rows, fresh bitmaps, reseeded samplers, zeroed metrics (construction and reset)."""
        capacity, num_consumers = self.capacity, len(self.consumers)
        self._stores: dict[str, Store | None] = {
            name: self._make_store(spec) for name, spec in self._specs.items()
        }
        self._ready = torch.zeros(len(self.columns), capacity, dtype=torch.bool)
        self._consumed = torch.zeros(num_consumers, capacity, dtype=torch.bool)
        self._live = torch.zeros(capacity, dtype=torch.bool)
        self._age = torch.zeros(capacity, dtype=torch.int32)
        self._completed = torch.ones(capacity, dtype=torch.bool)
        self._born = torch.full((capacity,), -1, dtype=torch.int64)
        self.policy_version = 0
        self._rows_stale = 0
        self._num_unfinished = 0  # live rows with completed=False: while 0, gets need no group masks
        self._num_live = 0
        self._num_consumed = [0] * num_consumers
        self._watermark = [0] * num_consumers
        self._generators = [torch.Generator().manual_seed(self.seed + k) for k in range(num_consumers)]
        self._counts = {"puts": 0, "gets": 0, "rows_put": 0}
        self._rows_got = [0] * num_consumers
        self._wait_s = [0.0] * num_consumers
        self._bytes_got = [0] * num_consumers
        self._readers = 0  # gets copying out of snapshots right now
        self._leases = LeaseTable(self.consumers, capacity)

    def _make_store(self, spec: ColumnSpec) -> Store | None:
        if spec.dtype is None or spec.scalar is None:
            return None  # fixed by the first put
        if spec.scalar:
            return ScalarColumn(self.capacity, spec.dtype)
        return SequenceColumn(self.capacity, spec.dtype)

    # ------------------------------------------------------------------ put

    def put(
        self,
        data: Mapping[str, Any],
        indexes: Sequence[int] | torch.Tensor,
        *,
        lengths: Mapping[str, Any] | None = None,
        completed: Sequence[bool] | torch.Tensor | None = None,
        ack: Lease | None = None,
    ) -> None:
        """Store columns for rows `indexes`, mark the cells ready and wake waiting getters.

        Args:
            data: column -> values for B rows: a [B] tensor (scalars), a padded [B, L] tensor (with
                `lengths`, else every row is L long), a packed [T] tensor with `lengths`, a
                `(tensor, lengths)` tuple, or a list of B tensors. A TensorDict works like a dict.
            indexes: B distinct rows in [0, capacity).
            lengths: column -> int [B] valid lengths of padded or packed columns.
            completed: bool [B] (partial rollout): False marks a row's response as unfinished.
            ack: a lease holding all of `indexes` (the batch these outputs were computed from): the
                rows are acked in the same step, so outputs and acks are stored together or not at all.

        Raises:
            DockError subclass naming the column or index; nothing is stored when it raises.
        """
        rows = as_index_tensor(indexes, self.capacity)
        data = dict(data.items())  # a TensorDict iterates over rows, not keys
        if not data:
            raise InvalidArgumentError("put needs at least one column")
        for name in data:
            if name not in self._column_index:
                raise UnknownColumnError(name, self.columns)
        done = self._as_completed(completed, rows.numel())
        if rows.numel() == 0:
            return
        hints = {name: self._scalar_kind(name) for name in data}
        columns = normalize_put(data, lengths, rows.numel(), hints)
        with self._cond:
            if ack is not None:
                self._leases.expire(time.monotonic())
                self._leases.held_rows(ack, rows)
            for name, column in columns.items():
                self._check_column(name, column)
            # Conversions allocate, so they come before any change; then the bookkeeping of every
            # column; the bulk copies last (see SequenceColumn.reserve): nothing left that can fail.
            columns = {name: column.to(self._stored_dtype(name, column)) for name, column in columns.items()}
            copies = [self._write(name, rows, column) for name, column in columns.items()]
            if ack is not None:
                self._ack_rows(ack, rows)
            self._num_live += rows.numel() - int(self._live.index_select(0, rows).sum())
            self._live.index_fill_(0, rows, True)
            if done is not None:
                self._mark_completed(rows, done)
            self._counts["puts"] += 1
            self._counts["rows_put"] += rows.numel()
            for copy in copies:
                if copy is not None:  # a sequence column's rows (scalars are stored already)
                    target, column = copy
                    column.copy_into(target)
            self._cond.notify_all()

    def _as_completed(self, completed: Any, num_rows: int) -> torch.Tensor | None:
        return completed_flags(completed, num_rows, self.rollout_consumer)

    def _mark_completed(self, rows: torch.Tensor, done: torch.Tensor) -> None:
        if self.max_age is not None:
            done = done | (self._age[rows] >= self.max_age - 1)  # too old to wait another round
        self._completed[rows] = done
        fresh = rows[self._born[rows] < 0]
        self._born[fresh] = self.policy_version  # the version this row's response began under
        self._num_unfinished = int((self._live & ~self._completed).sum())

    def _scalar_kind(self, name: str) -> bool | None:
        store = self._stores.get(name)
        if store is not None:
            return isinstance(store, ScalarColumn)
        return self._specs[name].scalar

    def _check_column(self, name: str, column: ColumnData) -> None:
        """Raise if `column` cannot be stored in `name` (called under the lock, before any write)."""
        store = self._stores[name]
        spec = self._specs[name]
        scalar = isinstance(store, ScalarColumn) if store is not None else spec.scalar
        if scalar is not None and scalar != column.scalar:
            want, got = ("one scalar per row", "sequences") if scalar else ("sequences", "one scalar per row")
            raise ColumnLayoutError(name, f"the column stores {want}, got {got}")
        dtype = store.dtype if store is not None else spec.dtype
        if dtype is not None and not is_lossless(column.dtype, dtype):
            raise LossyDtypeError(name, str(column.dtype), str(dtype))

    def _stored_dtype(self, name: str, column: ColumnData) -> torch.dtype:
        """The dtype column `name` stores (`column`'s own where the store is not made yet)."""
        store = self._stores[name]
        return store.dtype if store is not None else self._specs[name].dtype or column.dtype

    def _write(
        self, name: str, rows: torch.Tensor, column: ColumnData
    ) -> tuple[torch.Tensor, ColumnData] | None:
        """Store a scalar column, or make room for a sequence column's rows and return (room, rows): the
        copy still to do."""
        store = self._stores[name]
        if store is None:
            spec = ColumnSpec(column.dtype, column.scalar)  # `column` is in the stored dtype already
            store = self._stores[name] = self._make_store(spec)
        c = self._column_index[name]
        copy = None
        if isinstance(store, ScalarColumn):
            store.write(rows, column.flat)
        else:
            assert column.lengths is not None and isinstance(store, SequenceColumn)  # checked above
            copy = (store.reserve(rows, column.lengths, column.numel, self._ready[c]), column)
        self._ready[c].index_fill_(0, rows, True)
        return copy

    # ------------------------------------------------------------------ get

    def get(
        self,
        consumer: str,
        columns: Sequence[str],
        count: int,
        *,
        indexes: Sequence[int] | torch.Tensor | None = None,
        min_count: int | None = None,
        timeout: float | None = None,
        groups: bool | None = None,
        sampler: Sampler = "fifo",
        num_ranks: int = 1,
        layout: Layout = "padded",
        pad_value: float = 0,
        pad_multiple: int = 1,
        lease: float | None = None,
        lease_key: str | None = None,
    ) -> Batch | None:
        """Take up to `count` rows ready in all `columns` that `consumer` has not received yet.

        Blocks until at least `min_count` rows (default `count`) are available, or fewer if fewer
        unconsumed rows are left in the dock (the tail of an iteration).

        Args:
            consumer: who is reading; each row reaches each consumer once.
            columns: the columns to return; rows must be ready in all of them.
            count: most rows to return (a multiple of n_samples_per_prompt in group mode).
            indexes: read exactly these rows, in this order (guarantee-order mode); waits until they
                are ready; `count`, `min_count`, `groups` and `sampler` are ignored.
            min_count: fewest rows worth returning (partial batches); default `count`.
            timeout: seconds to wait; None waits forever; on expiry raises DockTimeout, taking nothing.
            groups: take whole prompt groups of n_samples_per_prompt rows (default: the dock's `group_gets`).
            sampler: "fifo" (lowest rows first), "random" (seeded per consumer, saved in state_dict),
                or "balanced" (FIFO rows reordered so `batch.split(num_ranks)` gives DP ranks equal tokens).
            num_ranks: DP ranks for the balanced sampler.
            layout: "padded" (TensorDict [B, L_c] + lengths) or "packed" (flat [T_c] + lengths / cu_seqlens).
            pad_value: fill value of the padded layout.
            pad_multiple: padded widths are rounded up to a multiple of this (e.g. TP x CP size).
            lease: hold the rows for `lease` seconds (``math.inf``: no expiry) instead of marking
                them consumed: `ack` makes them consumed; on `release` or expiry they return to the
                pool, so a consumer that dies after the get loses nothing. None: consumed at once.
            lease_key: with `lease`, makes the get idempotent: while a lease taken with this key
                holds rows, the same rows come back (renewed) instead of new ones, e.g. for a task
                that Ray retries; once that lease is acked in full, the get returns None.

        Returns:
            The batch (with `batch.lease` set under a lease), or None when `consumer` has received
            (and, under leases, acked) every row the dock holds.

        A get that raises takes nothing: rows it had picked go back before the error propagates.
        """
        if layout not in LAYOUTS:
            raise InvalidArgumentError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if pad_multiple < 1:
            raise InvalidArgumentError(f"pad_multiple must be >= 1, got {pad_multiple}")
        taken = self._take(
            consumer, columns, count, indexes, min_count, timeout, groups, sampler, num_ranks,
            lease, lease_key,
        )  # fmt: skip
        if taken is None:
            return None
        try:
            raw = taken.gather(layout)
            batch = build_batch(taken.rows, raw, taken.ages, layout, pad_value, pad_multiple)
        except BaseException:
            self._untake(consumer, taken)
            raise
        finally:
            self._done_reading()
        return batch if taken.lease is None else replace(batch, lease=taken.lease)

    def _take(
        self,
        consumer: str,
        columns: Sequence[str],
        count: int,
        indexes: Sequence[int] | torch.Tensor | None = None,
        min_count: int | None = None,
        timeout: float | None = None,
        groups: bool | None = None,
        sampler: Sampler = "fifo",
        num_ranks: int = 1,
        lease: float | None = None,
        lease_key: str | None = None,
    ) -> Taken | None:
        """Select and mark (or lease) rows under the lock; return what the copy-out needs (None: done)."""
        k = self._check_consumer(consumer)
        col_ids = self._check_columns(columns)
        group_size = self.n_samples_per_prompt if (self.group_gets if groups is None else groups) else 1
        wanted = self._check_counts(count, min_count, group_size, sampler, num_ranks)
        rows = None if indexes is None else as_index_tensor(indexes, self.capacity)
        if lease is not None:
            LeaseTable.check_seconds(lease)
        elif lease_key is not None:
            raise InvalidArgumentError(f"lease_key {lease_key!r} needs a lease (seconds)")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            started = now = time.monotonic()
            if lease is not None and lease_key is not None:
                again = self._leases.reissue(k, lease_key, lease, now)
                if again == ACKED:
                    return None
                if isinstance(again, tuple):  # a retry: the rows this key already holds
                    self._count_delivery(k, again[1])
                    return replace(self._snapshot(columns, again[1]), lease=again[0])
            while True:
                if self._leases.expire(now):
                    self._cond.notify_all()  # rows back in the pool: other waiting getters look again
                if rows is not None:
                    picked = self._pick_explicit(k, col_ids, rows)
                else:
                    finished = self._finished_for(k)
                    if self._consumer_done(k, finished):
                        return None
                    picked = self._pick(k, col_ids, count, wanted, group_size, sampler, finished)
                if picked is not None:
                    break
                left = None if deadline is None else deadline - now
                if left is not None and left <= 0:
                    self._wait_s[k] += now - started
                    what = f"rows {rows.tolist()[:8]}" if rows is not None else f"{wanted} rows"
                    raise DockTimeout(consumer, list(columns), what, float(timeout or 0))
                expiry = self._leases.next_deadline() - now  # a lease may hand rows back before then
                nap = min(left if left is not None else math.inf, expiry)
                self._cond.wait(None if math.isinf(nap) else max(nap, 0.0))
                now = time.monotonic()
            self._wait_s[k] += now - started
            granted = None
            if lease is None:
                self._mark_consumed(k, picked)
            else:
                granted = self._leases.grant(k, picked, lease, lease_key, now)
                self._count_delivery(k, picked)
            taken = replace(self._snapshot(columns, picked), lease=granted)
            self._bytes_got[k] += taken.nbytes()
        if sampler == "balanced" and rows is None:
            try:
                taken = taken.reorder(balanced_order(taken.tokens_per_row(), num_ranks, group_size))
            except BaseException:
                self._untake(consumer, taken)
                self._done_reading()
                raise
        return taken

    def _untake(self, consumer: str, taken: Taken) -> None:
        """Undo a get that failed after picking `taken.rows`: they become available again."""
        k = self._consumer_index[consumer]
        with self._cond:
            if taken.lease is not None:
                self.release(taken.lease)  # 0 rows if another get expired it meanwhile: nothing to undo
            else:
                self._consumed[k, taken.rows] = False
                self._num_consumed[k] -= taken.rows.numel()
                self._watermark[k] = min(self._watermark[k], int(taken.rows.min()))
            self._cond.notify_all()

    def ack(self, lease: Lease, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        """Mark the rows `lease` holds (or `indexes` of them) consumed: they will not come back.

        Raises:
            LeaseError: the lease expired, was released or acked, or does not hold a named row.
        """
        rows = None if indexes is None else as_index_tensor(indexes, self.capacity)
        with self._cond:
            self._leases.expire(time.monotonic())
            self._ack_rows(lease, self._leases.held_rows(lease, rows))
            self._cond.notify_all()

    def release(self, lease: Lease) -> int:
        """Hand the rows `lease` still holds back to the pool now; how many (0 if it holds none)."""
        with self._cond:
            self._leases.expire(time.monotonic())
            try:
                rows = self._leases.held_rows(lease, None)
            except LeaseError:
                return 0
            self._leases.settle(lease, rows, returned=True)
            self._cond.notify_all()
            return int(rows.numel())

    def _ack_rows(self, lease: Lease, rows: torch.Tensor) -> None:
        k = self._consumer_index[lease.consumer]
        self._leases.settle(lease, rows, returned=False)
        self._consumed[k, rows] = True
        self._num_consumed[k] += rows.numel()
        self._advance_watermark(k)

    def _done_reading(self) -> None:
        """A reader finished copying out of its snapshot (see `_snapshot`)."""
        with self._cond:
            self._readers -= 1

    def _check_consumer(self, consumer: str) -> int:
        if consumer not in self._consumer_index:
            raise UnknownConsumerError(consumer, self.consumers)
        return self._consumer_index[consumer]

    def _check_columns(self, columns: Sequence[str]) -> list[int]:
        if isinstance(columns, str) or not columns or len(set(columns)) != len(columns):
            raise InvalidArgumentError(f"columns must be a non-empty list of distinct names, got {columns!r}")
        for name in columns:
            if name not in self._column_index:
                raise UnknownColumnError(name, self.columns)
        return [self._column_index[name] for name in columns]

    def _check_counts(
        self, count: int, min_count: int | None, group_size: int, sampler: str, num_ranks: int
    ) -> int:
        if sampler not in SAMPLERS:
            raise InvalidArgumentError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        if count < 1:
            raise InvalidArgumentError(f"count must be >= 1, got {count}")
        wanted = count if min_count is None else min_count
        if not 1 <= wanted <= count:
            raise InvalidArgumentError(f"min_count must be in [1, count={count}], got {min_count}")
        if count % group_size or wanted % group_size:
            raise GroupSizeError(
                f"in group mode count ({count}) and min_count ({wanted}) must be multiples of "
                f"n_samples_per_prompt ({group_size})"
            )
        if sampler == "balanced" and (num_ranks < 1 or count % (num_ranks * group_size) or wanted != count):
            raise InvalidArgumentError(
                f"the balanced sampler needs count ({count}) divisible by num_ranks ({num_ranks}) x "
                f"group size ({group_size}) and min_count == count"
            )
        return wanted

    def _finished_for(self, k: int) -> torch.Tensor | None:
        """bool [R] rows of finished groups, when consumer `k` may get only those now (unfinished rows
        exist and `k` is downstream of the rollout; see _partial); else None (no restriction)."""
        if self._num_unfinished == 0 or self.consumers[k] == self.rollout_consumer:
            return None
        return finished_groups(self._live, self._completed, self.n_samples_per_prompt)

    def _rollout_idle(self) -> bool:
        """The rollout has taken every row and holds none under a lease: no response is in flight."""
        assert self.rollout_consumer is not None  # only asked while rows are unfinished
        r = self._consumer_index[self.rollout_consumer]
        return self._num_consumed[r] == self._num_live and not self._leases.num_leased[r]

    def _consumer_done(self, k: int, finished: torch.Tensor | None) -> bool:
        """`k` has every row it will get this iteration (with partial rollout: every finished group's)."""
        if finished is None:
            return self._num_live == self._num_consumed[k]
        return self._rollout_idle() and not bool((finished & ~self._consumed[k]).any())

    def _rows_left(self, k: int, finished: torch.Tensor | None) -> int:
        """Rows `k` may still get this iteration (an upper bound while the rollout is still generating)."""
        if finished is not None and self._rollout_idle():
            return int((finished & ~self._consumed[k] & ~self._leases.leased[k]).sum())
        return self._num_live - self._num_consumed[k] - self._leases.num_leased[k]

    def _available_fn(self, k: int, col_ids: list[int], finished: torch.Tensor | None) -> Any:
        """(lo, hi) -> rows `k` may take; `finished` (see `_finished_for`) keeps unfinished partial
        responses, and their groups, for the rollout only."""
        leased = self._leases.leased[k] if self._leases.num_leased[k] else None

        def available(lo: int, hi: int) -> torch.Tensor:
            mask = self._ready[col_ids[0], lo:hi] & ~self._consumed[k, lo:hi]
            if leased is not None:  # held for this consumer under a lease
                mask &= ~leased[lo:hi]
            for c in col_ids[1:]:
                mask &= self._ready[c, lo:hi]
            if finished is not None:
                mask &= finished[lo:hi]
            return mask

        return available

    def _pick(
        self,
        k: int,
        col_ids: list[int],
        count: int,
        wanted: int,
        group_size: int,
        sampler: str,
        finished: torch.Tensor | None,
    ) -> torch.Tensor | None:
        remaining = self._rows_left(k, finished)
        if remaining <= 0:
            return None  # every row left is leased: wait for an ack (the end) or a return
        need_units = math.ceil(min(wanted, remaining) / group_size)
        max_units = count // group_size
        stop_after = None if sampler == "random" else max_units
        available = self._available_fn(k, col_ids, finished)
        units = scan(available, self._watermark[k], self.capacity, group_size, stop_after)
        if units.numel() < need_units:
            return None
        if sampler == "random" and units.numel() > max_units:
            pick = torch.randperm(units.numel(), generator=self._generators[k])[:max_units]
            units = units[pick.sort().values]
        return expand_units(units[:max_units], group_size)

    def _pick_explicit(self, k: int, col_ids: list[int], rows: torch.Tensor) -> torch.Tensor | None:
        already = self._consumed[k, rows].nonzero()
        if already.numel():
            raise AlreadyConsumedError(self.consumers[k], int(rows[already[0, 0]]))
        if bool(self._ready[:, rows][col_ids].all()) and not bool(self._leases.leased[k, rows].any()):
            return rows
        return None  # not ready yet, or held under a lease that may still hand them back

    def _mark_consumed(self, k: int, rows: torch.Tensor) -> None:
        self._consumed[k].index_fill_(0, rows, True)
        self._num_consumed[k] += rows.numel()
        self._count_delivery(k, rows)
        self._advance_watermark(k)

    def _count_delivery(self, k: int, rows: torch.Tensor) -> None:
        self._rows_got[k] += rows.numel()
        self._counts["gets"] += 1

    def _advance_watermark(self, k: int) -> None:
        mark = self._watermark[k]
        if mark < self.capacity and bool(self._consumed[k, mark]):
            self._watermark[k] = advance_watermark(self._consumed[k], mark)

    def _snapshot(self, columns: Sequence[str], rows: torch.Tensor) -> Taken:
        """What to copy out after the lock is released; the caller must call `_done_reading` after."""
        self._readers += 1  # while > 0, clear() must not recycle segments
        parts: dict[str, Any] = {}
        for name in columns:
            store = self._stores[name]
            assert store is not None  # the rows are ready in this column, so it was written
            parts[name] = store.read(rows) if isinstance(store, ScalarColumn) else store.snapshot(rows)
        return Taken(rows.clone(), parts, self._age.index_select(0, rows))

    def peek(
        self,
        columns: Sequence[str],
        indexes: Sequence[int] | torch.Tensor,
        *,
        layout: Layout = "padded",
        pad_value: float = 0,
        pad_multiple: int = 1,
    ) -> Batch:
        """Read ready cells without consuming them (e.g. the partial responses a rollout continues)."""
        if layout not in LAYOUTS:
            raise InvalidArgumentError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        col_ids = self._check_columns(columns)
        rows = as_index_tensor(indexes, self.capacity)
        with self._cond:
            for name, c in zip(columns, col_ids, strict=True):
                missing = (~self._ready[c, rows]).nonzero()
                if missing.numel():
                    raise NotReadyError(name, int(rows[missing[0, 0]]))
            taken = self._snapshot(columns, rows)
        try:
            raw = taken.gather(layout)
            return build_batch(taken.rows, raw, taken.ages, layout, pad_value, pad_multiple)
        finally:
            self._done_reading()


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
