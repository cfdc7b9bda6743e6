"""Split one micro-batch's forward (and backward) over CPU threads, so a small machine's cores all work.

Every torch process here runs one intra-op thread (see `entrepot.grpo.embedded.threads`: spinning OpenMP
threads made small jobs 5-10x slower), and torch releases the GIL inside each op. So two Python
threads, each running the model on about half of a micro-batch's tokens, keep two cores busy. Results
come back in lane order and are combined in that order (gradients: lane 0 + lane 1 + ...), so a run
is deterministic; against one lane only the float summation order differs.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, TypeVar

import torch

if TYPE_CHECKING:
    from entrepot.grpo.config import ThreadsConfig

__all__ = ["compute_lanes", "run_lanes", "split_rows"]


def compute_lanes(
    threads: ThreadsConfig, *, device: str, splits: bool, on_ray: bool, cores: int | None = None
) -> int:
    """Threads per micro-batch: `threads.lanes`, or when null 2 cores of a CPU run in one process (1 with
    Ray, on an accelerator, for an engine that does not split micro-batches, or on a 1-core machine).

    Args:
        device: `engine.device`.
        splits: the training engine splits micro-batches into lanes (`TrainEngineSpec.lanes`).
        on_ray: whether the workers are Ray actors (`run.deployment.uses_ray`); they share the cores.
        cores: CPU cores this process may use; None: `os.sched_getaffinity` of this process.
    """
    if threads.lanes is not None:
        return threads.lanes
    if device != "cpu" or not splits or on_ray:
        return 1
    return min(2, len(os.sched_getaffinity(0)) if cores is None else cores)


T = TypeVar("T")
R = TypeVar("R")

_pool: ThreadPoolExecutor | None = None
_pool_workers = 0
_pool_lock = threading.Lock()
_lane_thread = threading.local()  # `.active` is True on the pool's threads


def split_rows(lengths: torch.Tensor, rows: torch.Tensor, lanes: int) -> list[torch.Tensor]:
    """`rows` cut into at most `lanes` consecutive, non-empty parts of about equal tokens.

    Args:
        lengths: int64 [B] tokens of every row of the batch.
        rows: int64 [K] the micro-batch's rows (indexes into `lengths`), kept in this order.
        lanes: parts wanted (>= 1).
    """
    if lanes <= 1 or rows.numel() < 2:
        return [rows]
    parts = min(lanes, rows.numel())
    ends = torch.cumsum(lengths[rows], 0)  # [K] tokens up to and including each row
    goals = ends[-1] * torch.arange(1, parts) / parts  # [parts - 1] token counts to cut at
    cuts = torch.searchsorted(ends, goals).clamp(min=0, max=rows.numel() - 1) + 1
    bounds = [0, *sorted(set(cuts.tolist())), rows.numel()]
    return [rows[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _start_lane_thread(threads: int) -> None:
    torch.set_num_threads(threads)
    _lane_thread.active = True


def _executor(workers: int) -> ThreadPoolExecutor:
    """The process's lane threads (made once), each running torch ops with this process's thread count."""
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is None or _pool_workers < workers:
            threads, _pool_workers = torch.get_num_threads(), workers
            _pool = ThreadPoolExecutor(
                max_workers=workers, thread_name_prefix="entrepot-lane",
                initializer=_start_lane_thread, initargs=(threads,),
            )  # fmt: skip
        return _pool


def run_lanes(fn: Callable[[T], R], parts: Sequence[T]) -> list[R]:
    """`fn(part)` for every part, part 0 on this thread and the rest on lane threads; results in order.

    The lanes inherit this thread's grad mode (it is thread-local in torch). The first error is raised
    here, after every lane has finished. Called from a lane (a lane's `fn` splitting its own work, e.g.
    a rollout engine with lanes driven from one), the parts run in order on that lane: the pool's
    threads may all be busy waiting for it.
    """
    if len(parts) == 1 or getattr(_lane_thread, "active", False):
        return [fn(part) for part in parts]
    grad = torch.is_grad_enabled()

    def lane(part: T) -> R:
        with torch.set_grad_enabled(grad):
            return fn(part)

    pool = _executor(len(parts) - 1)
    futures = [pool.submit(lane, part) for part in parts[1:]]
    try:
        first = fn(parts[0])
    finally:
        wait(futures)  # every lane done before anything is raised (or returned)
    return [first, *(future.result() for future in futures)]
