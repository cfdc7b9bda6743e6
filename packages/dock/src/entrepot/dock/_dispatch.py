"""Worker-side dispatch: one rank of a model-parallel group gets a batch, the others receive it.

Per batch: one broadcast of the small wire layout (torch's object broadcast) and one broadcast of a
single flat uint8 buffer holding every column of every dtype (views of it are re-typed on arrival),
whatever the number of columns. Upstream broadcast each column separately.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from entrepot.dock._batch import Batch, Layout, build_batch
from entrepot.dock._checks import check_padding
from entrepot.dock._client import DockClient
from entrepot.dock._options import ZERO_PADDING, Padding
from entrepot.dock._wire import decode, encode_raw


def dispatch_get(
    client: DockClient | None,
    consumer: str,
    columns: Sequence[str],
    count: int,
    *,
    group: Any = None,
    src: int = 0,
    device: torch.device | str = "cpu",
    layout: Layout = "padded",
    padding: Padding = ZERO_PADDING,
    **get_kwargs: Any,
) -> Batch | None:
    """Get a batch on rank `src` of `group` and hand the same batch to every rank of the group.

    Every rank of the group calls this; only `src` (a global rank) talks to the dock. When the
    consumer has received every row, every rank gets None (so the loop `while (batch :=
    dispatch_get(...)) is not None` ends on all ranks together, with no extra all-reduce).

    Args:
        client: the dock on rank `src`; ignored (may be None) on the other ranks.
        consumer, columns, count, get_kwargs: as in `ExperienceDock.get`.
        group: the torch.distributed process group (None: the default group).
        src: the global rank that reads from the dock.
        device: where the broadcast buffer lives (cuda for NCCL); the batch is returned on it.
        layout, padding: the batch layout built on every rank.

    Returns:
        The batch (identical on every rank), or None when the consumer is done.
    """
    check_padding(padding)
    meta: list[Any] = [None]
    buffer: torch.Tensor | None = None
    batch: Batch | None = None
    if dist.get_rank() == src:
        if client is None:
            raise ValueError(f"rank {src} is the dispatch source and needs a dock client")
        batch = client.get(consumer, columns, count, layout="packed", **get_kwargs)
        if batch is not None:
            raw = {name: (batch.columns[name], batch.lengths.get(name)) for name in columns}
            wire_layout, buffer = encode_raw(batch.indexes, raw, batch.ages)
            meta = [wire_layout]
            buffer = buffer.to(device)
    dist.broadcast_object_list(meta, src=src, group=group)
    if meta[0] is None:
        return None
    if buffer is None:
        buffer = torch.empty(meta[0].nbytes, dtype=torch.uint8, device=device)
    dist.broadcast(buffer, src=src, group=group)
    lease = None if batch is None else batch.lease  # the source's: it puts the outputs and acks
    rows, raw, ages = decode(meta[0], buffer)
    # Small per-row tensors are copied so the batch does not pin the whole buffer through them.
    raw = {
        name: (flat.clone() if lengths is None else flat, None if lengths is None else lengths.clone())
        for name, (flat, lengths) in raw.items()
    }
    out = build_batch(rows.clone(), raw, ages.clone(), layout, padding.value, padding.multiple)
    return out if lease is None else replace(out, lease=lease)
