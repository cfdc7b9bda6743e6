"""The bookkeeping of a sharded dock: an ExperienceDock whose cells hold row lengths, not data.

A sharded dock (see `entrepot.dock.sharded`) keeps row data in shard actors and every status in one
controller. The controller's `Ledger` is an ExperienceDock over the same columns, consumers and
groups, where each cell holds the row's length (sequence columns) or 0 (scalar columns): every
guarantee of the dock (exactly-once per consumer, grouped and balanced sampling, explicit indexes,
timeouts, leases, partial rollout, state files) comes from the same code, while the data moves
between clients and shards only.

`ColumnKinds` fixes each column's dtype and kind across all shards (the first put fixes them, as
in one dock), so every shard stores a column in the same dtype.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from entrepot.dock._checks import GetRequest
from entrepot.dock._columns import ColumnSpec, is_lossless
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import ColumnLayoutError, DockFullError, LossyDtypeError, UnknownColumnError
from entrepot.dock._leases import Lease
from entrepot.dock._table import DockTable
from entrepot.dock._take import RowTaker
from entrepot.dock._taken import Taken

Kind = tuple[torch.dtype, bool]
"""A column's (dtype, scalar)."""

LENGTH = ColumnSpec(torch.int64, scalar=True)


@dataclass
class LengthsTaken(Taken):
    """Rows a ledger get selected; `parts` hold each row's length per column (0 for scalar columns)."""

    kinds: dict[str, Kind] = field(default_factory=dict)

    def tokens_per_row(self) -> torch.Tensor:
        """int64 [B] valid elements per row over the sequence columns (1 per row if none): what the
        balanced sampler balances, as in one dock."""
        total = torch.zeros(self.rows.numel(), dtype=torch.int64)
        for name, lengths in self.parts.items():
            if not self.kinds[name][1]:
                assert isinstance(lengths, torch.Tensor)  # a ledger holds lengths
                total += lengths
        return total if bool(total.any()) else torch.ones_like(total)

    def nbytes(self) -> int:
        """Bytes of the rows' data in the taken columns (what the shards hand out)."""
        total = 0
        for name, lengths in self.parts.items():
            dtype, scalar = self.kinds[name]
            total += dtype.itemsize * (self.rows.numel() if scalar else int(lengths.sum()))  # type: ignore[union-attr]
        return total

    def reorder(self, order: torch.Tensor) -> LengthsTaken:
        parts = {name: lengths[order] for name, lengths in self.parts.items()}  # type: ignore[index]
        return LengthsTaken(self.rows[order], parts, self.ages[order], self.lease, self.kinds)


