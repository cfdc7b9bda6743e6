"""How a round's slices cross ranks: packed into the sender's arena, then through the process
group (``exchange_dtype``: one batched point-to-point exchange per dtype) or read by each
receiver straight from the sender's shared-memory arena (``pack``, then ``read_shared``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from entrepot.resharding._plan import ReshardPlan, Round, Segment
from entrepot.resharding._shared import SharedArenas

if TYPE_CHECKING:
    from entrepot.resharding.resharder import ReshardStats

__all__ = ["exchange", "exchange_dtype", "pack", "read_shared", "region"]


def region(tensor: torch.Tensor, seg: Segment, start: int) -> torch.Tensor:
    """The part of ``tensor`` that ``seg`` covers, from ``start`` along ``seg.dim``."""
    flat = tensor.reshape(1) if tensor.dim() == 0 else tensor
    return flat.narrow(seg.dim, start, seg.length)


def exchange_dtype(
    group: dist.ProcessGroup | None,
    rnd: Round,
    dtype: torch.dtype,
    rank: int,
    local: Mapping[str, torch.Tensor],
    targets: Mapping[str, torch.Tensor],
    carve: Callable[[str, torch.dtype], torch.Tensor],
    stats: ReshardStats,
) -> None:
    """Pack this rank's payloads of ``dtype``, exchange them, unpack what arrived."""
    sends = pack(rnd, dtype, rank, local, carve, stats)
    incoming = rnd.incoming(rank, dtype)
    recvs = [(carve(f"recv:{dtype}:{src}", dtype), src) for src in incoming]
    exchange(group, sends, recvs)
    for (flat, _), segs in zip(recvs, incoming.values(), strict=True):
        offset = 0
        for seg in segs:
            target = region(targets[seg.name], seg, seg.dst_start)
            target.copy_(flat[offset : offset + seg.numel].view(target.shape))
            offset += seg.numel
            stats.bytes_received += seg.nbytes


def pack(
    rnd: Round,
    dtype: torch.dtype,
    rank: int,
    local: Mapping[str, torch.Tensor],
    carve: Callable[[str, torch.dtype], torch.Tensor],
    stats: ReshardStats,
) -> list[tuple[torch.Tensor, int]]:
    """Pack this rank's payloads of ``dtype`` into its arena: ``[(payload, receiver)]``."""
    sends: list[tuple[torch.Tensor, int]] = []
    stats.num_collectives += 1
    for index, payload in enumerate(rnd.payloads(rank, dtype)):
        flat = carve(f"send:{dtype}:{index}", dtype)
        offset = 0
        for seg in payload.segments:
            source = region(local[seg.name], seg, seg.src_start)
            flat[offset : offset + seg.numel].view(source.shape).copy_(source)
            offset += seg.numel
        sends.extend((flat, dst) for dst in payload.dsts)
        stats.bytes_sent += payload.nbytes * len(payload.dsts)
    return sends


def read_shared(
    plan: ReshardPlan,
    rnd: Round,
    dtype: torch.dtype,
    rank: int,
    shared: SharedArenas,
    targets: Mapping[str, torch.Tensor],
    stats: ReshardStats,
) -> None:
    """Copy this rank's incoming slices of ``dtype`` from the senders' arenas into place."""
    for src, start, segs in plan.shared_reads(rnd, rank, dtype):
        offset = start
        for seg in segs:
            target = region(targets[seg.name], seg, seg.dst_start)
            target.copy_(shared.of[src][offset : offset + seg.nbytes].view(dtype).view(target.shape))
            offset += seg.nbytes
            stats.bytes_received += seg.nbytes


def exchange(
    group: dist.ProcessGroup | None,
    sends: list[tuple[torch.Tensor, int]],
    recvs: list[tuple[torch.Tensor, int]],
) -> None:
    """One bucketed exchange: every ``(tensor, peer)`` send and receive, posted together.

    Peers are ranks of ``group``; each pair of ranks exchanges at most one message per
    call, so messages cannot be confused.
    """

    def peer(rank: int) -> int:
        return rank if group is None else dist.get_global_rank(group, rank)

    ops = [dist.P2POp(dist.isend, t.view(torch.uint8), peer(r), group) for t, r in sends]
    ops += [dist.P2POp(dist.irecv, t.view(torch.uint8), peer(r), group) for t, r in recvs]
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
