"""DockShard: the data of one block of a sharded dock's rows, in one Ray actor (extra `ray`).

A shard is an ExperienceDock used as a store only: the statuses are the controller's (see
_shard_controller). Clients write a put's rows to it and read a get's rows from it, one wire
buffer per call (see _wire): through Ray, or a client on its node through a same-node channel
whose calls come over the channel's link (see _channel_table).
"""

from __future__ import annotations

from typing import Any

import ray
import torch

from entrepot.dock._channel_table import ChannelTable
from entrepot.dock._columns import SequenceColumn
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import InvalidArgumentError, NotReadyError
from entrepot.dock._wire import WireLayout, as_uint8, decode, taken_layout, write_taken


class DockShard:
    """The data of one block of rows: an ExperienceDock used as a store (statuses are the controller's)."""

    def __init__(self, dock_cls: type[ExperienceDock], dock_kwargs: dict[str, Any]) -> None:
        torch.set_num_threads(1)
        template = dock_cls(**dock_kwargs)
        self._dock = ExperienceDock(template.capacity, columns=template._table.specs, consumers=["shard"])
        self._channels = ChannelTable()

    def node(self) -> str:
        """The Ray node id this shard runs on."""
        return str(ray.get_runtime_context().get_node_id())

    @ray.method(concurrency_group="io")
    def write(self, layout: WireLayout, buffer: Any, rows: torch.Tensor) -> None:
        """Store a put's rows (the wire buffer holds them in `rows` order)."""
        self._store(layout, as_uint8(buffer), rows)

    def _store(self, layout: WireLayout, source: torch.Tensor, rows: torch.Tensor) -> None:
        _, raw, _ = decode(layout, source)
        self._dock.put(
            {name: flat if lengths is None else (flat, lengths) for name, (flat, lengths) in raw.items()},
            rows,
        )

    @ray.method(concurrency_group="io")
    def read(self, columns: list[str], rows: torch.Tensor) -> tuple[WireLayout, Any]:
        """`rows` of `columns` as one wire buffer, in `rows` order."""
        reply = self._read(columns, rows, None)
        assert reply is not None  # without a channel the rows always have a buffer
        return reply

    def _read(
        self, columns: list[str], rows: torch.Tensor, channel: str | None
    ) -> tuple[WireLayout, Any] | None:
        """`rows` of `columns` into channel `channel` when it has room (buffer None), else (no channel)
        into a new buffer; None when the channel is unknown or too small."""
        t = self._dock._table
        with t.cond:
            for name in columns:
                missing = (~t.ready[t.column_index[name], rows]).nonzero()
                if missing.numel():  # the controller said ready: the shard lost the data
                    raise NotReadyError(name, int(rows[missing[0, 0]]))
            taken = t.snapshot(columns, rows)
        try:
            layout = taken_layout(taken)
            if channel is None:
                out: torch.Tensor | None = torch.empty(layout.nbytes, dtype=torch.uint8)
            else:
                out = self._channels.room(channel, layout.nbytes)
            if out is None:
                return None
            write_taken(taken, layout, out)
        finally:
            t.done_reading()
        return layout, out.numpy() if channel is None else None

    @ray.method(concurrency_group="io")
    def node_id(self) -> str:
        """The Ray node this shard runs on (a client on the same node may open a channel)."""
        return self.node()

    @ray.method(concurrency_group="io")
    def attach_channel(self, name: str, capacity: int, link: str | None = None) -> None:
        """Map a client's shared-memory channel and serve the writes and reads that come over its
        `link` socket (see _link)."""
        self._channels.attach(name, capacity, link, self._link_call)

    @ray.method(concurrency_group="io")
    def detach_channel(self, name: str) -> None:
        self._channels.detach(name)

    def _link_call(self, channel: str, message: tuple[Any, ...]) -> Any:
        """A write or read that came over channel `channel`'s link: ("write", layout, rows) or
        ("read", columns, rows); None when the channel cannot take it (the client then sends it
        through Ray)."""
        kind, first, rows = message
        if kind == "write":
            source = self._channels.room(channel, first.nbytes)
            if source is None:
                return None
            self._store(first, source, rows)
            return True
        if kind == "read":
            return self._read(first, rows, channel)
        raise InvalidArgumentError(f"dock link call {kind!r} is not one of 'write', 'read'")

    @ray.method(concurrency_group="io")
    def forget(self, rows: torch.Tensor) -> None:
        """Drop rows that left the dock."""
        if rows.numel():
            self._dock.clear(rows)

    @ray.method(concurrency_group="io")
    def reset(self) -> None:
        self._dock.reset()

    @ray.method(concurrency_group="io")
    def state_dict(self) -> dict[str, Any]:
        return self._dock.state_dict()

    @ray.method(concurrency_group="io")
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._dock.load_state_dict(state)

    @ray.method(concurrency_group="io")
    def bytes_held(self) -> tuple[int, int]:
        """(bytes of live rows, bytes allocated) over the shard's sequence and scalar columns."""
        stored = allocated = 0
        for store in self._dock._table.stores.values():
            if isinstance(store, SequenceColumn):
                stored += store.nbytes_live
            if store is not None:
                allocated += store.nbytes_allocated
        return stored, allocated
