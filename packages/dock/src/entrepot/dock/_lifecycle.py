"""What happens to a dock's rows between gets: clears, policy versions, finished groups, metrics.

Each function takes the dock's table (see _table) and holds its lock; ExperienceDock's methods of
the same names document them for callers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from entrepot.dock._checks import as_index_tensor
from entrepot.dock._columns import SequenceColumn
from entrepot.dock._errors import InvalidArgumentError
from entrepot.dock._partial import finished_groups, stale_groups
from entrepot.dock._table import DockTable


def clear(t: DockTable, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
    """Empty rows `indexes`, or every row but unfinished groups (see ExperienceDock.clear)."""
    rows = None if indexes is None else as_index_tensor(indexes, t.capacity)
    with t.cond:
        if rows is None:
            t.leases.forget_keys()  # a new iteration: keys of acked leases may be reused
            keep = _unfinished_groups(t)
            if keep is None:
                _drop_everything(t)
            else:
                _drop(t, t.live & ~keep)
                _age_kept(t, keep)
        else:
            drop = torch.zeros(t.capacity, dtype=torch.bool)
            drop[rows] = True
            _drop(t, drop & t.live)
        t.recount()
        t.cond.notify_all()


def set_policy_version(t: DockTable, version: int) -> int:
    """Set the policy version; with `max_staleness`, drop groups now too old (see ExperienceDock)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < t.policy_version:
        raise InvalidArgumentError(
            f"policy version must be an int >= the current one ({t.policy_version}), got {version!r}",
            "version",
        )
    with t.cond:
        t.policy_version = version
        if t.max_staleness is None:
            return 0
        n = t.n_samples_per_prompt
        stale = stale_groups(t.live, t.born, version, t.max_staleness, n)
        dropped = int(stale.sum())
        if dropped:
            _drop(t, stale)
            t.recount()
            t.rows_stale += dropped
            t.cond.notify_all()
        return dropped


def finished_rows(t: DockTable) -> torch.Tensor:
    """int64 rows of finished groups (none of their rows unfinished), ascending."""
    with t.cond:
        if t.rollout_consumer is None:
            return t.live.nonzero().squeeze(1)
        finished = finished_groups(t.live, t.completed, t.n_samples_per_prompt)
        return finished.nonzero().squeeze(1)


def metrics(t: DockTable) -> dict[str, float]:
    """Bytes stored, rows ready per column; rows, bytes and wait seconds per consumer; call counts."""
    with t.cond:
        out: dict[str, float] = {f"dock/{key}": float(value) for key, value in t.counts.items()}
        stored = allocated = 0
        for store in t.stores.values():
            if isinstance(store, SequenceColumn):
                stored += store.nbytes_live
            if store is not None:
                allocated += store.nbytes_allocated
        out["dock/bytes_stored"] = float(stored)
        out["dock/bytes_allocated"] = float(allocated)
        out["dock/rows_live"] = float(t.num_live)
        out["dock/rows_stale"] = float(t.rows_stale)
        out["dock/policy_version"] = float(t.policy_version)
        for name, ready in zip(t.columns, t.ready.sum(1).tolist(), strict=True):
            out[f"dock/rows_ready/{name}"] = float(ready)
        for k, name in enumerate(t.consumers):
            out[f"dock/rows_got/{name}"] = float(t.rows_got[k])
            out[f"dock/wait_s/{name}"] = t.wait_s[k]
            out[f"dock/bytes_got/{name}"] = float(t.bytes_got[k])
            out[f"dock/rows_leased/{name}"] = float(t.leases.num_leased[k])
            out[f"dock/rows_returned/{name}"] = float(t.leases.rows_returned[k])
            out[f"dock/leases_expired/{name}"] = float(t.leases.expired[k])
        return out


def _unfinished_groups(t: DockTable) -> torch.Tensor | None:
    """bool [R] rows of groups that hold an unfinished row, or None if there are none."""
    if t.rollout_consumer is None:
        return None
    unfinished = (t.live & ~t.completed).view(-1, t.n_samples_per_prompt).any(1)
    if not bool(unfinished.any()):
        return None
    return unfinished.repeat_interleave(t.n_samples_per_prompt)


def _drop_everything(t: DockTable) -> None:
    t.leases.forget(t.live | t.leases.leased.any(0))
    for store in t.stores.values():
        if isinstance(store, SequenceColumn):
            store.drop_all(reuse=t.readers == 0)
    t.ready.zero_()
    t.consumed.zero_()
    t.live.zero_()
    t.age.zero_()
    t.completed.fill_(True)
    t.born.fill_(-1)


def _drop(t: DockTable, drop: torch.Tensor) -> None:
    t.leases.forget(drop)
    rows = drop.nonzero().squeeze(1)
    for store in t.stores.values():
        if isinstance(store, SequenceColumn):
            store.forget(rows)
    t.ready[:, rows] = False
    t.consumed[:, rows] = False
    t.live[rows] = False
    t.age[rows] = 0
    t.completed[rows] = True
    t.born[rows] = -1


def _age_kept(t: DockTable, keep: torch.Tensor) -> None:
    t.leases.forget(keep)
    rows = keep.nonzero().squeeze(1)
    t.age[rows] += 1
    t.consumed[:, rows] = False
    assert t.rollout_consumer is not None  # only called with partial rollout
    k = t.consumer_index[t.rollout_consumer]
    t.consumed[k, rows] = t.completed[rows]  # finished rows do not go back to the rollout
