"""DockActor: the Ray actor that holds one dock and serves wire-format puts and gets (extra `ray`).

Anyone who can reach the Ray cluster can call the actor, so it runs only what a client needs: the
methods in `CALLABLE_METHODS` (a private method or an unknown name is refused), and `save` / `load`
only under the `files_root` it was launched with. It checks every argument again (see _checks):
what it receives was unpickled, not built by a client's checks; and it gives a get's rows back only
to whoever holds that get's receipt (`untake_wire`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
import torch

from entrepot.dock._channel_table import ChannelTable
from entrepot.dock._checks import GetRequest, checked_again
from entrepot.dock._columns import ColumnSpec
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import InvalidArgumentError
from entrepot.dock._leases import Lease
from entrepot.dock._wire import (
    GetReply,
    WireLayout,
    as_uint8,
    batch_layout,
    decode,
    taken_layout,
    write_batch,
    write_taken,
)

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
        self._channels = ChannelTable()

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
    def get_wire(self, request: GetRequest, channel: str | None = None) -> GetReply | None:
        """A get through Ray: its rows gathered into the client's `channel` when it has room (the
        reply's array None), else into a buffer that Ray carries back."""
        return self._get(request, channel, None)

    def _get(self, request: GetRequest, channel: str | None, region: str | None) -> GetReply | None:
        """Take a get's rows and write them out: as the batch itself into the client's reply
        `region` when it has room (the client hands out views of it), else in the wire format into
        its `channel` or a new buffer. The receipt lets the client give the rows back (`untake_wire`)
        if laying its batch out fails."""
        taker = self._dock._taker
        request = checked_again(request)
        taken = taker.take(request)
        if taken is None:
            return None
        nbytes = taken.nbytes()
        padding, array, region_bytes = request.padding, None, 0
        room: torch.Tensor | None = None
        try:
            if channel is not None:  # a client with a channel may have (or make) reply regions
                layout = batch_layout(taken, request.layout, padding.multiple)
                room = self._channels.region_room(channel, region, layout.nbytes)
                region_bytes = layout.nbytes
                if room is not None:
                    write_batch(taken, layout, room, padding.value, padding.multiple)
            if room is None:  # no region offered, or the batch does not fit it
                region = None
                layout = taken_layout(taken)
                room = self._channels.room(channel, layout.nbytes)
                buffer = torch.empty(layout.nbytes, dtype=torch.uint8) if room is None else room
                write_taken(taken, layout, buffer)
                array = None if room is not None else buffer.numpy()
        except BaseException:
            taker.untake(request.consumer, taken.rows, taken.lease, nbytes)
            raise
        finally:
            self._dock._table.done_reading()
        receipt = taker.receipt(request.consumer, taken.rows, nbytes)
        return GetReply(layout, array, taken.lease, nbytes, receipt, region is not None, region_bytes)

    @ray.method(concurrency_group="put")
    def untake_wire(
        self, consumer: str, rows: torch.Tensor, nbytes: int, lease: Lease | None, receipt: str
    ) -> None:
        """Give back the rows of a get that failed in the client after the take (its receipt checked)."""
        self._dock._taker.untake_signed(consumer, rows, nbytes, lease, receipt)

    @ray.method(concurrency_group="put")
    def settings(self) -> tuple[int, dict[str, ColumnSpec], str | None]:
        """(capacity, column specs, rollout consumer): what a client checks a put against first."""
        t = self._dock._table
        return t.capacity, dict(t.specs), t.rollout_consumer

    @ray.method(concurrency_group="put")
    def scalar_kinds(self, names: list[str]) -> dict[str, bool | None]:
        """Whether each column of `names` stores scalars (None: not fixed yet)."""
        t = self._dock._table
        return {name: t.scalar_kind(name) for name in names if name in t.specs}

    @ray.method(concurrency_group="put")
    def node_id(self) -> str:
        """The Ray node this actor runs on (a client on the same node may open a channel)."""
        return str(ray.get_runtime_context().get_node_id())

    @ray.method(concurrency_group="put")
    def attach_channel(self, name: str, capacity: int, link: str | None = None) -> None:
        """Map a client's shared-memory channel (only a file `_channel.create` made is accepted) and
        serve the puts and gets that come over its `link` socket (see _link)."""
        self._channels.attach(name, capacity, link, self._link_call)

    def _link_call(self, channel: str, message: tuple[Any, ...]) -> Any:
        """A put or get that came over channel `channel`'s link: ("put", layout, rows, completed,
        ack) or ("get", request, reply region or None)."""
        kind, *args = message
        if kind == "put":
            layout, rows, completed, ack = args
            return self.put_wire(layout, None, rows, completed, ack, channel)
        if kind == "get":
            request, region = args
            return self._get(request, channel, region)
        raise InvalidArgumentError(f"dock link call {kind!r} is not one of 'put', 'get'")

    @ray.method(concurrency_group="put")
    def attach_region(self, owner: str, name: str, capacity: int) -> None:
        """Map a reply region of the client whose channel is `owner` (see `_channel.MAX_REGIONS`)."""
        self._channels.attach_region(owner, name, capacity)

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
