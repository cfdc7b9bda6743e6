"""A CPU-bound neighbour for the benchmarks: one process per core spinning in pure Python.

On a shared host other jobs take the cores between a call's small ops and evict its caches; a
call made of many small torch ops suffers more from that than one large copy does. Running the
same measurements with this neighbour shows such a regression on a quiet machine too.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from contextlib import contextmanager


def _spin(stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    os.nice(0)  # the same priority as the benchmark: a neighbour, not a background job
    count = 0
    while not stop.is_set():
        for _ in range(100_000):
            count += 1


@contextmanager
def cpu_bound_neighbour(processes: int | None = None) -> Iterator[int]:
    """Spin `processes` (default: one per core) processes for the duration of the block."""
    count = processes or os.cpu_count() or 1
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    spinners = [context.Process(target=_spin, args=(stop,), daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield count
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join(10)
            if spinner.is_alive():
                spinner.kill()
