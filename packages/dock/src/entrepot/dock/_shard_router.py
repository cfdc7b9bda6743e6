"""How a sharded dock's client reaches its rows: which shard holds them, the calls that move them.

The client (see _sharded_client) decides what to put and get; a `ShardRouter` knows where: the
controller and shard actors, the node each runs on, and which shard holds each prompt group. It
writes a put's rows to their shards and reads a get's rows back, one buffer per shard and call
(see _wire), and turns a dead actor into `DockShardLostError` naming its node.

A shard on this process's node gets a same-node channel, as a Ray dock client's actor does (see
_ray_channel): after a call of 1 MiB or more to it went through Ray, the rows of the calls that fit
go through shared memory and the call itself over the channel's socket (see _link). Calls to
several shards are all sent before any reply is awaited, so the shards work at the same time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
import torch

from entrepot.dock._batch import Batch, Layout, build_batch
from entrepot.dock._channel import Channel
from entrepot.dock._errors import DockShardLostError
from entrepot.dock._inputs import ColumnData
from entrepot.dock._ledger import Kind
from entrepot.dock._link import LinkClosed
from entrepot.dock._options import Padding
from entrepot.dock._ray_channel import ActorLink, ClientChannel
from entrepot.dock._rowcopy import RowSource, gather_into
from entrepot.dock._wire import as_uint8, column_buffer, columns_layout, decode, write_columns


class ShardRouter:
    """The actors of one sharded dock and the calls to them; picklable (each process finds its node).

    Args:
        controller: the ShardController actor (on the node of the process that launched the dock).
        shards: the DockShard actors, shard i holding the groups `shard_of_group` gives it.
        shard_nodes: the Ray node id of each shard.
        node_names: node id -> a readable name for errors and `describe` (address and short id).
        shard_of_group: int64 [capacity / n_samples_per_prompt] the shard holding each prompt group.
        n_samples_per_prompt: rows per prompt group.
    """

    def __init__(
        self,
        controller: Any,
        shards: list[Any],
        shard_nodes: list[str],
        node_names: dict[str, str],
        shard_of_group: torch.Tensor,
        n_samples_per_prompt: int,
    ) -> None:
        self.controller = controller
        self.shards = shards
        self.shard_nodes = shard_nodes
        self.controller_node = ray.get_runtime_context().get_node_id()  # where `launch` puts it
        self.node_names = node_names
        self.shard_of_group = shard_of_group
        self.n_samples_per_prompt = n_samples_per_prompt
        self._node: str | None = None
        self._channels = self._new_channels()
        self._controller_link = ActorLink(controller, self.controller_node)
        self.over_links = {"write": 0, "read": 0}
        """Shard writes and reads this process sent over a channel's link (the rest went through Ray)."""

    def __getstate__(self) -> dict[str, Any]:
        state = {**self.__dict__, "_node": None, "_channels": None, "_controller_link": None}  # each its own
        return {**state, "over_links": {"write": 0, "read": 0}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._channels = self._new_channels()
        self._controller_link = ActorLink(self.controller, self.controller_node)

    def _new_channels(self) -> list[ClientChannel]:
        """A (not yet made) same-node channel per shard, see _ray_channel."""
        return [
            ClientChannel(shard, True, node)
            for shard, node in zip(self.shards, self.shard_nodes, strict=True)
        ]

    @property
    def channel_capacities(self) -> list[int]:
        """Bytes of each shard's same-node channel (0: none yet, or calls to it travel through Ray)."""
        return [channel.capacity for channel in self._channels]

    # ------------------------------------------------------------------ Ray calls

    def lost(self, part: int | None, error: Exception) -> DockShardLostError:
        """The error for a dead shard `part` (None: the controller, on the launching caller's node)."""
        node_id = self.controller_node if part is None else self.shard_nodes[part]
        what = "controller" if part is None else f"shard {part}"
        return DockShardLostError(
            what, self.node_names.get(node_id, node_id), str(error).splitlines()[0][:200]
        )

    def gather(self, refs: list[Any], parts: Sequence[int | None]) -> list[Any]:
        """ray.get of calls to the actors `parts` (shard index, None: the controller); a dead actor
        raises `DockShardLostError` naming its node, a dock error raised there comes back as itself."""
        out = []
        for ref, part in zip(refs, parts, strict=True):
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayActorError as error:
                raise self.lost(part, error) from None
            except ray.exceptions.RayTaskError as error:
                raise error.cause from None
        return out

    def call(self, method: str, *args: Any) -> Any:
        """One of the controller's calls (see ShardController.call)."""
        return self.control("call", method, args)

    def control(self, method: str, *args: Any) -> Any:
        """Controller method `method`: over this process's link to it when it runs on this node (see
        _link), else through Ray. A link that closed means the controller is gone: the call then
        goes through Ray, which names it lost."""
        if self._controller_link.claim():
            try:
                return self._controller_link.call((method, args))
            except LinkClosed:
                pass
            finally:
                self._controller_link.release()
        return self.gather([getattr(self.controller, method).remote(*args)], [None])[0]

    def on_every_shard(self, method: str) -> list[Any]:
        """Shard method `method` (no arguments) run on every shard; their results in shard order."""
        refs = [getattr(shard, method).remote() for shard in self.shards]
        return self.gather(refs, range(len(self.shards)))

    def my_node(self) -> str:
        """The Ray node of this process (asked once per process)."""
        if self._node is None:
            self._node = str(ray.get_runtime_context().get_node_id())
        return self._node

    def by_shard(self, rows: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(shard, positions in `rows` it holds) for every shard holding some of `rows`."""
        if rows.numel() == 0:
            return []
        shard = self.shard_of_group[rows // self.n_samples_per_prompt]
        if bool((shard == shard[0]).all()):
            return [(int(shard[0]), torch.arange(rows.numel()))]
        return [(int(s), (shard == s).nonzero().squeeze(1)) for s in shard.unique().tolist()]

    # ------------------------------------------------------------------ rows to and from the shards

    def write(self, columns: dict[str, ColumnData], kinds: dict[str, Kind], rows: torch.Tensor) -> None:
        """Store `columns` (one value per row of `rows`) in the shards holding the rows, each column in
        its stored dtype `kinds[name][0]`. Every shard's rows are in its channel or in a buffer before
        any call is sent, so a put that cannot get memory here (`DockMemoryError`) sends nothing."""
        parts = self.by_shard(rows)
        dtypes = {name: kind[0] for name, kind in kinds.items()}
        calls: list[_Call] = []
        try:
            for s, at in parts:
                picked = {n: c.select(at) if len(parts) > 1 else c for n, c in columns.items()}
                layout = columns_layout(picked, dtypes)
                call = self._claim(s, ("write", layout, rows[at]), layout.nbytes)
                calls.append(call)
                call.buffer = column_buffer(picked, layout) if call.room is None else call.room
                write_columns(picked, layout, call.buffer)

            def through_ray(call: _Call) -> Any:
                _, layout, shard_rows = call.message
                assert call.buffer is not None  # written above
                return self.shards[call.shard].write.remote(layout, call.buffer.numpy(), shard_rows)

            self._exchange(calls, through_ray)
        finally:
            self._release(calls)

    def forget(self, rows: torch.Tensor) -> None:
        """Drop `rows` (rows that left the dock) in the shards holding them."""
        if rows.numel():
            parts = self.by_shard(rows)
            self.gather([self.shards[s].forget.remote(rows[at]) for s, at in parts], [s for s, _ in parts])

    def read_batch(
        self, columns: list[str], rows: torch.Tensor, ages: torch.Tensor, layout: Layout, padding: Padding
    ) -> Batch:
        """The batch of `rows` (in `rows` order) of `columns`, read from the shards that hold them.

        The shards' rows arrive in this process's channels, or as Ray's zero-copy buffers; each row
        is copied once out of them (into the padded tensor by build_batch, or into the packed flat
        tensor by `_assemble`) before the channels are free for the next call.
        """
        if rows.numel() == 0:  # no shard to ask: the controller knows each column's dtype and kind
            raw = self._empty_columns(columns)
            return build_batch(rows, raw, ages, layout, padding.value, padding.multiple)
        parts = self.by_shard(rows)
        calls = [self._claim(s, ("read", columns, rows[at])) for s, at in parts]
        try:
            self._exchange(calls, lambda call: self.shards[call.shard].read.remote(columns, call.message[2]))
            decoded = []
            for call in calls:
                wire, array = call.reply
                call.nbytes = wire.nbytes
                if array is None:  # the shard wrote the rows into the channel
                    assert call.shared is not None
                    decoded.append(decode(wire, call.shared.buffer.narrow(0, 0, wire.nbytes))[1])
                else:
                    decoded.append(decode(wire, as_uint8(array))[1])
            raw = _assemble(columns, parts, decoded, rows.numel(), layout)
            return build_batch(rows, raw, ages, layout, padding.value, padding.multiple)
        finally:
            self._release(calls)

    def _empty_columns(self, columns: list[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        kinds: dict[str, Kind] = self.call("kinds")
        empty: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        for name in columns:
            dtype, scalar = kinds.get(name, (torch.float32, True))  # (a column never put: float)
            empty[name] = (torch.empty(0, dtype=dtype), None if scalar else torch.empty(0, dtype=torch.int64))
        return empty

    # ------------------------------------------------------------------ channel or Ray, per call

    def _claim(self, shard: int, message: tuple[Any, ...], nbytes: int | None = None) -> _Call:
        """Shard `shard`'s part of a call, holding its channel when it has one (with room for
        `nbytes`, when the rows are sent: a write); else its part goes through Ray."""
        client = self._channels[shard]
        shared = client.claim()
        if shared is not None and nbytes is not None and shared.capacity < nbytes:
            client.release()
            shared = None
        call = _Call(shard, message, None if shared is None else client, shared, nbytes or 0)
        if shared is not None and nbytes is not None:
            call.room = shared.buffer.narrow(0, 0, nbytes)
        return call

    def _exchange(self, calls: list[_Call], through_ray: Callable[[_Call], Any]) -> None:
        """Send every part (over its link, else `through_ray(part)`), then collect each reply into
        `call.reply`. A part whose link closed (its shard dropped the channel between calls, or
        died: then the Ray call names it) or that the shard could not take through its channel
        (reply None) goes through Ray. The first error is raised once every reply is in, so no link
        is left holding an unread reply."""
        for call in calls:
            if call.channel is not None:
                try:
                    call.channel.send(call.message)
                    continue
                except LinkClosed:
                    call.drop()
            call.ref = through_ray(call)
        first: BaseException | None = None
        for call in calls:
            if call.ref is not None:
                continue
            assert call.channel is not None  # sent over its link above
            try:
                call.reply = call.channel.receive()
            except LinkClosed:
                call.drop()
                call.ref = through_ray(call)
            except BaseException as error:  # the shard's error
                first = first or error
            else:
                if call.reply is None:
                    call.ref = through_ray(call)
                else:
                    self.over_links[call.message[0]] += 1
        for call in calls:
            if call.ref is not None:
                try:
                    call.reply = self.gather([call.ref], [call.shard])[0]
                except BaseException as error:
                    first = first or error
        if first is not None:
            raise first

    def _release(self, calls: list[_Call]) -> None:
        """Free the channels the calls held; where a part went through Ray, make (or grow) its channel."""
        for call in calls:
            if call.channel is not None:
                call.channel.release()
        for call in calls:
            if call.ref is not None and call.nbytes:
                self._channels[call.shard].fit(call.nbytes, call.shared)


@dataclass
class _Call:
    """One shard's part of a put or get: over its channel's link while `channel` is claimed (its
    shared memory `shared`, the rows' bytes `room`), else through Ray (`ref`)."""

    shard: int
    message: tuple[Any, ...]
    channel: ClientChannel | None
    shared: Channel | None
    nbytes: int  # the rows' bytes (a write's, or a read reply's once known): what a channel must hold
    room: torch.Tensor | None = None
    buffer: torch.Tensor | None = None
    ref: Any = None
    reply: Any = None

    def drop(self) -> None:
        """Its link closed: forget the channel (the part goes through Ray; a new channel follows)."""
        assert self.channel is not None
        self.channel.drop()


def _assemble(
    columns: list[str], parts: list[tuple[int, torch.Tensor]], decoded: list[Any], num_rows: int, layout: str
) -> dict[str, tuple[Any, Any]]:
    """column -> (values or RowSource, lengths | None) of all rows, in order, from each shard's part."""
    out: dict[str, tuple[Any, Any]] = {}
    for name in columns:
        first_flat, first_lengths = decoded[0][name]
        if first_lengths is None:
            values = torch.empty(num_rows, dtype=first_flat.dtype)
            for (_, at), raw in zip(parts, decoded, strict=True):
                values[at] = raw[name][0]
            out[name] = (values, None)
            continue
        lengths = torch.empty(num_rows, dtype=torch.int64)
        which = torch.empty(num_rows, dtype=torch.int64)
        starts = torch.empty(num_rows, dtype=torch.int64)
        for j, ((_, at), raw) in enumerate(zip(parts, decoded, strict=True)):
            part_lengths = raw[name][1]
            assert part_lengths is not None  # every shard stores the column as sequences
            lengths[at] = part_lengths
            which[at] = j
            starts[at] = torch.cumsum(part_lengths, 0) - part_lengths
        source = RowSource([raw[name][0] for raw in decoded], which, starts, lengths)
        if layout == "padded":
            out[name] = (source, lengths)
        else:
            flat = torch.empty(int(lengths.sum()), dtype=first_flat.dtype)
            gather_into(source, flat)
            out[name] = (flat, lengths)
    return out
