"""ExperienceDock: the rows x columns store between rollout and training.

State (capacity R rows, C columns, K consumers), held by a `DockTable` (_table.py):
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

The dock composes its parts, each a module that takes the table: the put path (_put), the get
path's selection (_take), acks and releases (_acks), clears and metrics (_lifecycle), and the
state_dict's capture, checks and install (_state, _state_check).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from entrepot.dock import _acks, _lifecycle, _put, _state
from entrepot.dock._batch import Batch, Layout, build_batch
from entrepot.dock._checks import check_rows, get_request, peek_request
from entrepot.dock._columns import ColumnSpec
from entrepot.dock._errors import DockConfigError, DockStateError, NotReadyError
from entrepot.dock._files import read_verified, write_verified
from entrepot.dock._leases import Lease
from entrepot.dock._options import FIFO, ZERO_PADDING, Padding, Sampler
from entrepot.dock._table import DockTable
from entrepot.dock._take import RowTaker


class ExperienceDock:
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
        self._table = DockTable(
            capacity, specs, consumers, n_samples_per_prompt=n_samples_per_prompt, seed=seed,
            rollout_consumer=rollout_consumer, max_age=max_age, max_staleness=max_staleness,
            group_gets=group_gets,
        )  # fmt: skip
        self._taker = RowTaker(self._table)

    # ------------------------------------------------------------------ settings (fixed when built)

    @property
    def capacity(self) -> int:
        return self._table.capacity

    @property
    def n_samples_per_prompt(self) -> int:
        return self._table.n_samples_per_prompt

    @property
    def columns(self) -> list[str]:
        return self._table.columns

    @property
    def consumers(self) -> list[str]:
        return self._table.consumers

    @property
    def seed(self) -> int:
        return self._table.seed

    @property
    def rollout_consumer(self) -> str | None:
        return self._table.rollout_consumer

    @property
    def max_age(self) -> int | None:
        return self._table.max_age

    @property
    def max_staleness(self) -> int | None:
        return self._table.max_staleness

    @property
    def group_gets(self) -> bool:
        return self._table.group_gets

    @property
    def policy_version(self) -> int:
        """The version set by `set_policy_version` (0 until then)."""
        return self._table.policy_version

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
            DockError subclass naming the column, index or argument; nothing is stored when it
            raises (`DockMemoryError` included: every column's memory is allocated before any
            cell is marked ready).
        """
        _put.put(self._table, data, indexes, lengths=lengths, completed=completed, ack=ack)

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
        layout: Layout = "padded",
        lease: float | None = None,
        lease_key: str | None = None,
        sampler: Sampler = FIFO,
        padding: Padding = ZERO_PADDING,
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
            timeout: seconds to wait (>= 0); None or ``math.inf`` waits forever; on expiry raises
                DockTimeout, taking nothing.
            groups: take whole prompt groups of n_samples_per_prompt rows (default: the dock's `group_gets`).
            layout: "padded" (TensorDict [B, L_c] + lengths) or "packed" (flat [T_c] + lengths / cu_seqlens).
            lease: hold the rows for `lease` seconds (``math.inf``: no expiry) instead of marking
                them consumed: `ack` makes them consumed; on `release` or expiry they return to the
                pool, so a consumer that dies after the get loses nothing. None: consumed at once.
            lease_key: with `lease`, makes the get idempotent: while a lease taken with this key
                holds rows, the same rows come back (renewed) instead of new ones, e.g. for a task
                that Ray retries; once that lease is acked in full, the get returns None.
            sampler: which rows and in what order: FIFO by default, or `Sampler(kind="random")`
                (seeded per consumer, saved in state_dict), or `Sampler(kind="balanced",
                num_ranks=R)` (FIFO rows reordered so `batch.split(R)` gives DP ranks equal tokens).
            padding: fill value and width multiple of the padded layout, e.g.
                `Padding(value=-1, multiple=4)` (default: zeros, to the longest row).

        Returns:
            The batch (with `batch.lease` set under a lease), or None when `consumer` has received
            (and, under leases, acked) every row the dock holds.

        A get that raises takes nothing: every argument is checked before any row is taken (see
        _checks: counts are ints, never bools; seconds are never NaN; the padding value fits each
        padded column's dtype), and rows it had picked go back, uncounted, if laying them out fails.
        """
        request = get_request(
            consumer, columns, count, indexes=indexes, min_count=min_count, timeout=timeout, groups=groups,
            layout=layout, lease=lease, lease_key=lease_key, sampler=sampler, padding=padding,
        )  # fmt: skip
        taken = self._taker.take(request)
        if taken is None:
            return None
        try:
            raw = taken.gather(layout)
            batch = build_batch(taken.rows, raw, taken.ages, layout, padding.value, padding.multiple)
        except BaseException:
            self._taker.untake(consumer, taken.rows, taken.lease, taken.nbytes())
            raise
        finally:
            self._table.done_reading()
        return batch if taken.lease is None else replace(batch, lease=taken.lease)

    def peek(
        self,
        columns: Sequence[str],
        indexes: Sequence[int] | torch.Tensor,
        *,
        layout: Layout = "padded",
        padding: Padding = ZERO_PADDING,
    ) -> Batch:
        """Read ready cells without consuming them (e.g. the partial responses a rollout continues)."""
        names, index_rows = peek_request(columns, indexes, layout, padding)
        t = self._table
        col_ids = t.check_columns(names)
        rows = check_rows(index_rows, t.capacity)
        with t.cond:
            self._taker.check_fill(names, layout, padding)
            for name, c in zip(names, col_ids, strict=True):
                missing = (~t.ready[c, rows]).nonzero()
                if missing.numel():
                    raise NotReadyError(name, int(rows[missing[0, 0]]))
            taken = t.snapshot(names, rows)
        try:
            raw = taken.gather(layout)
            return build_batch(taken.rows, raw, taken.ages, layout, padding.value, padding.multiple)
        finally:
            t.done_reading()

    # ------------------------------------------------------------------ leases

    def ack(self, lease: Lease, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        """Mark the rows `lease` holds (or `indexes` of them) consumed: they will not come back.

        Raises:
            LeaseError: this dock did not issue the lease as given (forged, another dock's, or its
                consumer changed), or it expired, was released or acked, or does not hold a named row.
        """
        _acks.ack(self._table, lease, indexes)

    def release(self, lease: Lease) -> int:
        """Hand the rows `lease` still holds back to the pool now; how many (0 if it holds none).

        Raises:
            LeaseError: this dock did not issue the lease as given (a settled one it did issue: 0).
        """
        return _acks.release(self._table, lease)

    # ------------------------------------------------------------------ lifecycle

    def all_consumed(self, consumer: str) -> bool:
        """True when `consumer` has received every row that holds data (vacuously True on an empty dock)."""
        t = self._table
        k = t.check_consumer(consumer)
        with t.cond:
            return t.num_consumed[k] == t.num_live

    def progress(self, consumer: str) -> dict[str, int]:
        """`consumed` and `live` row counts of one consumer (`live`: rows holding data)."""
        t = self._table
        k = t.check_consumer(consumer)
        with t.cond:
            return {"consumed": t.num_consumed[k], "live": t.num_live}

    def clear(self, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        """Empty rows: `indexes`, or every row (then, with partial rollout, unfinished groups stay).

        Kept groups age by one and go back to the rollout consumer for their unfinished rows; every
        other consumer sees them again once they complete. Leases on emptied or kept rows end (an ack
        of them raises `LeaseError`).
        """
        _lifecycle.clear(self._table, indexes)

    def set_policy_version(self, version: int) -> int:
        """The policy generates as `version` from now on (rows first put from now on are born under it).

        With `max_staleness`, groups holding a row born more than `max_staleness` versions before
        `version` are dropped (their leases end); returns how many rows were dropped.
        """
        return _lifecycle.set_policy_version(self._table, version)

    def finished_rows(self) -> torch.Tensor:
        """int64 rows of finished groups (none of their rows unfinished), ascending: what downstream
        consumers get this iteration once the rollout is done."""
        return _lifecycle.finished_rows(self._table)

    def reset(self) -> None:
        """Back to the freshly built state: no rows, learned column dtypes forgotten, samplers reseeded."""
        with self._table.cond:
            self._table.reset()
            self._table.cond.notify_all()

    def metrics(self) -> dict[str, float]:
        """Bytes stored, rows ready per column; rows, bytes and wait seconds per consumer; call counts.

        Per-consumer figures are cumulative since construction or `reset` (a caller takes deltas per step).
        """
        return _lifecycle.metrics(self._table)

    # ------------------------------------------------------------------ state and files

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: rows (compacted), bitmaps, ages, sampler states, counters."""
        with self._table.cond:
            return _state.capture(self._table)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict()` taken from a dock built with the same capacity, columns and consumers.

        The whole state is checked first (`DockStateError` on anything wrong); a state that fails
        leaves this dock exactly as it was.
        """
        self._install(_state.stage(self._table, state, "dock state_dict"))

    def save(self, path: str | os.PathLike[str]) -> None:
        """`state_dict()` to a file, atomically; then ``<path>.manifest.json`` (size, sha256), last."""
        state = self.state_dict()
        write_verified(path, lambda file: torch.save(state, file))

    def load(self, path: str | os.PathLike[str]) -> None:
        """`load_state_dict()` from a file written by `save`, verified against its manifest first.

        Raises `DockStateError` (naming the file) for a missing or mismatching manifest, a truncated or
        corrupt file, or a state that does not fit this dock; the dock is then unchanged.
        """
        source = f"dock file {str(path)!r}"
        data = read_verified(path, source)
        try:
            state = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as error:  # any failure to deserialise verified bytes: not a dock file
            raise DockStateError(source, f"is not a dock state ({type(error).__name__}: {error})") from error
        self._install(_state.stage(self._table, state, source))

    def _install(self, staged: _state.Staged) -> None:
        with self._table.cond:
            _state.install(self._table, staged)
            self._table.cond.notify_all()
