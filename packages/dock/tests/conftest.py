"""Shared fixtures: small docks, a snapshot helper to assert that failed calls change nothing, a Ray."""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # the tests_support_* helpers

from tests_support_bad_inputs import assert_same_state, dock_snapshot

from entrepot.dock import ColumnSpec, ExperienceDock

torch.set_num_threads(1)


@pytest.fixture
def snapshot() -> Any:
    return dock_snapshot


@pytest.fixture
def same_state() -> Any:
    return assert_same_state


def small_dock(**kwargs: Any) -> ExperienceDock:
    """16 rows; tokens int64 sequences, logp float32 sequences, score a float32 scalar; consumers
    ref and train. `kwargs`: further ExperienceDock arguments."""
    return ExperienceDock(
        16,
        columns={
            "tokens": ColumnSpec(torch.int64, scalar=False),
            "logp": ColumnSpec(torch.float32, scalar=False),
            "score": ColumnSpec(torch.float32, scalar=True),
        },
        consumers=["ref", "train"],
        **kwargs,
    )


@pytest.fixture
def make_dock() -> Any:
    return small_dock


@pytest.fixture
def dock() -> ExperienceDock:
    """`small_dock()`."""
    return small_dock()


def rows_of(lengths: list[int], start: int = 0, dtype: torch.dtype = torch.int64) -> list[torch.Tensor]:
    """Distinct sequences: row i is start+i repeated lengths[i] times plus a position ramp."""
    return [(torch.arange(n) + 1000 * (start + i)).to(dtype) for i, n in enumerate(lengths)]


@pytest.fixture
def make_rows() -> Any:
    return rows_of


_STARTED: list[str] = []  # the GCS address of the Ray `local_ray` started, once it has


@pytest.fixture(scope="session")
def _ray_of_the_session() -> Iterator[Any]:
    """Shuts down, at the end of the test session, the Ray that `local_ray` started."""
    ray = pytest.importorskip("ray")
    yield ray
    if _STARTED and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def local_ray(_ray_of_the_session: Any) -> Iterator[None]:
    """A Ray of 2 CPUs, started once per test session and shared by the modules that use it (a start
    costs seconds on a small machine); `address="local"` starts it here, never joining a cluster
    another process on the machine started.

    Each module still starts with every CPU free: a module whose actors still hold CPUs once it is
    done (a failed test keeps its actors alive) shuts the Ray down, and the next module starts a
    fresh one. A Ray that something else started in this process is replaced by ours.
    """
    ray = _ray_of_the_session
    if not (ray.is_initialized() and ray.get_runtime_context().gcs_address in _STARTED):
        if ray.is_initialized():
            ray.shutdown()
        # Ray starts its workers at nice 15, where a CPU-bound neighbour of normal priority (another
        # test run on the machine) leaves them a few percent of a core: run them at ours.
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("RAY_worker_niceness", "0")
            ray.init(
                address="local", num_cpus=2, object_store_memory=500 * 1024 * 1024, include_dashboard=False,
                log_to_driver=False,
            )  # fmt: skip
        _STARTED[:] = [ray.get_runtime_context().gcs_address]
    yield
    if not _all_cpus_free(ray):
        ray.shutdown()


def _all_cpus_free(ray: Any, timeout: float = 10.0) -> bool:
    """Whether every CPU of the running Ray is free, waiting up to `timeout` s (actors die asynchronously).

    Collects garbage first: an actor lives as long as its handle, and a handle in a reference cycle
    (a client and its shards) lives until the next collection.
    """
    gc.collect()
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("CPU", 0.0) < ray.cluster_resources().get("CPU", 0.0):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
