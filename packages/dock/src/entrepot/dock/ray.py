"""The dock as a Ray actor, behind the same DockClient API (needs `pip install entrepot-dock[ray]`).

    client = RayDockClient.launch(GRPODock, prompts_num=256, n_samples_per_prompt=8)
    rows = client.put_prompts(prompts)
    batch = client.get("actor_rollout", ["prompts"], 64)

The actor is threaded: gets (which may block) run in a "get" concurrency group of `max_concurrency`
threads, puts and control calls in their own small group, so blocked getters never starve a put.
It asks for a fraction of a CPU. Data crosses Ray as one uint8 numpy buffer per call (see _wire):
Ray stores it in the object store once and the receiver maps it without copying; nothing is
pickled per row or per column. A client on the actor's node moves its large puts and get replies
through a shared-memory channel instead (see _channel): memory both processes map, so the rows skip
Ray's object store. The client handle is picklable: pass it to other actors.

Anyone who can reach the Ray cluster can call the actor, so it runs only what a client needs: the
methods in `CALLABLE_METHODS` (a private method or an unknown name is refused), and `save` / `load`
only under the `files_root` it was launched with.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

try:
    import ray
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("entrepot.dock.ray needs Ray: pip install 'entrepot-dock[ray]'") from error

from entrepot.dock import _channel
from entrepot.dock._batch import LAYOUTS, Batch, Layout, build_batch
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import DockStateError, InvalidArgumentError
from entrepot.dock._grpo import count_prompts
from entrepot.dock._inputs import normalize_column, normalize_put
from entrepot.dock._leases import Lease
from entrepot.dock._wire import (
    WireLayout,
    as_uint8,
    columns_layout,
    decode,
    taken_layout,
    write_columns,
    write_taken,
)

__all__ = ["CALLABLE_METHODS", "DockActor", "RayDockClient"]

CALLABLE_METHODS = frozenset(
    {
        "put_prompts", "peek", "ack", "release", "all_consumed", "progress", "clear", "reset", "metrics",
        "save", "load", "set_policy_version", "finished_rows",
    }
)  # fmt: skip
"""The dock methods a client may run through `DockActor.call` (puts and gets have their own calls)."""


class DockActor:
    """Holds one ExperienceDock (or subclass) and serves wire-format puts and gets.

    A plain class: `RayDockClient.launch` makes it a Ray actor with its concurrency groups
    (Ray takes concurrency groups only at decoration time, not in `.options()`).
    """

    def __init__(
        self, dock_cls: type[ExperienceDock], dock_kwargs: dict[str, Any], num_threads: int = 1,
        files_root: str | None = None,
    ) -> None:  # fmt: skip
        torch.set_num_threads(num_threads)
        self._dock = dock_cls(**dock_kwargs)
        self._files_root = None if files_root is None else Path(files_root).resolve()
        self._channels = _channel.ChannelTable()

    @ray.method(concurrency_group="put")
    def put_wire(
        self,
        layout: WireLayout,
        buffer: Any,
        indexes: torch.Tensor,
        completed: Any,
        ack: Lease | None = None,
        channel: str | None = None,
    ) -> bool:
        """Store a put's rows from `buffer`, or (buffer None) from the client's `channel`.

        Returns False, storing nothing, when the channel is not one this actor has mapped (it was
        restarted, or dropped the channel past its limit): the client sends the rows through Ray.
        """
        source = self._channels.room(channel, layout.nbytes) if buffer is None else as_uint8(buffer)
        if source is None:
            return False
        _, raw, _ = decode(layout, source)
        data = {name: flat if lengths is None else (flat, lengths) for name, (flat, lengths) in raw.items()}
        self._dock.put(data, indexes, completed=completed, ack=ack)
        return True

    @ray.method(concurrency_group="get")
    def get_wire(
        self,
        consumer: str,
        columns: list[str],
        count: int,
        kwargs: dict[str, Any],
        channel: str | None = None,
    ) -> Any:
        """(layout, buffer, lease): the rows gathered into the client's `channel` when it has room
        (buffer None), else into a buffer that Ray carries back."""
        taken = self._dock._take(consumer, columns, count, **kwargs)
        if taken is None:
            return None
        try:
            layout = taken_layout(taken)
            room = self._channels.room(channel, layout.nbytes)
            buffer = torch.empty(layout.nbytes, dtype=torch.uint8) if room is None else room
            write_taken(taken, layout, buffer)
        except BaseException:
            self._dock._untake(consumer, taken)
            raise
        finally:
            self._dock._done_reading()
        return layout, None if room is not None else buffer.numpy(), taken.lease

    @ray.method(concurrency_group="put")
    def node_id(self) -> str:
        """The Ray node this actor runs on (a client on the same node may open a channel)."""
        return str(ray.get_runtime_context().get_node_id())

    @ray.method(concurrency_group="put")
    def attach_channel(self, name: str, capacity: int) -> None:
        """Map a client's shared-memory channel; only a file `_channel.create` made is accepted."""
        self._channels.attach(name, capacity)

    @ray.method(concurrency_group="put")
    def detach_channel(self, name: str) -> None:
        self._channels.detach(name)

    @ray.method(concurrency_group="put")
    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one of `CALLABLE_METHODS` on the dock; anything else is an `InvalidArgumentError`."""
        if method not in CALLABLE_METHODS:
            raise InvalidArgumentError(
                f"dock method {method!r} cannot be called through the Ray actor; allowed: "
                + ", ".join(sorted(CALLABLE_METHODS))
            )
        if method in ("save", "load"):
            args, kwargs = (self._confined(method, args[0] if args else kwargs.get("path")),), {}
        return getattr(self._dock, method)(*args, **kwargs)

    def _confined(self, method: str, path: Any) -> str:
        """`path` resolved inside `files_root` (symlinks and '..' followed first), else an error."""
        if self._files_root is None:
            raise InvalidArgumentError(
                f"dock {method} through Ray needs the actor launched with files_root= (the only "
                "directory it may write or read)"
            )
        target = (self._files_root / str(path)).resolve()
        if not target.is_relative_to(self._files_root):
            raise InvalidArgumentError(
                f"dock {method} path {str(path)!r} resolves to {str(target)!r}, outside the dock's "
                f"files_root {str(self._files_root)!r}"
            )
        return str(target)


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
        self._use_channel = channel
        self._channel: _channel.Channel | None = None
        self._channel_lock = threading.Lock()  # held by the one call using the channel
        self._forget_channel: weakref.finalize | None = None
        self.channel_gets = 0
        self.channel_puts = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"actor": self.actor, "channel": self._use_channel}

    def __setstate__(self, state: dict[str, Any]) -> None:
        RayDockClient.__init__(self, state["actor"], state["channel"])

    @property
    def channel_capacity(self) -> int:
        """Bytes of this client's shared-memory channel (0: none yet, or replies travel through Ray)."""
        channel = self._channel
        return 0 if channel is None else channel.capacity

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
        channel = self._claim_channel()
        try:
            if channel is not None and channel.capacity >= layout.nbytes:
                write_columns(columns, layout, channel.buffer.narrow(0, 0, layout.nbytes))
                if ray.get(self.actor.put_wire.remote(layout, None, rows, done, ack, channel.name)):
                    self.channel_puts += 1
                    return
        finally:
            if channel is not None:
                self._channel_lock.release()
        buffer = torch.empty(layout.nbytes, dtype=torch.uint8)
        write_columns(columns, layout, buffer)
        ray.get(self.actor.put_wire.remote(layout, buffer.numpy(), rows, done, ack))
        self._fit_channel(layout.nbytes, channel)  # `channel`: too small, or unknown to the actor

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
        sampler: Any = "fifo",
        num_ranks: int = 1,
        layout: Layout = "padded",
        pad_value: float = 0,
        pad_multiple: int = 1,
        lease: float | None = None,
        lease_key: str | None = None,
    ) -> Batch | None:
        """As ExperienceDock.get; the rows arrive as one zero-copy buffer and are laid out here.

        A lease's clock runs in the actor: a reply lost on its way here (this process died) is
        handed out again when the lease expires.
        """
        if layout not in LAYOUTS:
            raise InvalidArgumentError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        kwargs = {
            "indexes": None if indexes is None else torch.as_tensor(indexes),
            "min_count": min_count,
            "timeout": timeout,
            "groups": groups,
            "sampler": sampler,
            "num_ranks": num_ranks,
            "lease": lease,
            "lease_key": lease_key,
        }
        channel = self._claim_channel()
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
            batch = _copied_batch(wire_layout, buffer, layout, pad_value, pad_multiple)
        finally:
            if channel is not None:
                self._channel_lock.release()
        if array is not None:
            self._fit_channel(wire_layout.nbytes, channel)
        return batch if granted is None else replace(batch, lease=granted)

    def _claim_channel(self) -> _channel.Channel | None:
        """The channel, locked for one call; None when there is none or another call holds it."""
        if self._channel is None or not self._channel_lock.acquire(blocking=False):
            return None
        if self._channel is None:  # dropped between the check and the lock
            self._channel_lock.release()
            return None
        return self._channel

    def _fit_channel(self, nbytes: int, offered: _channel.Channel | None) -> None:
        """After a put or a get reply of `nbytes` went through Ray: make (or grow) the channel.

        One that went through Ray although a channel was offered did not fit it, or the actor no
        longer knows it (restarted, or it dropped it past its limit): both call for a new one.
        """
        if not self._use_channel or nbytes < _channel.MIN_CAPACITY:
            return
        if not self._channel_lock.acquire(blocking=False):
            return  # another call is using the channel: the next one will tell again
        try:
            current = self._channel
            if current is not None and current is not offered and current.capacity >= nbytes:
                return  # this call found the channel busy (or it was replaced since): it still fits
            # Never smaller than the channel it replaces (the actor may just have forgotten that one).
            floor = 0 if current is None else current.capacity
            self._replace_channel(max(_channel.capacity_for(nbytes), floor))
        finally:
            self._channel_lock.release()

    def _replace_channel(self, capacity: int) -> None:
        """Drop the channel (the actor unmaps it) and open one of `capacity` bytes, if this process
        runs on the actor's node and shared memory has room; otherwise replies stay on Ray."""
        if self._forget_channel is not None:
            self._forget_channel()  # tells the actor to unmap the old one
        self._channel = self._forget_channel = None
        try:
            here = str(ray.get_runtime_context().get_node_id())
            if ray.get(self.actor.node_id.remote()) != here:
                self._use_channel = False
                return
            channel = _channel.create(capacity)
        except (OSError, ray.exceptions.RayError):
            self._use_channel = False  # no shared memory to spare here, or the actor is gone
            return
        try:
            ray.get(self.actor.attach_channel.remote(channel.name, channel.capacity))
        except ray.exceptions.RayError:
            self._use_channel = False  # e.g. the actor sees another /dev/shm (a container)
            return
        finally:
            _channel.unlink(channel)  # both sides have it mapped (or the actor never will)
        self._channel = channel
        self._forget_channel = weakref.finalize(self, _detach_quietly, self.actor, channel.name)
        self._forget_channel.atexit = False  # at exit the actor goes too, or keeps it until its limit

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

    def peek(self, columns: Sequence[str], indexes: Sequence[int] | torch.Tensor, **kwargs: Any) -> Batch:
        result: Batch = self._call("peek", list(columns), torch.as_tensor(indexes), **kwargs)
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


def _copied_batch(
    wire_layout: WireLayout, buffer: torch.Tensor, layout: Layout, pad_value: float, pad_multiple: int
) -> Batch:
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
    return build_batch(rows.clone(), copied, ages.clone(), layout, pad_value, pad_multiple)


def _detach_quietly(actor: Any, name: str) -> None:
    """Ask the actor to unmap channel `name` (fire and forget: the actor or Ray may be gone)."""
    if not ray.is_initialized():
        return  # Ray was shut down (a call now would start a new local Ray)
    with contextlib.suppress(Exception):  # the actor may be gone
        actor.detach_channel.remote(name)
