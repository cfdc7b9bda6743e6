"""Scratch arenas in shared memory, for ranks of one host that reshard CPU tensors.

Over gloo, a byte that moves between two processes of the same machine is copied four times:
packed into the send bucket, into the kernel's socket buffer, out of it, and out of the receive
bucket into place. Here each rank's arena is a file in ``/dev/shm`` that every peer maps: the
sender packs a slice once (however many ranks need it) and each receiver copies it straight
from the sender's arena into its own output, two copies in all and no socket. A barrier before
the reads (the slices are packed) and one after (the arena may be overwritten) order a round.

Opening is a collective that every rank of the group joins: each creates its own file, then
maps its peers' files. When any rank cannot (another host, no ``/dev/shm``, less free space
there than all the arenas of the group take), every rank learns it from one all-reduce and
``open_shared_arenas`` returns None: the caller exchanges through the process group instead.
Each file is unlinked as soon as every peer has mapped it, so nothing is left behind in
``/dev/shm``; the memory goes when the last map of it is dropped.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["SHM_DIR", "SharedArenas", "new_token", "open_shared_arenas"]

SHM_DIR = "/dev/shm"


@dataclass
class SharedArenas:
    """This rank's arena (``mine``, written) and every rank's arena (``of[rank]``, read)."""

    mine: torch.Tensor  # [own arena bytes] uint8, MAP_SHARED
    of: list[torch.Tensor]  # [world] uint8 maps; of[rank] is mine


def new_token(group: dist.ProcessGroup | None) -> str:
    """A name shared by the ranks of ``group`` (rank 0 draws it), unique to one ``Resharder``."""
    drawn = secrets.token_bytes(8) if dist.get_rank(group) == 0 else bytes(8)
    token = torch.frombuffer(bytearray(drawn), dtype=torch.uint8).clone()  # a tensor: nothing is pickled
    dist.broadcast(token, group_src=0, group=group)
    return bytes(token.tolist()).hex()


def _path(token: str, rank: int) -> str:
    return os.path.join(SHM_DIR, f"entrepot-reshard-{token}-{rank}")


def _free_bytes() -> int:
    stat = os.statvfs(SHM_DIR)
    return stat.f_bavail * stat.f_frsize


def _map(path: str, nbytes: int, create: bool) -> torch.Tensor:
    if not create:  # torch.from_file would create a missing file: a peer on another host
        os.close(os.open(path, os.O_RDWR))
    return torch.from_file(path, shared=True, size=max(nbytes, 1), dtype=torch.uint8)[:nbytes]


def open_shared_arenas(
    token: str, rank: int, sizes: list[int], group: dist.ProcessGroup | None
) -> SharedArenas | None:
    """Map every rank's arena (``sizes[r]`` bytes), or None on every rank if any rank cannot.

    A collective: every rank of ``group`` calls it with the same ``token`` and ``sizes``.
    """
    own = _path(token, rank)
    mine: torch.Tensor | None = None
    of: list[torch.Tensor] = []
    with contextlib.suppress(OSError):  # no /dev/shm here: every rank hears of it below
        if _free_bytes() >= sum(sizes):  # writing past a full tmpfs would kill us with SIGBUS
            mine = _map(own, sizes[rank], create=True)
    dist.barrier(group=group)  # every rank's file exists (or failed)
    if mine is not None:
        try:
            of = [mine if r == rank else _map(_path(token, r), n, create=False) for r, n in enumerate(sizes)]
        except OSError:
            of = []
    ok = torch.tensor([1 if len(of) == len(sizes) else 0])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)  # also: every peer has mapped my file
    with contextlib.suppress(FileNotFoundError):
        os.unlink(own)
    if not int(ok) or mine is None:
        return None
    return SharedArenas(mine, of)
