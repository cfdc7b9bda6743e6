"""Shared fixtures: small docks and a snapshot helper to assert that failed calls change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from entrepot.dock import ColumnSpec, ExperienceDock

torch.set_num_threads(1)


def dock_snapshot(dock: ExperienceDock) -> dict[str, Any]:
    """Everything observable about a dock's rows and statuses (state_dict without counters)."""
    state = dock.state_dict()
    for key in ("counts", "rows_got", "wait_s", "bytes_got"):
        state.pop(key)
    return state


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        elif key == "columns":
            assert a[key].keys() == b[key].keys()
            for name, col in a[key].items():
                for field, value in col.items():
                    if isinstance(value, torch.Tensor):
                        assert torch.equal(value, b[key][name][field]), (name, field)
                    else:
                        assert value == b[key][name][field]
        elif key == "generators":
            assert all(torch.equal(x, y) for x, y in zip(a[key], b[key], strict=True))
        else:
            assert a[key] == b[key], key


@pytest.fixture
def snapshot() -> Any:
    return dock_snapshot


@pytest.fixture
def same_state() -> Any:
    return assert_same_state


@pytest.fixture
def dock() -> ExperienceDock:
    """16 rows; tokens int64 sequences, logp float32 sequences, score a float32 scalar."""
    return ExperienceDock(
        16,
        columns={
            "tokens": ColumnSpec(torch.int64, scalar=False),
            "logp": ColumnSpec(torch.float32, scalar=False),
            "score": ColumnSpec(torch.float32, scalar=True),
        },
        consumers=["ref", "train"],
    )


def rows_of(lengths: list[int], start: int = 0, dtype: torch.dtype = torch.int64) -> list[torch.Tensor]:
    """Distinct sequences: row i is start+i repeated lengths[i] times plus a position ramp."""
    return [(torch.arange(n) + 1000 * (start + i)).to(dtype) for i, n in enumerate(lengths)]


@pytest.fixture
def make_rows() -> Any:
    return rows_of


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A Ray of 2 CPUs for one test module; `address="local"` starts it here, never joining a cluster
    another process on the machine started."""
    ray = pytest.importorskip("ray")
    ray.init(
        address="local", num_cpus=2, object_store_memory=500 * 1024 * 1024, include_dashboard=False,
        log_to_driver=False,
    )  # fmt: skip
    yield
    ray.shutdown()
