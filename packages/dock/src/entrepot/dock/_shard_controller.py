"""ShardController: the statuses of every row of a sharded dock, in one Ray actor (extra `ray`).

It holds a `Ledger` (see _ledger): one dock's bookkeeping over row lengths, so every guarantee is
one dock's code. Clients ask it to fix a put's column dtypes, commit a put's cells ready, take a
get's rows (their own node's first) and run the control calls; it never sees a row's data.
"""

from __future__ import annotations

from typing import Any

import ray
import torch

from entrepot.dock import _link
from entrepot.dock._checks import GetRequest, check_lease, check_rows, checked_again, peek_request
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import InvalidArgumentError, NotReadyError
from entrepot.dock._leases import Lease
from entrepot.dock._ledger import Kind, Ledger

COMMIT_WINDOW_S = 60.0
"""How long a put that acks a lease keeps the lease from expiring while it writes to the shards."""

_LINKED = frozenset({"prepare_put", "commit_put", "abort_put", "take", "untake", "call"})
"""The methods a same-node client may call over its link (see `attach_link`)."""

_CALLS = frozenset(
    {
        "ack", "release", "all_consumed", "progress", "finished_rows", "set_policy_version", "clear",
        "reset", "metrics", "check_ready", "claim_groups", "release_groups", "state", "load_state", "kinds",
    }
)  # fmt: skip