class ColumnKinds:
    """Each column's (dtype, scalar), fixed by the first put that names it (or by the column's spec)."""

    def __init__(self, specs: Mapping[str, ColumnSpec]) -> None:
        self._specs = dict(specs)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget the dtypes puts fixed (a dock `reset`); kinds fixed by the specs stay."""
        self.dtypes: dict[str, torch.dtype | None] = {name: spec.dtype for name, spec in self._specs.items()}
        self.scalar: dict[str, bool | None] = {name: spec.scalar for name, spec in self._specs.items()}
        self.reset_pending()

    def reset_pending(self) -> None:
        self.pending = dict.fromkeys(self._specs, 0)  # puts between `fix` and `done`, per column

    def fix(self, kinds: Mapping[str, Kind]) -> tuple[dict[str, Kind], list[str]]:
        """The stored (dtype, scalar) of each column of a put, fixing unknown ones; errors as one dock's.
        Also the columns this put fixed (for `done` to forget if it fails).

        Raises:
            UnknownColumnError, ColumnLayoutError, LossyDtypeError: naming the column; nothing is fixed.
        """
        with self._lock:
            for name, (dtype, scalar) in kinds.items():
                if name not in self._specs:
                    raise UnknownColumnError(name, list(self._specs))
                known = self.scalar[name]
                if known is not None and known != scalar:
                    want, got = (
                        ("one scalar per row", "sequences") if known else ("sequences", "one scalar per row")
                    )
                    raise ColumnLayoutError(name, f"the column stores {want}, got {got}")
                stored = self.dtypes[name]
                if stored is not None and not is_lossless(dtype, stored):
                    raise LossyDtypeError(name, str(dtype), str(stored))
            out, fixed = {}, []
            for name, (dtype, scalar) in kinds.items():
                if self.dtypes[name] is None or self.scalar[name] is None:
                    fixed.append(name)
                self.scalar[name] = scalar
                stored = self.dtypes[name] = self.dtypes[name] or dtype
                out[name] = (stored, scalar)
                self.pending[name] += 1
            return out, fixed

    def done(self, names: Sequence[str], failed: Sequence[str], ready: torch.Tensor) -> None:
        """A put of columns `names` committed or failed; a failed one forgets the kinds it fixed
        (`failed`) unless a cell of that column is ready (`ready`: bool [C, R] of the ledger) or
        another put is under way with it: as in one dock, a failed put fixes no dtype."""
        with self._lock:
            for name in names:
                self.pending[name] = max(self.pending[name] - 1, 0)
            for name in failed:
                c = list(self._specs).index(name)
                if not self.pending[name] and not bool(ready[c].any()):
                    self.dtypes[name], self.scalar[name] = self._specs[name].dtype, self._specs[name].scalar

    def known(self) -> dict[str, Kind]:
        """The columns whose dtype and kind are fixed."""
        with self._lock:
            return {
                name: (dtype, scalar)
                for name, dtype in self.dtypes.items()
                if dtype is not None and (scalar := self.scalar[name]) is not None
            }


class LedgerTaker(RowTaker):
    """The get path of a ledger: snapshots of row lengths (`LengthsTaken`), and a preference for the
    rows of the caller's node's shards (`take_preferring`)."""

    def __init__(self, table: DockTable, kinds: ColumnKinds) -> None:
        super().__init__(table)
        self.kinds = kinds
        self._prefer = threading.local()  # per get: bool [capacity] rows to look at first

    def snapshot(self, columns: Sequence[str], rows: torch.Tensor) -> Taken:
        taken = super().snapshot(columns, rows)
        kinds = {name: kind for name, kind in self.kinds.known().items() if name in taken.parts}
        return LengthsTaken(taken.rows, taken.parts, taken.ages, taken.lease, kinds)

    def take_preferring(self, prefer: torch.Tensor | None, request: GetRequest) -> Taken | None:
        """`take` that first looks only at rows `prefer` (bool [capacity], e.g. the caller's node's
        shards) and takes from the whole dock when those cannot fill the get."""
        self._prefer.rows = prefer
        try:
            return self.take(request)
        finally:
            self._prefer.rows = None

    def sequence_dtype(self, name: str) -> torch.dtype | None:
        """The dtype the shards store column `name` in, if it holds sequences (the ledger's own columns
        hold lengths)."""
        kind = self.kinds.known().get(name)
        return kind[0] if kind is not None and not kind[1] else None

    def pick(self, k: int, col_ids: list[int], *args: Any) -> torch.Tensor | None:
        prefer = getattr(self._prefer, "rows", None)
        if prefer is not None:
            self._prefer.only = prefer
            try:
                picked = super().pick(k, col_ids, *args)
            finally:
                self._prefer.only = None
            if picked is not None:
                return picked
        return super().pick(k, col_ids, *args)

    def available_fn(self, k: int, col_ids: list[int], finished: torch.Tensor | None) -> Any:
        available = super().available_fn(k, col_ids, finished)
        only = getattr(self._prefer, "only", None)
        if only is None:
            return available
        return lambda lo, hi: available(lo, hi) & only[lo:hi]


class Ledger(ExperienceDock):
    """An ExperienceDock of row lengths with the statuses of a sharded dock.

    Args:
        template: a dock built as the sharded one should behave (columns, consumers, groups, partial
            rollout); it holds no data, only settings are read from it.
        shard_of_group: int64 [capacity / n_samples_per_prompt] the shard holding each prompt group.
    """

    _taker: LedgerTaker

    def __init__(self, template: ExperienceDock, shard_of_group: torch.Tensor) -> None:
        super().__init__(
            template.capacity,
            columns=dict.fromkeys(template.columns, LENGTH),
            consumers=template.consumers,
            n_samples_per_prompt=template.n_samples_per_prompt,
            seed=template.seed,
            rollout_consumer=template.rollout_consumer,
            max_age=template.max_age,
            max_staleness=template.max_staleness,
            group_gets=template.group_gets,
        )
        self.kinds = ColumnKinds(template._table.specs)
        self.shard_of_group = shard_of_group
        self._claimed = torch.zeros(shard_of_group.numel(), dtype=torch.bool)  # groups a put_prompts holds
        self._taker = LedgerTaker(self._table, self.kinds)

    # ------------------------------------------------------------------ prompt groups

    def claim_groups(self, num_groups: int, spread: bool = True) -> torch.Tensor:
        """Hold `num_groups` free prompt groups for a put (round robin over shards when `spread`);
        their rows, group by group. `release_groups` (or the put) gives them up."""
        t = self._table
        n = t.n_samples_per_prompt
        with t.cond:
            free = ~t.live.view(-1, n).any(1) & ~self._claimed
            groups = free.nonzero().squeeze(1)
            if groups.numel() < num_groups:
                raise DockFullError(
                    f"{num_groups} prompts need {num_groups} free groups of {n} rows; "
                    f"{groups.numel()} are free"
                )
            if spread:  # the i-th free group of each shard before the (i+1)-th of any
                shard = self.shard_of_group[groups]
                order = torch.zeros_like(groups)
                for s in shard.unique().tolist():
                    mine = (shard == s).nonzero().squeeze(1)
                    order[mine] = torch.arange(mine.numel())
                groups = groups[torch.argsort(order * len(self.shard_of_group) + groups)]
            chosen = groups[:num_groups].sort().values
            self._claimed[chosen] = True
            return (chosen[:, None] * n + torch.arange(n)).reshape(-1)

    def release_groups(self, rows: torch.Tensor) -> None:
        """Give up the groups of `rows` that `claim_groups` held."""
        with self._table.cond:
            self._claimed[rows // self.n_samples_per_prompt] = False

    def check_lease(self, lease: Lease, rows: torch.Tensor) -> None:
        """`LeaseError` unless `lease` holds `rows` now (leases past their deadline expire first)."""
        t = self._table
        with t.cond:
            t.leases.expire(time.monotonic())
            t.leases.held_rows(lease, rows)

    def pin(self, lease: Lease, seconds: float) -> None:
        """Keep `lease` (checked by `check_lease` under the same lock hold) from expiring for `seconds`:
        a put acking it is under way."""
        t = self._table
        with t.cond:
            t.leases.extend(lease, time.monotonic() + seconds)

    def reset(self) -> None:
        super().reset()
        with self._table.cond:
            self.kinds.reset()
            self._claimed.zero_()
