"""The DP=2 worker of test_update, in a plain module so that spawned processes import it by name."""

from __future__ import annotations

import os
from typing import Any

import torch
from test_update import ADVANTAGES, SKEWED, _config, _rows, _update

from entrepot.grpo.algo.update import DataParallel


def dp_rank(rank: int, init_file: str, mode: str, out: Any) -> None:
    """One of two gloo ranks: rank 0 trains on the long row, rank 1 on the three short ones. They meet
    through `init_file` (a file rendezvous: no port to race another process for)."""
    import torch.distributed as dist

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        config = _config(
            f"algorithm.loss_agg={mode}", "algorithm.kl_coef=0", "batching.max_tokens_per_micro_batch=48"
        )
        batch = _rows(**SKEWED)  # type: ignore[arg-type]
        rows = torch.tensor([0]) if rank == 0 else torch.tensor([1, 2, 3])
        grads, metrics = _update(config, batch.select(rows), ADVANTAGES[rows], dp=DataParallel())
        out.put((rank, {n: g.numpy() for n, g in grads.items()}, metrics))  # numpy: no shared memory
    finally:
        dist.destroy_process_group()


class _Tagged:
    """A queue's `put` that prefixes each item with `tag`."""

    def __init__(self, out: Any, tag: str) -> None:
        self.out, self.tag = out, tag

    def put(self, item: tuple[Any, ...]) -> None:
        self.out.put((self.tag, *item))


def dp_rank_per_mode(rank: int, init_files: list[str], modes: list[str], out: Any) -> None:
    """`dp_rank` for each of `modes` in turn (a fresh gloo group on each one's file), in one process:
    the two processes start (import torch) once for every mode. Puts (mode, rank, grads, metrics)."""
    for init_file, mode in zip(init_files, modes, strict=True):
        dp_rank(rank, init_file, mode, _Tagged(out, mode))
