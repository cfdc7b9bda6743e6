"""Acks and releases: what ends a lease, making its rows consumed or handing them back.

A leased get holds rows for its consumer without marking them consumed (see _leases). `ack` (or a
put with `ack=`) marks them consumed; `release` hands them back to the pool now, as expiry does
later. Each call takes the dock's table and holds its lock.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from entrepot.dock._checks import check_lease, check_rows, index_tensor
from entrepot.dock._errors import LeaseError
from entrepot.dock._leases import Lease
from entrepot.dock._table import DockTable


def ack(t: DockTable, lease: Lease, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
    """Mark the rows `lease` holds (or `indexes` of them) consumed: they will not come back.

    Raises:
        LeaseError: this dock did not issue the lease as given, or it expired, was released or
            acked, or does not hold a named row.
    """
    check_lease("lease", lease)
    rows = None if indexes is None else check_rows(index_tensor(indexes), t.capacity)
    with t.cond:
        t.leases.check_issued(lease)
        t.leases.expire(time.monotonic())
        ack_rows(t, lease, t.leases.held_rows(lease, rows))
        t.cond.notify_all()


def release(t: DockTable, lease: Lease) -> int:
    """Hand the rows `lease` still holds back to the pool now; how many (0 if it holds none).

    Raises:
        LeaseError: this dock did not issue the lease as given (a settled one it issued returns 0).
    """
    check_lease("lease", lease)
    with t.cond:
        t.leases.check_issued(lease)
        t.leases.expire(time.monotonic())
        try:
            rows = t.leases.held_rows(lease, None)
        except LeaseError:
            return 0
        t.leases.settle(lease, rows, returned=True)
        t.cond.notify_all()
        return int(rows.numel())


def ack_rows(t: DockTable, lease: Lease, rows: torch.Tensor) -> None:
    """Settle `rows` of `lease` as consumed (called with the lock held, the rows checked held)."""
    k = t.consumer_index[lease.consumer]
    t.leases.settle(lease, rows, returned=False)
    t.consumed[k, rows] = True
    t.num_consumed[k] += rows.numel()
    t.advance_watermark(k)
