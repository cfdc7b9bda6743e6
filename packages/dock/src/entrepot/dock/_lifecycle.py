"""Lifecycle half of ExperienceDock: consumption status, clear / reset, metrics, state and files.

Kept apart from the put/get half (_dock.py); it works on the same state, declared below.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from entrepot.dock import _state
from entrepot.dock._columns import ColumnSpec, ScalarColumn, SequenceColumn
from entrepot.dock._errors import DockStateError, InvalidArgumentError
from entrepot.dock._files import read_verified, write_verified
from entrepot.dock._inputs import as_index_tensor
from entrepot.dock._leases import LeaseTable
from entrepot.dock._partial import finished_groups, stale_groups


class DockLifecycle:
    """all_consumed, progress, clear, reset, metrics, state_dict / load_state_dict, save / load."""

    capacity: int
    n_samples_per_prompt: int
    columns: list[str]
    consumers: list[str]
    rollout_consumer: str | None
    max_staleness: int | None
    policy_version: int
    _specs: dict[str, ColumnSpec]
    _column_index: dict[str, int]
    _consumer_index: dict[str, int]
    _cond: threading.Condition
    _stores: dict[str, SequenceColumn | ScalarColumn | None]
    _ready: torch.Tensor
    _consumed: torch.Tensor
    _live: torch.Tensor
    _age: torch.Tensor
    _completed: torch.Tensor
    _born: torch.Tensor
    _rows_stale: int
    _num_unfinished: int
    _num_live: int
    _num_consumed: list[int]
    _watermark: list[int]
    _counts: dict[str, int]
    _rows_got: list[int]
    _wait_s: list[float]
    _bytes_got: list[int]
    _readers: int
    _generators: list[torch.Generator]
    _leases: LeaseTable

    def _check_consumer(self, consumer: str) -> int:
        raise NotImplementedError

    def _init_state(self) -> None:
        raise NotImplementedError

    def all_consumed(self, consumer: str) -> bool:
        """True when `consumer` has received every row that holds data (vacuously True on an empty dock)."""
        k = self._check_consumer(consumer)
        with self._cond:
            return self._num_consumed[k] == self._num_live

    def progress(self, consumer: str) -> dict[str, int]:
        """`consumed` and `live` row counts of one consumer (`live`: rows holding data)."""
        k = self._check_consumer(consumer)
        with self._cond:
            return {"consumed": self._num_consumed[k], "live": self._num_live}

    def clear(self, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        """Empty rows: `indexes`, or every row (then, with partial rollout, unfinished groups stay).

        Kept groups age by one and go back to the rollout consumer for their unfinished rows; every
        other consumer sees them again once they complete. Leases on emptied or kept rows end (an ack
        of them raises `LeaseError`).
        """
        rows = None if indexes is None else as_index_tensor(indexes, self.capacity)
        with self._cond:
            if rows is None:
                self._leases.forget_keys()  # a new iteration: keys of acked leases may be reused
                keep = self._unfinished_groups()
                if keep is None:
                    self._drop_everything()
                else:
                    self._drop(self._live & ~keep)
                    self._age_kept(keep)
            else:
                drop = torch.zeros(self.capacity, dtype=torch.bool)
                drop[rows] = True
                self._drop(drop & self._live)
            self._recount()
            self._cond.notify_all()

    def set_policy_version(self, version: int) -> int:
        """The policy generates as `version` from now on (rows first put from now on are born under it).

        With `max_staleness`, groups holding a row born more than `max_staleness` versions before
        `version` are dropped (their leases end); returns how many rows were dropped.
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < self.policy_version:
            raise InvalidArgumentError(
                f"policy version must be an int >= the current one ({self.policy_version}), got {version!r}"
            )
        with self._cond:
            self.policy_version = version
            if self.max_staleness is None:
                return 0
            n = self.n_samples_per_prompt
            stale = stale_groups(self._live, self._born, version, self.max_staleness, n)
            dropped = int(stale.sum())
            if dropped:
                self._drop(stale)
                self._recount()
                self._rows_stale += dropped
                self._cond.notify_all()
            return dropped

    def finished_rows(self) -> torch.Tensor:
        """int64 rows of finished groups (none of their rows unfinished), ascending: what downstream
        consumers get this iteration once the rollout is done."""
        with self._cond:
            if self.rollout_consumer is None:
                return self._live.nonzero().squeeze(1)
            finished = finished_groups(self._live, self._completed, self.n_samples_per_prompt)
            return finished.nonzero().squeeze(1)

    def _unfinished_groups(self) -> torch.Tensor | None:
        """bool [R] rows of groups that hold an unfinished row, or None if there are none."""
        if self.rollout_consumer is None:
            return None
        unfinished = (self._live & ~self._completed).view(-1, self.n_samples_per_prompt).any(1)
        if not bool(unfinished.any()):
            return None
        return unfinished.repeat_interleave(self.n_samples_per_prompt)

    def _drop_everything(self) -> None:
        self._leases.forget(self._live | self._leases.leased.any(0))
        for store in self._stores.values():
            if isinstance(store, SequenceColumn):
                store.drop_all(reuse=self._readers == 0)
        self._ready.zero_()
        self._consumed.zero_()
        self._live.zero_()
        self._age.zero_()
        self._completed.fill_(True)
        self._born.fill_(-1)

    def _drop(self, drop: torch.Tensor) -> None:
        self._leases.forget(drop)
        rows = drop.nonzero().squeeze(1)
        for store in self._stores.values():
            if isinstance(store, SequenceColumn):
                store.forget(rows)
        self._ready[:, rows] = False
        self._consumed[:, rows] = False
        self._live[rows] = False
        self._age[rows] = 0
        self._completed[rows] = True
        self._born[rows] = -1

    def _age_kept(self, keep: torch.Tensor) -> None:
        self._leases.forget(keep)
        rows = keep.nonzero().squeeze(1)
        self._age[rows] += 1
        self._consumed[:, rows] = False
        assert self.rollout_consumer is not None  # only called with partial rollout
        k = self._consumer_index[self.rollout_consumer]
        self._consumed[k, rows] = self._completed[rows]  # finished rows do not go back to the rollout

    def _recount(self) -> None:
        self._num_live = int(self._live.sum())
        self._num_consumed = [int(n) for n in self._consumed.sum(1).tolist()]
        self._num_unfinished = int((self._live & ~self._completed).sum())
        self._watermark = [0] * len(self.consumers)

    def reset(self) -> None:
        """Back to the freshly built state: no rows, learned column dtypes forgotten, samplers reseeded."""
        with self._cond:
            self._init_state()
            self._cond.notify_all()

    def metrics(self) -> dict[str, float]:
        """Bytes stored, rows ready per column; rows, bytes and wait seconds per consumer; call counts.

        Per-consumer figures are cumulative since construction or `reset` (a caller takes deltas per step).
        """
        with self._cond:
            out: dict[str, float] = {f"dock/{key}": float(value) for key, value in self._counts.items()}
            stored = allocated = 0
            for store in self._stores.values():
                if isinstance(store, SequenceColumn):
                    stored += store.nbytes_live
                if store is not None:
                    allocated += store.nbytes_allocated
            out["dock/bytes_stored"] = float(stored)
            out["dock/bytes_allocated"] = float(allocated)
            out["dock/rows_live"] = float(self._num_live)
            out["dock/rows_stale"] = float(self._rows_stale)
            out["dock/policy_version"] = float(self.policy_version)
            for name, ready in zip(self.columns, self._ready.sum(1).tolist(), strict=True):
                out[f"dock/rows_ready/{name}"] = float(ready)
            for k, name in enumerate(self.consumers):
                out[f"dock/rows_got/{name}"] = float(self._rows_got[k])
                out[f"dock/wait_s/{name}"] = self._wait_s[k]
                out[f"dock/bytes_got/{name}"] = float(self._bytes_got[k])
                out[f"dock/rows_leased/{name}"] = float(self._leases.num_leased[k])
                out[f"dock/rows_returned/{name}"] = float(self._leases.rows_returned[k])
                out[f"dock/leases_expired/{name}"] = float(self._leases.expired[k])
            return out

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: rows (compacted), bitmaps, ages, sampler states, counters."""
        with self._cond:
            return _state.capture(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict()` taken from a dock built with the same capacity, columns and consumers.

        The whole state is checked first (`DockStateError` on anything wrong); a state that fails
        leaves this dock exactly as it was.
        """
        self._install(_state.stage(self, state, "dock state_dict"))

    def _install(self, staged: _state.Staged) -> None:
        with self._cond:
            _state.install(self, staged)
            self._cond.notify_all()

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
        self._install(_state.stage(self, state, source))