class ShardController:
    """The statuses of every row (a `Ledger`); a plain class made a Ray actor by `ShardedDockClient`."""

    def __init__(
        self, dock_cls: type[ExperienceDock], dock_kwargs: dict[str, Any], shard_of_group: torch.Tensor,
        shard_nodes: list[str],
    ) -> None:  # fmt: skip
        torch.set_num_threads(1)
        self._ledger = Ledger(dock_cls(**dock_kwargs), shard_of_group)
        self._shard_nodes = shard_nodes
        self._local_rows: dict[str | None, torch.Tensor | None] = {}

    @ray.method(concurrency_group="ctl")
    def prepare_put(
        self, kinds: dict[str, Kind], rows: torch.Tensor, ack: Lease | None
    ) -> tuple[dict[str, Kind], list[str]]:
        """Check a put's lease, then its column kinds (one dock's order), and fix its column dtypes:
        (every column's stored kind, the columns this put fixed). `commit_put` or `abort_put` follows.

        A put refused here changes nothing: the lease is checked before any dtype is fixed, and is
        kept from expiring only once the put is accepted.
        """
        ledger = self._ledger
        with ledger._table.cond:
            if ack is not None:
                ledger.check_lease(check_lease("ack", ack), rows)
            fixed = ledger.kinds.fix(kinds)
            if ack is not None:
                ledger.pin(ack, COMMIT_WINDOW_S)
        return fixed

    @ray.method(concurrency_group="ctl")
    def commit_put(
        self, lengths: dict[str, torch.Tensor], rows: torch.Tensor, completed: torch.Tensor | None,
        ack: Lease | None, claimed: bool,
    ) -> None:  # fmt: skip
        """Mark the cells of a put ready (the shards hold its data now)."""
        ledger = self._ledger
        try:
            ledger.put(lengths, rows, completed=completed, ack=ack)
        finally:
            with ledger._table.cond:
                ledger.kinds.done(list(lengths), [], ledger._table.ready)
            if claimed:
                ledger.release_groups(rows)

    @ray.method(concurrency_group="ctl")
    def abort_put(self, names: list[str], fixed: list[str]) -> None:
        """A put that `prepare_put` accepted failed before its commit (no memory for its buffers, a
        shard lost): forget the column kinds it fixed, as one dock's failed put fixes none."""
        ledger = self._ledger
        with ledger._table.cond:
            ledger.kinds.done(names, fixed, ledger._table.ready)

    @ray.method(concurrency_group="take")
    def take(
        self, request: GetRequest, node: str | None
    ) -> tuple[torch.Tensor, torch.Tensor, Lease | None, tuple[int, str]] | None:
        """Select and mark rows for a get (rows on `node` first): (rows, ages, lease, (nbytes,
        receipt)), or None when done. The receipt lets the client give the rows back (`untake`)."""
        taker = self._ledger._taker
        request = checked_again(request)
        taken = taker.take_preferring(self._rows_on(node), request)
        if taken is None:
            return None
        self._ledger._table.done_reading()  # the ledger's "data" (lengths) were copied by the snapshot
        nbytes = taken.nbytes()
        return (
            taken.rows,
            taken.ages,
            taken.lease,
            (nbytes, taker.receipt(request.consumer, taken.rows, nbytes)),
        )

    @ray.method(concurrency_group="ctl")
    def untake(
        self, consumer: str, rows: torch.Tensor, nbytes: int, lease: Lease | None, receipt: str
    ) -> None:
        """Give back the rows of a get that failed after `take` (a shard lost, no memory for the batch)."""
        self._ledger._taker.untake_signed(consumer, rows, nbytes, lease, receipt)

    @ray.method(concurrency_group="ctl")
    def attach_link(self, name: str) -> None:
        """Serve a same-node client's calls over its socket `name` (see _link), each one of `_LINKED`
        run as the method of that name; the serving thread ends when the client goes."""
        _link.Server(_link.connect(name), self._link_call, lambda: None)

    def _link_call(self, message: tuple[str, tuple[Any, ...]]) -> Any:
        method, args = message
        if method not in _LINKED:
            raise InvalidArgumentError(f"sharded dock controller has no linked call {method!r}")
        return getattr(self, method)(*args)

    @ray.method(concurrency_group="ctl")
    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        """Run one of the controller's calls (`_CALLS`); anything else is an `InvalidArgumentError`."""
        if method not in _CALLS:
            raise InvalidArgumentError(f"sharded dock controller has no call {method!r}")
        if method in ("clear", "set_policy_version"):
            return self._dropping(method, *args)
        if method == "check_ready":
            return self._check_ready(*args)
        if method == "state":
            return self._ledger.state_dict(), self._ledger.kinds.known()
        if method == "load_state":
            return self._load_state(*args)
        if method == "kinds":
            return self._ledger.kinds.known()
        return getattr(self._ledger, method)(*args)

    def _dropping(self, method: str, *args: Any) -> tuple[Any, torch.Tensor]:
        """(result, rows that left the dock) of clear / set_policy_version, for the shards to forget."""
        t = self._ledger._table
        with t.cond:
            before = t.live.clone()
            result = getattr(self._ledger, method)(*args)
            return result, (before & ~t.live).nonzero().squeeze(1)

    def _check_ready(self, columns: Any, indexes: Any, layout: Any, padding: Any) -> torch.Tensor:
        """The ages of rows `indexes` once every cell is ready, else `NotReadyError` naming one (a peek).

        Checked as in one dock: the arguments, then the columns before the indexes, then the fill."""
        t = self._ledger._table
        columns, rows = peek_request(columns, indexes, layout, padding)
        col_ids = t.check_columns(columns)
        rows = check_rows(rows, t.capacity)
        with t.cond:
            self._ledger._taker.check_fill(columns, layout, padding)
            for name, c in zip(columns, col_ids, strict=True):
                missing = (~t.ready[c, rows]).nonzero()
                if missing.numel():
                    raise NotReadyError(name, int(rows[missing[0, 0]]))
            return t.age[rows].clone()

    def _load_state(self, state: dict[str, Any], kinds: dict[str, Kind]) -> None:
        self._ledger.load_state_dict(state)
        self._ledger.kinds.reset()
        self._ledger.kinds.fix(kinds)
        self._ledger.kinds.reset_pending()

    def _rows_on(self, node: str | None) -> torch.Tensor | None:
        """bool [capacity] rows whose shard runs on `node` (None: no shard there, or all are there)."""
        if node not in self._local_rows:
            shards = [s for s, where in enumerate(self._shard_nodes) if where == node]
            if not shards or len(shards) == len(self._shard_nodes):
                self._local_rows[node] = None
            else:
                ledger = self._ledger
                local = torch.isin(ledger.shard_of_group, torch.tensor(shards))
                self._local_rows[node] = local.repeat_interleave(ledger.n_samples_per_prompt)
        return self._local_rows[node]
