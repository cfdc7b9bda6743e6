"""RayDockClient: the DockClient of a dock in a `DockActor` (extra `ray`; see entrepot.dock.ray).

Data crosses Ray as one uint8 buffer per call (see _wire), or through the client's same-node
channel when it has one (see _ray_channel); the client lays a get's batch out of it here.

It behaves as one in-process dock: it checks every argument first, as one dock does (see _checks
and `_put.check_put`), so a bad call raises the same typed error and sends nothing; a dock error
raised in the actor comes back as itself, not in Ray's wrapper; a get whose batch cannot be laid
out here gives its rows back; and a dead actor is a `DockShardLostError` naming its node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import ray
import torch

from entrepot.dock._batch import Batch, Layout, build_batch
from entrepot.dock._checks import GetRequest, check_lease, get_request, index_tensor, peek_request
from entrepot.dock._client import RemoteClient
from entrepot.dock._columns import ColumnSpec
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import DockError, DockShardLostError
from entrepot.dock._grpo import count_prompts
from entrepot.dock._inputs import normalize_column, scalar_hint_matters
from entrepot.dock._leases import Lease
from entrepot.dock._link import LinkClosed
from entrepot.dock._options import FIFO, ZERO_PADDING, Padding, Sampler
from entrepot.dock._put import check_put
from entrepot.dock._ray_actor import DockActor
from entrepot.dock._ray_channel import ClientChannel
from entrepot.dock._wire import (
    GetReply,
    WireLayout,
    as_uint8,
    batch_of,
    column_buffer,
    columns_layout,
    decode,
    views,
    write_columns,
)

_NOT_SENT = object()
"""`_over_link`'s answer for a call the actor did not run."""

Settings = tuple[int, dict[str, ColumnSpec], str | None]
"""(capacity, column specs, rollout consumer) of the actor's dock: what a put is checked against."""


