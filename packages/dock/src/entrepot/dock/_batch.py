"""What a get returns: the rows' data in a padded or packed layout, plus their indexes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import torch

from entrepot.dock._leases import Lease
from entrepot.dock._rowcopy import PaddedCopy, RowSource

if TYPE_CHECKING:
    from tensordict import TensorDict

Layout = Literal["padded", "packed"]
LAYOUTS = ("padded", "packed")


@dataclass(frozen=True)
class Batch:
    """Rows handed to one consumer.

    Shape legend: B rows, L_c the padded width of column c (its longest row rounded up to
    `Padding.multiple`), T_c the total valid elements of column c.

    Attributes:
        indexes: int64 [B] the dock rows, in batch order; pass them back to `put` with the outputs.
        columns: column -> tensor. `padded` layout: sequence columns [B, L_c], scalar columns [B].
            `packed` layout: sequence columns flat [T_c], scalar columns [B].
        lengths: int64 [B] per sequence column (valid elements of each row).
        layout: "padded" or "packed".
        ages: int32 [B] how many clears each row survived unfinished (partial rollout), else zeros.
        lease: with `get(lease=...)`, the lease holding these rows: ack it (or `put(..., ack=lease)`)
            once their outputs are stored, else the rows go back to the pool when it expires.
    """

    indexes: torch.Tensor
    columns: dict[str, torch.Tensor]
    lengths: dict[str, torch.Tensor]
    layout: Layout
    ages: torch.Tensor
    lease: Lease | None = None

    @cached_property
    def data(self) -> TensorDict:
        """`columns` as a TensorDict: batch_size [B] when padded, [] when packed (built on first access).

        tensordict loads only here: its import pulls in torch._dynamo, which a consumer that reads
        `columns` never pays for.
        """
        from tensordict import TensorDict

        return TensorDict(self.columns, batch_size=[len(self)] if self.layout == "padded" else [])

    def __len__(self) -> int:
        return int(self.indexes.numel())

    def cu_seqlens(self, column: str) -> torch.Tensor:
        """int32 [B + 1] cumulative lengths of a sequence column (row i is flat[cu[i]:cu[i+1]])."""
        lengths = self.lengths[column]
        return torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0)).to(torch.int32)

    def split(self, num_chunks: int) -> list[Batch]:
        """Cut a padded batch into `num_chunks` equal consecutive parts (e.g. one per DP rank)."""
        if self.layout != "padded" or num_chunks < 1 or len(self) % num_chunks:
            raise ValueError(
                f"split needs a padded batch whose size ({len(self)}) is a multiple of "
                f"num_chunks ({num_chunks})"
            )
        size = len(self) // num_chunks
        parts = []
        for start in range(0, len(self), size):
            rows = slice(start, start + size)
            parts.append(
                Batch(
                    indexes=self.indexes[rows],
                    columns={name: column[rows] for name, column in self.columns.items()},
                    lengths={name: lengths[rows] for name, lengths in self.lengths.items()},
                    layout="padded",
                    ages=self.ages[rows],
                    lease=self.lease,
                )
            )
        return parts


def build_batch(
    indexes: torch.Tensor,
    raw: Mapping[str, tuple[torch.Tensor | RowSource, torch.Tensor | None]],
    ages: torch.Tensor,
    layout: Layout,
    pad_value: float = 0,
    pad_multiple: int = 1,
) -> Batch:
    """Lay out gathered columns: (flat [T_c] or a RowSource, lengths [B]); scalars as (values [B], None).

    The packed layout takes flat tensors as they are; the padded layout copies each row once, out
    of a flat tensor or from where a RowSource says it is (e.g. the store's segments), into [B, L_c].
    """
    num_rows = int(indexes.numel())
    lengths = {name: lens for name, (_, lens) in raw.items() if lens is not None}
    if layout == "packed":
        flat: dict[str, torch.Tensor] = {}
        for name, (rows, _) in raw.items():
            assert isinstance(rows, torch.Tensor)  # flat [T_c] / values [B]: the packed gather's output
            flat[name] = rows
        return Batch(indexes, flat, lengths, layout, ages)
    columns: dict[str, torch.Tensor] = {}
    copies: dict[str, PaddedCopy] = {}  # every column's copy made before any runs (see PaddedCopy)
    for name, (rows, lens) in raw.items():
        if lens is None:
            assert isinstance(rows, torch.Tensor)
            columns[name] = rows
        elif num_rows == 0:
            columns[name] = torch.empty((0, 0), dtype=rows.dtype)
        else:
            source = rows if isinstance(rows, RowSource) else RowSource.packed(rows, lens)
            copies[name] = PaddedCopy(source, pad_value, pad_multiple)
    for name, copy in copies.items():
        copy.run()
        columns[name] = copy.out
    return Batch(indexes, {name: columns[name] for name in raw}, lengths, layout, ages)
