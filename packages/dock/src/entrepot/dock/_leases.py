"""Leases: rows a get handed out that go back to the pool unless their consumer acks them in time.

A leased get does not mark its rows consumed. The rows are held for the consumer (no other reader of
that consumer takes them) until it acks them (they become consumed), releases them, or the lease
expires (both put them back, ready for the next get). So a consumer that dies after a get loses
nothing: its rows come back. A `key` makes a get idempotent: a retried task that asks again with the
same key gets the rows it already holds instead of taking new ones.

A lease is bound to its consumer: its `token` signs (id, consumer, seconds, key) with a secret of
the dock that issued it (HMAC-SHA256), so an ack, put or release that names a forged lease, another
dock's, or one relabelled to another consumer is refused with `LeaseError` before anything changes.
A plain dataclass that crosses Ray as it is, it cannot be guessed from its id (a counter).

`LeaseTable` is the bookkeeping only; the dock calls it with its lock held.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from entrepot.dock._errors import LeaseError
from entrepot.dock.signing import sign, signed

ACKED = -1
"""`LeaseTable.reissue` result for a key whose lease was acked in full: nothing left to hand out."""


@dataclass(frozen=True)
class Lease:
    """A handle on rows handed to one consumer: ack them once their outputs are stored.

    Attributes:
        id: unique within the process (a counter, across resets): `token` is what cannot be guessed.
        consumer: who holds the rows.
        seconds: how long the rows are held without an ack (``math.inf``: until ack or release).
        key: the caller's idempotency key, if the get gave one.
        token: the issuing dock's signature of the fields above (see the module docstring).
    """

    id: int
    consumer: str
    seconds: float
    key: str | None = None
    token: str = field(default="", repr=False)


@dataclass
class _Held:
    lease: Lease
    k: int
    rows: torch.Tensor  # int64: the rows still held (acked or returned rows leave)
    deadline: float


_IDS = itertools.count(1)  # process-wide, so a stale lease never matches one granted after a reset


class LeaseTable:
    """Which rows each consumer holds under which lease, and until when."""

    def __init__(self, consumers: list[str], capacity: int, secret: bytes) -> None:
        self.consumers = consumers
        self._secret = secret  # the dock's: a lease issued before a reset still verifies after it
        self.leased = torch.zeros(len(consumers), capacity, dtype=torch.bool)
        self.num_leased = [0] * len(consumers)
        self.rows_returned = [0] * len(consumers)  # rows back in the pool after an expiry or release
        self.expired = [0] * len(consumers)  # leases that ran out
        self._held: dict[int, _Held] = {}
        self._keys: dict[tuple[int, str], int] = {}  # (consumer, key) -> lease id, or ACKED

    def sign(self, *fields: Any) -> str:
        """The dock's signature of `fields` (their repr): a lease's token, a get's receipt."""
        return sign(self._secret, *fields)

    def check_issued(self, lease: Lease) -> None:
        """`LeaseError` unless this dock issued `lease` exactly as it is (any consumer, live or not)."""
        if not signed(self._secret, lease.token, lease.id, lease.consumer, lease.seconds, lease.key):
            reason = (
                "this dock did not issue it as given (forged, another dock's, or its consumer, seconds "
                "or key changed)"
            )
            raise LeaseError(lease.id, lease.consumer, reason)

    def grant(self, k: int, rows: torch.Tensor, seconds: float, key: str | None, now: float) -> Lease:
        """Hold `rows` for consumer `k` under a new lease."""
        lease_id, consumer = next(_IDS), self.consumers[k]
        lease = Lease(lease_id, consumer, seconds, key, self.sign(lease_id, consumer, seconds, key))
        self._held[lease.id] = _Held(lease, k, rows.clone(), now + seconds)
        self.leased[k, rows] = True
        self.num_leased[k] += rows.numel()
        if key is not None:
            self._keys[(k, key)] = lease.id
        return lease

    def reissue(
        self, k: int, key: str, seconds: float, now: float
    ) -> tuple[Lease, torch.Tensor] | int | None:
        """A live lease under `key`, renewed (with its rows); ACKED if it was acked in full; else None."""
        found = self._keys.get((k, key))
        if found is None:
            return None
        if found == ACKED:
            return ACKED
        held = self._held.get(found)
        if held is None:  # expired or released: its rows are back in the pool
            del self._keys[(k, key)]
            return None
        held.deadline = now + seconds
        return held.lease, held.rows

    def extend(self, lease: Lease, deadline: float) -> None:
        """Keep `lease` (checked live by `held_rows`) from expiring before `deadline`."""
        held = self._held[lease.id]
        held.deadline = max(held.deadline, deadline)

    def expire(self, now: float) -> int:
        """Return the rows of every lease past its deadline to the pool; the number of rows returned."""
        returned = 0
        for held in [held for held in self._held.values() if held.deadline <= now]:
            self.expired[held.k] += 1
            returned += held.rows.numel()
            self.settle(held.lease, held.rows, returned=True)
        return returned

    def next_deadline(self) -> float:
        """The earliest deadline of any lease (math.inf if none can expire)."""
        return min((held.deadline for held in self._held.values()), default=math.inf)

    def held_rows(self, lease: Lease, rows: torch.Tensor | None) -> torch.Tensor:
        """`rows` (default: all) after checking this dock issued `lease` and it still holds each of
        them; else `LeaseError`."""
        self.check_issued(lease)
        held = self._held.get(lease.id)
        if held is None:
            reason = "it expired, was released or acked, or its rows were cleared"
            raise LeaseError(lease.id, lease.consumer, reason)
        if rows is None:
            return held.rows
        missing = (~torch.isin(rows, held.rows)).nonzero()
        if missing.numel():
            row = int(rows[missing[0, 0]])
            reason = f"it does not hold row {row} (never leased to it, or acked or returned already)"
            raise LeaseError(lease.id, lease.consumer, reason)
        return rows

    def settle(self, lease: Lease, rows: torch.Tensor, returned: bool) -> None:
        """Take `rows` (checked by `held_rows`) off `lease`: acked, or `returned` to the pool."""
        held = self._held[lease.id]
        self.leased[held.k, rows] = False
        self.num_leased[held.k] -= rows.numel()
        if returned:
            self.rows_returned[held.k] += rows.numel()
        held.rows = held.rows[~torch.isin(held.rows, rows)]
        if not held.rows.numel():
            del self._held[lease.id]
            if lease.key is not None and returned:  # a retry with the key takes rows anew
                self._keys.pop((held.k, lease.key), None)
            elif lease.key is not None:  # acked in full: a retry with the key has nothing left to do
                self._keys[(held.k, lease.key)] = ACKED

    def forget(self, drop: torch.Tensor) -> None:
        """Rows `drop` (bool [R]) left the dock or start over (clear): no lease holds them any more."""
        for held in list(self._held.values()):
            gone = held.rows[drop[held.rows]]
            if gone.numel():
                self.settle(held.lease, gone, returned=True)
                self.rows_returned[held.k] -= gone.numel()  # cleared, not handed back

    def forget_keys(self) -> None:
        """Forget the keys of acked leases (a new iteration may reuse them); live leases keep theirs."""
        live = {(held.k, held.lease.key) for held in self._held.values() if held.lease.key is not None}
        self._keys = {pair: found for pair, found in self._keys.items() if pair in live}
