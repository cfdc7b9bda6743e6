"""Rows a get has selected and marked, held as snapshots until their data is copied out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from entrepot.dock._columns import SeqSnapshot
from entrepot.dock._leases import Lease


@dataclass
class Taken:
    """The selected rows and, per column, a snapshot (sequence) or the values (scalar).

    rows: int64 [B]; parts: column -> SeqSnapshot or values [B]; ages: int32 [B]; lease: the lease
    holding the rows (None: they were marked consumed).
    """

    rows: torch.Tensor
    parts: dict[str, SeqSnapshot | torch.Tensor]
    ages: torch.Tensor
    lease: Lease | None = None

    def tokens_per_row(self) -> torch.Tensor:
        """int64 [B] valid elements per row summed over the sequence columns (1 per row if none)."""
        total = torch.zeros(self.rows.numel(), dtype=torch.int64)
        for part in self.parts.values():
            if isinstance(part, SeqSnapshot):
                total += part.lengths
        return total if bool(total.any()) else torch.ones_like(total)

    def nbytes(self) -> int:
        """Bytes of valid data these rows hold in the taken columns (what the get hands out)."""
        total = 0
        for part in self.parts.values():
            if isinstance(part, SeqSnapshot):
                total += part.numel * part.dtype.itemsize if part.segments else 0
            else:
                total += part.nbytes
        return total

    def reorder(self, order: torch.Tensor) -> Taken:
        """The same rows in a new order (int64 [B] permutation)."""
        parts: dict[str, SeqSnapshot | torch.Tensor] = {}
        for name, part in self.parts.items():
            if isinstance(part, SeqSnapshot):
                parts[name] = SeqSnapshot(part.segments, part.bases, part.offsets[order], part.lengths[order])
            else:
                parts[name] = part[order]
        return Taken(self.rows[order], parts, self.ages[order], self.lease)

    def gather(self, layout: str) -> dict[str, tuple[Any, torch.Tensor | None]]:
        """column -> (rows, lengths int64 [B]) for sequences, (values [B], None) for scalars.

        Sequence rows come as one flat copy [T_c] for the `packed` layout, and for `padded` as where
        they are in the store's segments (a `RowSource`, no copy): the padded layout copies them once,
        straight into the padded tensor.
        """
        out: dict[str, tuple[Any, torch.Tensor | None]] = {}
        for name, part in self.parts.items():
            if isinstance(part, SeqSnapshot):
                out[name] = (part.rows() if layout == "padded" else part.gather(), part.lengths)
            else:
                out[name] = (part, None)
        return out
