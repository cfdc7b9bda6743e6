"""The get path's selection: which rows a get takes, marked consumed (or leased) under the lock.

A get picks rows ready in all its columns that its consumer has not received (a few vectorised
bitmap operations from the consumer's watermark, see _select), marks or leases them, and snapshots
where their data is; the copy out happens after the lock is released (ExperienceDock.get). A
`RowTaker` holds no state of its own: everything it reads and marks is its table's.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from entrepot.dock._acks import release
from entrepot.dock._checks import (
    GetRequest,
    check_lease,
    check_name,
    check_pad_value,
    check_rows,
    index_tensor,
)
from entrepot.dock._columns import SequenceColumn
from entrepot.dock._errors import AlreadyConsumedError, DockTimeout, GroupSizeError, InvalidArgumentError
from entrepot.dock._leases import ACKED, Lease
from entrepot.dock._options import Padding, Sampler
from entrepot.dock._partial import finished_groups
from entrepot.dock._sampling import balanced_order
from entrepot.dock._select import expand_units, scan
from entrepot.dock._table import DockTable
from entrepot.dock._taken import Taken


class RowTaker:
    """Selects and marks (or leases) the rows of gets on one table.

    `snapshot`, `pick` and `available_fn` are the steps a sharded dock's ledger extends (row
    lengths instead of data; the caller's node's rows first): see _ledger.
    """

    def __init__(self, table: DockTable) -> None:
        self.table = table

    def take(self, request: GetRequest) -> Taken | None:
        """Select and mark (or lease) rows under the lock; return what the copy-out needs (None: done).

        `request` was checked by `get_request`; the checks that need the dock's state run here,
        before anything is marked (the padding value against each padded column's dtype too, so a
        padded layout laid out later, maybe in another process, cannot fail on it). The caller
        copies out of the returned snapshot and then calls `table.done_reading()`; if the copy
        fails, `untake` gives the rows back first.
        """
        t = self.table
        consumer, columns, count = request.consumer, request.columns, request.count
        k = t.check_consumer(consumer)
        col_ids = t.check_columns(columns)
        groups, sampler, lease = request.groups, request.sampler, request.lease
        group_size = t.n_samples_per_prompt if (t.group_gets if groups is None else groups) else 1
        wanted = self.check_counts(count, request.min_count, group_size, sampler)
        rows = None if request.indexes is None else check_rows(request.indexes, t.capacity)
        timeout = request.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        with t.cond:
            started = now = time.monotonic()
            self.check_fill(columns, request.layout, request.padding)
            if lease is not None and request.lease_key is not None:
                again = t.leases.reissue(k, request.lease_key, lease, now)
                if again == ACKED:
                    return None
                if isinstance(again, tuple):  # a retry: the rows this key already holds
                    self.count_delivery(k, again[1])
                    taken = replace(self.snapshot(columns, again[1]), lease=again[0])
                    t.bytes_got[k] += taken.nbytes()  # as any get's (`untake` takes them back)
                    return taken
            while True:
                if t.leases.expire(now):
                    t.cond.notify_all()  # rows back in the pool: other waiting getters look again
                if rows is not None:
                    picked = self.pick_explicit(k, col_ids, rows)
                else:
                    finished = self.finished_for(k)
                    if self.consumer_done(k, finished):
                        return None
                    picked = self.pick(k, col_ids, count, wanted, group_size, sampler, finished)
                if picked is not None:
                    # a put may have fixed a column's dtype while this get waited
                    self.check_fill(columns, request.layout, request.padding)
                    break
                left = None if deadline is None else deadline - now
                if left is not None and left <= 0:
                    t.wait_s[k] += now - started
                    what = f"rows {rows.tolist()[:8]}" if rows is not None else f"{wanted} rows"
                    raise DockTimeout(consumer, list(columns), what, float(timeout or 0))
                expiry = t.leases.next_deadline() - now  # a lease may hand rows back before then
                nap = min(left if left is not None else math.inf, expiry)
                t.cond.wait(None if math.isinf(nap) else max(nap, 0.0))
                now = time.monotonic()
            t.wait_s[k] += now - started
            granted = None
            if lease is None:
                self.mark_consumed(k, picked)
            else:
                granted = t.leases.grant(k, picked, lease, request.lease_key, now)
                self.count_delivery(k, picked)
            taken = replace(self.snapshot(columns, picked), lease=granted)
            t.bytes_got[k] += taken.nbytes()
        if sampler.kind == "balanced" and rows is None:
            try:
                taken = taken.reorder(balanced_order(taken.tokens_per_row(), sampler.num_ranks, group_size))
            except BaseException:
                self.untake(consumer, taken.rows, taken.lease, taken.nbytes())
                t.done_reading()
                raise
        return taken

    def check_fill(self, columns: Sequence[str], layout: str, padding: Padding) -> None:
        """InvalidArgumentError if a padded read's fill value does not fit a sequence column's dtype."""
        if layout != "padded" or padding.value == 0:
            return
        for name in columns:
            dtype = self.sequence_dtype(name)
            if dtype is not None:
                check_pad_value(padding, name, dtype)

    def sequence_dtype(self, name: str) -> torch.dtype | None:
        """The dtype of column `name` if it stores sequences (None: scalars, or not known yet)."""
        store = self.table.stores[name]
        return store.dtype if isinstance(store, SequenceColumn) else None

    def untake(self, consumer: str, rows: torch.Tensor, lease: Lease | None, nbytes: int) -> None:
        """Undo a get of `rows` (`nbytes` of data) that failed after the take: the rows become
        available again, and the get leaves no trace in the metrics (rows, bytes, gets)."""
        t = self.table
        k = t.consumer_index[consumer]
        delivered = rows.numel()
        with t.cond:
            if lease is not None:
                given_back = release(t, lease)  # 0 if another get expired it meanwhile
                t.leases.rows_returned[k] -= given_back  # not a return: the get never happened
            else:  # only rows still consumed: a clear may have emptied some since
                still = rows[t.consumed[k, rows]]
                t.consumed[k, still] = False
                t.num_consumed[k] -= still.numel()
                if still.numel():
                    t.watermark[k] = min(t.watermark[k], int(still.min()))
            t.rows_got[k] -= delivered
            t.bytes_got[k] -= nbytes
            t.counts["gets"] -= 1
            t.cond.notify_all()

    def receipt(self, consumer: str, rows: torch.Tensor, nbytes: int) -> str:
        """The dock's signature of a get's (consumer, rows, nbytes): what lets a client in another
        process give those rows back (`untake_signed`) after a failure on its side, and only those."""
        digest = hashlib.sha256(rows.numpy().tobytes()).hexdigest()
        return self.table.leases.sign("receipt", consumer, digest, nbytes)

    def untake_signed(
        self, consumer: str, rows: torch.Tensor, nbytes: int, lease: Lease | None, receipt: str
    ) -> None:
        """`untake` for a client whose get failed after the take, with the get's `receipt`."""
        rows = index_tensor(rows, "rows")
        if not isinstance(receipt, str) or not hmac.compare_digest(
            receipt, self.receipt(check_name("consumer", consumer), rows, nbytes)
        ):
            raise InvalidArgumentError("the receipt does not match the rows this dock handed out", "receipt")
        if lease is not None:
            self.table.leases.check_issued(check_lease("lease", lease))
        self.untake(consumer, rows, lease, nbytes)

    def snapshot(self, columns: Sequence[str], rows: torch.Tensor) -> Taken:
        """The table's snapshot of `rows` (see DockTable.snapshot)."""
        return self.table.snapshot(columns, rows)

    def check_counts(self, count: int, min_count: int | None, group_size: int, sampler: Sampler) -> int:
        """The fewest rows worth returning (`min_count`, default `count`), checked against the others
        (each is an int >= 1 already: see `get_request`)."""
        wanted = count if min_count is None else min_count
        if not 1 <= wanted <= count:
            raise InvalidArgumentError(
                f"min_count must be in [1, count={count}], got {min_count}", "min_count"
            )
        if count % group_size or wanted % group_size:
            raise GroupSizeError(
                f"in group mode count ({count}) and min_count ({wanted}) must be multiples of "
                f"n_samples_per_prompt ({group_size})"
            )
        num_ranks = sampler.num_ranks
        if sampler.kind == "balanced" and (count % (num_ranks * group_size) or wanted != count):
            raise InvalidArgumentError(
                f"the balanced sampler needs count ({count}) divisible by num_ranks ({num_ranks}) x "
                f"group size ({group_size}) and min_count == count",
                "sampler",
            )
        return wanted

    def finished_for(self, k: int) -> torch.Tensor | None:
        """bool [R] rows of finished groups, when consumer `k` may get only those now (unfinished rows
        exist and `k` is downstream of the rollout; see _partial); else None (no restriction)."""
        t = self.table
        if t.num_unfinished == 0 or t.consumers[k] == t.rollout_consumer:
            return None
        return finished_groups(t.live, t.completed, t.n_samples_per_prompt)

    def rollout_idle(self) -> bool:
        """The rollout has taken every row and holds none under a lease: no response is in flight."""
        t = self.table
        assert t.rollout_consumer is not None  # only asked while rows are unfinished
        r = t.consumer_index[t.rollout_consumer]
        return t.num_consumed[r] == t.num_live and not t.leases.num_leased[r]

    def consumer_done(self, k: int, finished: torch.Tensor | None) -> bool:
        """`k` has every row it will get this iteration (with partial rollout: every finished group's)."""
        t = self.table
        if finished is None:
            return t.num_live == t.num_consumed[k]
        return self.rollout_idle() and not bool((finished & ~t.consumed[k]).any())

    def rows_left(self, k: int, finished: torch.Tensor | None) -> int:
        """Rows `k` may still get this iteration (an upper bound while the rollout is still generating)."""
        t = self.table
        if finished is not None and self.rollout_idle():
            return int((finished & ~t.consumed[k] & ~t.leases.leased[k]).sum())
        return t.num_live - t.num_consumed[k] - t.leases.num_leased[k]

    def available_fn(self, k: int, col_ids: list[int], finished: torch.Tensor | None) -> Any:
        """(lo, hi) -> rows `k` may take; `finished` (see `finished_for`) keeps unfinished partial
        responses, and their groups, for the rollout only."""
        t = self.table
        leased = t.leases.leased[k] if t.leases.num_leased[k] else None
        ready, consumed = t.ready, t.consumed

        def available(lo: int, hi: int) -> torch.Tensor:
            mask = ready[col_ids[0], lo:hi] & ~consumed[k, lo:hi]
            if leased is not None:  # held for this consumer under a lease
                mask &= ~leased[lo:hi]
            for c in col_ids[1:]:
                mask &= ready[c, lo:hi]
            if finished is not None:
                mask &= finished[lo:hi]
            return mask

        return available

    def pick(
        self,
        k: int,
        col_ids: list[int],
        count: int,
        wanted: int,
        group_size: int,
        sampler: Sampler,
        finished: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """Rows for a get of `count` (at least `wanted`) whole units of `group_size`; None: not yet."""
        t = self.table
        remaining = self.rows_left(k, finished)
        if remaining <= 0:
            return None  # every row left is leased: wait for an ack (the end) or a return
        need_units = math.ceil(min(wanted, remaining) / group_size)
        max_units = count // group_size
        stop_after = None if sampler.kind == "random" else max_units
        available = self.available_fn(k, col_ids, finished)
        units = scan(available, t.watermark[k], t.capacity, group_size, stop_after)
        if units.numel() < need_units:
            return None
        if sampler.kind == "random" and units.numel() > max_units:
            pick = torch.randperm(units.numel(), generator=t.generators[k])[:max_units]
            units = units[pick.sort().values]
        return expand_units(units[:max_units], group_size)

    def pick_explicit(self, k: int, col_ids: list[int], rows: torch.Tensor) -> torch.Tensor | None:
        """`rows` once they are ready and not held under a lease; AlreadyConsumedError if one was taken."""
        t = self.table
        already = t.consumed[k, rows].nonzero()
        if already.numel():
            raise AlreadyConsumedError(t.consumers[k], int(rows[already[0, 0]]))
        if bool(t.ready[:, rows][col_ids].all()) and not bool(t.leases.leased[k, rows].any()):
            return rows
        return None  # not ready yet, or held under a lease that may still hand them back

    def mark_consumed(self, k: int, rows: torch.Tensor) -> None:
        t = self.table
        t.consumed[k].index_fill_(0, rows, True)
        t.num_consumed[k] += rows.numel()
        self.count_delivery(k, rows)
        t.advance_watermark(k)

    def count_delivery(self, k: int, rows: torch.Tensor) -> None:
        t = self.table
        t.rows_got[k] += rows.numel()
        t.counts["gets"] += 1
