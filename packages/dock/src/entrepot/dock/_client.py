"""DockClient: the calls a stage makes, whether the dock lives in this process or in a Ray actor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from entrepot.dock._batch import Batch, Layout
from entrepot.dock._leases import Lease
from entrepot.dock._options import FIFO, ZERO_PADDING, Padding, Sampler


@runtime_checkable
class DockClient(Protocol):
    """What stages use. `ExperienceDock` (and `GRPODock`) implement it in-process, with no copy of the
    caller's tensors beyond the store itself; `entrepot.dock.ray.RayDockClient` implements it for a dock
    in a Ray actor, `entrepot.dock.sharded.ShardedDockClient` for one sharded over Ray nodes.
    Arguments and results are those of `ExperienceDock`.
    """

    def put(
        self,
        data: Mapping[str, Any],
        indexes: Sequence[int] | torch.Tensor,
        *,
        lengths: Mapping[str, Any] | None = None,
        completed: Sequence[bool] | torch.Tensor | None = None,
        ack: Lease | None = None,
    ) -> None: ...

    def get(
        self,
        consumer: str,
        columns: Sequence[str],
        count: int,
        *,
        indexes: Sequence[int] | torch.Tensor | None = None,
        min_count: int | None = None,
        timeout: float | None = None,
        groups: bool | None = None,
        layout: Layout = "padded",
        lease: float | None = None,
        lease_key: str | None = None,
        sampler: Sampler = FIFO,
        padding: Padding = ZERO_PADDING,
    ) -> Batch | None: ...

    def ack(self, lease: Lease, indexes: Sequence[int] | torch.Tensor | None = None) -> None: ...

    def release(self, lease: Lease) -> int: ...

    def peek(
        self,
        columns: Sequence[str],
        indexes: Sequence[int] | torch.Tensor,
        *,
        layout: Layout = "padded",
        padding: Padding = ZERO_PADDING,
    ) -> Batch: ...

    def all_consumed(self, consumer: str) -> bool: ...

    def progress(self, consumer: str) -> dict[str, int]: ...

    def clear(self, indexes: Sequence[int] | torch.Tensor | None = None) -> None: ...

    def reset(self) -> None: ...

    def set_policy_version(self, version: int) -> int: ...

    def finished_rows(self) -> torch.Tensor: ...

    def metrics(self) -> dict[str, float]: ...

    def save(self, path: str) -> None: ...

    def load(self, path: str) -> None: ...


@runtime_checkable
class GRPODockClient(DockClient, Protocol):
    """A DockClient whose dock is a GRPODock: adds the prompt fan-out (`GRPODock.put_prompts`)."""

    def put_prompts(
        self, prompts: Any, n_samples_per_prompt: int | None = None, **kwargs: Any
    ) -> torch.Tensor: ...