class RayDockClient(RemoteClient):
    """DockClient for a dock living in a `DockActor`; same arguments and results as ExperienceDock.

    With `channel` (the default), a client on the actor's node moves puts and get replies of 1 MiB
    or more through a shared-memory channel (see `_channel`), created after the first such call and
    grown when one outgrows it; elsewhere, or with `channel=False`, through Ray's object store.
    `channel_puts` / `channel_gets` count the calls that used the channel, `region_gets` the gets
    handed out as views of a reply region. Pickling drops the
    channel: each process makes its own.

    `node` (or, from `launch`, `node_of`: the actor's pending answer to `node_id`) says where the actor
    runs: the error for a dead actor names it. `settings` are the dock's capacity, column specs and
    rollout consumer (asked of the actor on the first put when not given).
    """

    def __init__(
        self, actor: Any, channel: bool = True, node: str | None = None, settings: Settings | None = None,
        node_of: Any = None,
    ) -> None:  # fmt: skip
        self.actor = actor
        self._node = node
        self._node_of = node_of
        self._settings = settings
        self._channel = ClientChannel(actor, channel)
        self.channel_gets = 0
        self.channel_puts = 0
        self.region_gets = 0

    def __getstate__(self) -> dict[str, Any]:
        known = self._node is not None or (
            self._node_of is not None and ray.wait([self._node_of], timeout=0)[0]
        )
        return {
            "actor": self.actor, "channel": self._channel.enabled, "node": self.node if known else None,
            "settings": self._settings,
        }  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        RayDockClient.__init__(self, state["actor"], state["channel"], state["node"], state["settings"])

    @property
    def node(self) -> str | None:
        """Where the actor runs, ``10.0.0.1 (id 0123456789ab)`` (None: not known to this client).

        From `launch`, the first read waits until the actor runs (launch itself does not wait).
        """
        if self._node is None and self._node_of is not None:
            try:
                self._node = node_name(ray.get(self._node_of))
            except ray.exceptions.RayError:  # it died before it answered
                self._node_of = None
        return self._node

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
        template = dock_cls(**dock_kwargs)  # a bad setting raises here, not in the actor
        settings = (template.capacity, dict(template._table.specs), template.rollout_consumer)
        actor_cls = ray.remote(num_cpus=num_cpus, concurrency_groups={"put": 4, "get": max_concurrency})(
            DockActor
        )
        options = {} if name is None else {"name": name}
        actor = actor_cls.options(**options).remote(dock_cls, dock_kwargs, files_root=files_root)
        return cls(actor, channel=channel, settings=settings, node_of=actor.node_id.remote())

    def _wait(self, ref: Any) -> Any:
        """ray.get of a call to the actor: a dock error raised there comes back as itself (not in Ray's
        wrapper, whose message leads with the actor's traceback); a dead actor is a
        `DockShardLostError` naming its node."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, DockError):
                raise error.cause from None
            raise
        except ray.exceptions.RayActorError as error:
            text = str(error)
            found = re.search(r"\bip: (\S+)", text)
            node = self.node or (found.group(1) if found else "unknown (Ray did not say)")
            raise DockShardLostError("actor", node, text.splitlines()[0][:200]) from None

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._wait(self.actor.call.remote(method, args, kwargs))

    def _dock_settings(self) -> Settings:
        if self._settings is None:
            self._settings = self._wait(self.actor.settings.remote())
        return self._settings

    def _scalar_hints(self, data: Mapping[str, Any], lengths: Mapping[str, Any]) -> dict[str, bool | None]:
        """Each column's kind as the dock reads a put: its spec's, else the kind a put fixed (asked of
        the actor only for the forms that read differently as scalars, see `scalar_hint_matters`)."""
        specs = self._dock_settings()[1]
        hints = {name: specs[name].scalar if name in specs else None for name in data}
        ask = [
            name for name, hint in hints.items()
            if hint is None and scalar_hint_matters(data[name], lengths.get(name))
        ]  # fmt: skip
        if ask:
            hints.update(self._wait(self.actor.scalar_kinds.remote(ask)))
        return hints

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
        capacity, specs, rollout_consumer = self._dock_settings()
        checked = check_put(
            data, indexes, lengths, completed, ack, capacity=capacity, columns=specs,
            rollout_consumer=rollout_consumer, scalar_hints=self._scalar_hints,
        )  # fmt: skip
        columns, rows, done, ack = checked.columns, checked.rows, checked.completed, checked.ack
        if rows.numel() == 0:
            return  # as one dock: nothing stored, no dtype fixed
        layout = columns_layout(columns)
        channel = self._channel.claim()
        try:
            if channel is not None and channel.capacity >= layout.nbytes:
                write_columns(columns, layout, channel.buffer.narrow(0, 0, layout.nbytes))
                message = ("put", layout, rows, done, ack)
                if self._over_link(message) is True:  # False: the actor did not know the channel
                    self.channel_puts += 1
                    return
        finally:
            if channel is not None:
                self._channel.release()
        buffer = column_buffer(columns, layout)
        write_columns(columns, layout, buffer)
        self._wait(self.actor.put_wire.remote(layout, buffer.numpy(), rows, done, ack))
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
        """As ExperienceDock.get. Through the channel, the batch comes laid out in a free reply region
        and its tensors view it (see `_ray_channel.Region`); otherwise the rows arrive as one buffer
        (the channel's, or Ray's zero-copy one) and are laid out here.

        A lease's clock runs in the actor: a reply lost on its way here (this process died) is
        handed out again when the lease expires.
        """
        request = get_request(
            consumer, columns, count, indexes=indexes, min_count=min_count, timeout=timeout, groups=groups,
            layout=layout, lease=lease, lease_key=lease_key, sampler=sampler, padding=padding,
        )  # fmt: skip
        channel = self._channel.claim()
        region = None if channel is None else self._channel.region()
        try:
            message = ("get", request, None if region is None else region.channel.name)
            reply: GetReply | None = _NOT_SENT if channel is None else self._over_link(message)  # type: ignore[assignment]
            if reply is _NOT_SENT:  # no channel, or its link closed before this get was run
                reply = self._wait(self.actor.get_wire.remote(request, None))
            if reply is None:
                return None
            if reply.in_region:
                assert region is not None  # the actor writes a batch only into a region offered
                batch = batch_of(reply.layout, region.view(reply.layout.nbytes), layout)
                region = None  # busy until the batch is gone
                self.channel_gets += 1
                self.region_gets += 1
            else:
                batch = self._laid_out(reply, channel, request, padding)
        finally:
            if region is not None:
                region.busy = False  # not used by this get
            if channel is not None:
                self._channel.release()
        if reply.array is not None:
            self._channel.fit(reply.layout.nbytes, channel)
        elif reply.region_bytes and not reply.in_region:
            self._channel.fit_region(reply.region_bytes)
        return batch if reply.lease is None else replace(batch, lease=reply.lease)

    def _laid_out(self, reply: GetReply, channel: Any, request: GetRequest, padding: Padding) -> Batch:
        """The batch of a reply in the wire format (in the channel, or Ray's buffer), copied out of
        it; if that fails, the rows go back to the actor first, as in one dock."""
        if reply.array is None:
            assert channel is not None  # the actor writes into a channel only when offered one
            buffer = channel.buffer.narrow(0, 0, reply.layout.nbytes)
            self.channel_gets += 1
        else:
            buffer = as_uint8(reply.array)
        try:
            return _copied_batch(reply.layout, buffer, request.layout, padding)
        except BaseException as error:
            rows = views(reply.layout, buffer)["rows"].clone()
            try:
                self._wait(
                    self.actor.untake_wire.remote(
                        request.consumer, rows, reply.nbytes, reply.lease, reply.receipt
                    )
                )
            except Exception as lost:
                error.add_note(f"giving the rows back failed too: {lost!r}")
            raise

    def _over_link(self, message: tuple[Any, ...]) -> Any:
        """A put or get through the claimed channel's link (see _link); `_NOT_SENT` when the link
        closed with the actor alive (it dropped the channel between calls: the call was not run,
        so the caller sends it through Ray). A dead actor is `DockShardLostError` naming its node."""
        try:
            return self._channel.call(message)
        except LinkClosed:
            self._wait(self.actor.node_id.remote())  # raises DockShardLostError if the actor died
            self._channel.drop()
            return _NOT_SENT

    def ack(self, lease: Lease, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        """ExperienceDock.ack in the actor."""
        check_lease("lease", lease)
        self._call("ack", lease, None if indexes is None else index_tensor(indexes))

    def release(self, lease: Lease) -> int:
        """ExperienceDock.release in the actor."""
        return int(self._call("release", check_lease("lease", lease)))

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
        names, rows = peek_request(columns, indexes, layout, padding)
        result: Batch = self._call("peek", names, rows, layout=layout, padding=padding)
        return result

    def all_consumed(self, consumer: str) -> bool:
        return bool(self._call("all_consumed", consumer))

    def progress(self, consumer: str) -> dict[str, int]:
        result: dict[str, int] = self._call("progress", consumer)
        return result

    def clear(self, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        self._call("clear", None if indexes is None else index_tensor(indexes))

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
        self._call("load", path)


def node_name(node_id: str) -> str:
    """A Ray node as errors and `describe` name it: ``10.0.0.1 (id 0123456789ab)``."""
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return f"{node['NodeManagerAddress']} (id {node_id[:12]})"
    return f"id {node_id[:12]}"


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
