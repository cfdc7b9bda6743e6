"""How a sharded dock's client reaches its rows: which shard holds them, the Ray calls that move them.

The client (see _sharded_client) decides what to put and get; a `ShardRouter` knows where: the
controller and shard actors, the node each runs on, and which shard holds each prompt group. It
writes a put's rows to their shards and reads a get's rows back, one buffer per shard and call
(see _wire), and turns a dead actor into `DockShardLostError` naming its node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray
import torch

from entrepot.dock._errors import DockShardLostError
from entrepot.dock._inputs import ColumnData
from entrepot.dock._ledger import Kind
from entrepot.dock._rowcopy import RowSource, gather_into
from entrepot.dock._wire import WireLayout, as_uint8, decode, encode_columns


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

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_node": None}  # the node of whoever unpickles it

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
        return self.gather([self.controller.call.remote(method, args)], [None])[0]

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
        its stored dtype `kinds[name][0]`. Every shard's buffer is made before any is sent, so a put
        that cannot get memory here (`DockMemoryError`) sends nothing."""
        parts = self.by_shard(rows)
        payloads = [_wire(columns, kinds, at, len(parts) > 1) for _, at in parts]
        refs = [
            self.shards[s].write.remote(*payload, rows[at])
            for (s, at), payload in zip(parts, payloads, strict=True)
        ]
        self.gather(refs, [s for s, _ in parts])

    def forget(self, rows: torch.Tensor) -> None:
        """Drop `rows` (rows that left the dock) in the shards holding them."""
        if rows.numel():
            parts = self.by_shard(rows)
            self.gather([self.shards[s].forget.remote(rows[at]) for s, at in parts], [s for s, _ in parts])

    def read(self, columns: list[str], rows: torch.Tensor, layout: str) -> dict[str, tuple[Any, Any]]:
        """column -> (values or RowSource, lengths | None) of `rows`, in `rows` order, read from the shards.

        The shards' buffers arrive zero-copy; each row is copied once out of them (into the padded
        tensor by build_batch, or here into the packed flat tensor).
        """
        if rows.numel() == 0:  # no shard to ask: the controller knows each column's dtype and kind
            kinds: dict[str, Kind] = self.call("kinds")
            empty: dict[str, tuple[Any, Any]] = {}
            for name in columns:
                dtype, scalar = kinds.get(name, (torch.float32, True))  # (a column never put: float)
                empty[name] = (
                    torch.empty(0, dtype=dtype),
                    None if scalar else torch.empty(0, dtype=torch.int64),
                )
            return empty
        parts = self.by_shard(rows)
        replies = self.gather(
            [self.shards[s].read.remote(columns, rows[at]) for s, at in parts], [s for s, _ in parts]
        )
        decoded = [decode(wire, as_uint8(array))[1] for wire, array in replies]
        num_rows = rows.numel()
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


def _wire(
    columns: dict[str, ColumnData], kinds: dict[str, Kind], at: torch.Tensor, subset: bool
) -> tuple[WireLayout, Any]:
    """Rows `at` of the columns as one buffer, each in its stored dtype (the rows' only copy here)."""
    picked = {name: column.select(at) if subset else column for name, column in columns.items()}
    layout, buffer = encode_columns(picked, {name: kind[0] for name, kind in kinds.items()})
    return layout, buffer.numpy()
