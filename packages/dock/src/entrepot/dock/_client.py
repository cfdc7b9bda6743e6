"""DockClient: the calls a stage makes, whether the dock lives in this process or in a Ray actor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from entrepot.dock._batch import Batch, Layout
from entrepot.dock._errors import NotOnClientError
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


_HINTS = {
    "state_dict": " (save(path) writes the dock's state where the actor runs)",
    "load_state_dict": " (load(path) reads a state save(path) wrote)",
}


class RemoteClient:
    """Base of the clients of a dock in another process: a name they do not carry is a
    `NotOnClientError` naming it and listing their calls, not a bare AttributeError."""

    def __getattr__(self, name: str) -> Any:  # only called for names the client does not have
        if name.startswith("_"):  # pickling and copy probe these: the plain error they expect
            raise AttributeError(name)
        cls = type(self)
        calls = sorted(n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n)))
        raise NotOnClientError(cls.__name__, name, calls, _HINTS.get(name, ""))
