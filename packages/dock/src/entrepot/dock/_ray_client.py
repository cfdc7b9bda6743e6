"""RayDockClient: the DockClient of a dock in a `DockActor` (extra `ray`; see entrepot.dock.ray).

Data crosses Ray as one uint8 buffer per call (see _wire), or through the client's same-node
channel when it has one (see _ray_channel); the client lays a get's batch out of it here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import ray
import torch

from entrepot.dock._batch import LAYOUTS, Batch, Layout, build_batch
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import DockStateError, InvalidArgumentError
from entrepot.dock._grpo import count_prompts
from entrepot.dock._inputs import normalize_column, normalize_put
from entrepot.dock._leases import Lease
from entrepot.dock._options import FIFO, ZERO_PADDING, Padding, Sampler, check_padding, check_sampler
from entrepot.dock._ray_actor import DockActor
from entrepot.dock._ray_channel import ClientChannel
from entrepot.dock._wire import WireLayout, as_uint8, columns_layout, decode, write_columns


class RayDockClient:
    """DockClient for a dock living in a `DockActor`; same arguments and results as ExperienceDock.

    With `channel` (the default), a client on the actor's node moves puts and get replies of 1 MiB
    or more through a shared-memory channel (see `_channel`), created after the first such call and
    grown when one outgrows it; elsewhere, or with `channel=False`, through Ray's object store.
    `channel_puts` / `channel_gets` count the calls that used the channel. Pickling drops the
    channel: each process makes its own.
    """

    def __init__(self, actor: Any, channel: bool = True) -> None:
        self.actor = actor
        self._channel = ClientChannel(actor, channel)
        self.channel_gets = 0
        self.channel_puts = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"actor": self.actor, "channel": self._channel.enabled}

    def __setstate__(self, state: dict[str, Any]) -> None:
        RayDockClient.__init__(self, state["actor"], state["channel"])

    @property
    def channel_capacity(self) -> int:
        """Bytes of this client's shared-memory channel (0: none yet, or replies travel through Ray)."""
        return self._channel.capacity

    @classmethod
    def launch(
        cls,
        dock_cls: type[ExperienceDock] = ExperienceDock,
        *,
        num_cpus: float = 0.25,
        max_concurrency: int = 16,
        name: str | None = None,
        files_root: str | None = None,
        channel: bool = True,
        **dock_kwargs: Any,
    ) -> RayDockClient:
        """Start a DockActor holding `dock_cls(**dock_kwargs)` and return a client for it.

        Args:
            dock_cls: ExperienceDock or a subclass such as GRPODock.
            num_cpus: the actor's CPU request (it mostly waits and copies memory).
            max_concurrency: threads serving gets (each blocked get holds one).
            name: optional Ray actor name, so other processes can `ray.get_actor` it.
            files_root: the one directory `save` / `load` may use (paths resolve inside it; relative
                ones are taken from it); None refuses both.
            channel: move large puts and get replies through a shared-memory channel when this
                process runs on the actor's node (see the class docstring); False: always through Ray.
            dock_kwargs: the dock's constructor arguments.
        """
        actor_cls = ray.remote(num_cpus=num_cpus, concurrency_groups={"put": 4, "get": max_concurrency})(
            DockActor
        )
        options = {} if name is None else {"name": name}
        actor = actor_cls.options(**options).remote(dock_cls, dock_kwargs, files_root=files_root)
        return cls(actor, channel=channel)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return ray.get(self.actor.call.remote(method, args, kwargs))

    def put(
        self,
        data: Mapping[str, Any],
        indexes: Sequence[int] | torch.Tensor,
        *,
        lengths: Mapping[str, Any] | None = None,
        completed: Sequence[bool] | torch.Tensor | None = None,
        ack: Lease | None = None,
    ) -> None:
        """As ExperienceDock.put; the data is unpadded here and shipped as one buffer (the caller's
        rows are copied once, into the channel when they fit it, else into a buffer Ray carries)."""
        rows = torch.as_tensor(indexes).reshape(-1)
        data = dict(data.items())  # a TensorDict iterates over rows, not keys
        columns = normalize_put(data, lengths, rows.numel(), {})
        layout = columns_layout(columns)
        done = None if completed is None else torch.as_tensor(completed, dtype=torch.bool)
        channel = self._channel.claim()
        try:
            if channel is not None and channel.capacity >= layout.nbytes:
                write_columns(columns, layout, channel.buffer.narrow(0, 0, layout.nbytes))
                if ray.get(self.actor.put_wire.remote(layout, None, rows, done, ack, channel.name)):
                    self.channel_puts += 1
                    return
        finally:
            if channel is not None:
                self._channel.release()
        buffer = torch.empty(layout.nbytes, dtype=torch.uint8)
        write_columns(columns, layout, buffer)
        ray.get(self.actor.put_wire.remote(layout, buffer.numpy(), rows, done, ack))
        self._channel.fit(layout.nbytes, channel)  # `channel`: too small, or unknown to the actor

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
    ) -> Batch | None:
        """As ExperienceDock.get; the rows arrive as one zero-copy buffer and are laid out here.

        A lease's clock runs in the actor: a reply lost on its way here (this process died) is
        handed out again when the lease expires.
        """
        if layout not in LAYOUTS:
            raise InvalidArgumentError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        check_sampler(sampler)
        check_padding(padding)
        kwargs = {
            "indexes": None if indexes is None else torch.as_tensor(indexes),
            "min_count": min_count,
            "timeout": timeout,
            "groups": groups,
            "sampler": sampler,
            "lease": lease,
            "lease_key": lease_key,
        }
        channel = self._channel.claim()
        try:
            offered = None if channel is None else channel.name
            reply = ray.get(self.actor.get_wire.remote(consumer, list(columns), count, kwargs, offered))
            if reply is None:
                return None
            wire_layout, array, granted = reply
            if array is None:
                assert channel is not None  # the actor writes into a channel only when offered one
                buffer = channel.buffer.narrow(0, 0, wire_layout.nbytes)
                self.channel_gets += 1
            else:
                buffer = as_uint8(array)
            batch = _copied_batch(wire_layout, buffer, layout, padding)
        finally:
            if channel is not None:
                self._channel.release()
        if array is not None:
            self._channel.fit(wire_layout.nbytes, channel)
        return batch if granted is None else replace(batch, lease=granted)

    def ack(self, lease: Lease, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        """ExperienceDock.ack in the actor."""
        self._call("ack", lease, None if indexes is None else torch.as_tensor(indexes))

    def release(self, lease: Lease) -> int:
        """ExperienceDock.release in the actor."""
        return int(self._call("release", lease))

    def put_prompts(
        self, prompts: Any, n_samples_per_prompt: int | None = None, *, lengths: Any = None, **kwargs: Any
    ) -> torch.Tensor:
        """GRPODock.put_prompts in the actor; the prompts travel packed (two tensors, not one per prompt)."""
        column = normalize_column("prompts", prompts, lengths, count_prompts(prompts, lengths), False)
        assert column.lengths is not None  # sequences
        packed = (column.flat, column.lengths)
        result: torch.Tensor = self._call("put_prompts", packed, n_samples_per_prompt, **kwargs)
        return result

    def peek(
        self,
        columns: Sequence[str],
        indexes: Sequence[int] | torch.Tensor,
        *,
        layout: Layout = "padded",
        padding: Padding = ZERO_PADDING,
    ) -> Batch:
        """ExperienceDock.peek in the actor (the batch comes back pickled)."""
        result: Batch = self._call(
            "peek", list(columns), torch.as_tensor(indexes), layout=layout, padding=padding
        )
        return result

    def all_consumed(self, consumer: str) -> bool:
        return bool(self._call("all_consumed", consumer))

    def progress(self, consumer: str) -> dict[str, int]:
        result: dict[str, int] = self._call("progress", consumer)
        return result

    def clear(self, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        self._call("clear", indexes)

    def reset(self) -> None:
        self._call("reset")

    def set_policy_version(self, version: int) -> int:
        """ExperienceDock.set_policy_version in the actor."""
        return int(self._call("set_policy_version", version))

    def finished_rows(self) -> torch.Tensor:
        """ExperienceDock.finished_rows in the actor."""
        result: torch.Tensor = self._call("finished_rows")
        return result

    def metrics(self) -> dict[str, float]:
        result: dict[str, float] = self._call("metrics")
        return result

    def save(self, path: str) -> None:
        """Save the actor's dock to `path`, on the actor's node, inside its `files_root`."""
        self._call("save", path)

    def load(self, path: str) -> None:
        """Load the actor's dock from `path`, on the actor's node, inside its `files_root`.

        A file that fails its checks raises the actor's `DockStateError` itself, message and all
        (Ray's wrapper would put the actor's traceback in front of the one line that matters).
        """
        try:
            self._call("load", path)
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, DockStateError):
                raise error.cause from None
            raise


def _copied_batch(wire_layout: WireLayout, buffer: torch.Tensor, layout: Layout, padding: Padding) -> Batch:
    """A get's batch laid out of a received buffer, every tensor a copy (the buffer is Ray's
    read-only shared memory, or a channel that the next get overwrites). The padded layout copies
    each row itself, straight out of the buffer."""
    rows, raw, ages = decode(wire_layout, buffer)
    copied: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for name, (flat, lengths) in raw.items():
        if lengths is None:
            copied[name] = (flat.clone(), None)
        else:
            copied[name] = (flat if layout == "padded" else flat.clone(), lengths.clone())
    return build_batch(rows.clone(), copied, ages.clone(), layout, padding.value, padding.multiple)
