"""ShardedDockClient: the DockClient of a dock sharded over Ray nodes (see entrepot.dock.sharded).

It checks each call as one dock would (the same checks, see _checks and `_put.check_put`), then
asks the controller for statuses and moves the rows straight between itself and the shards
(through its `ShardRouter`, see _shard_router). A get that fails after the controller took its rows
(a shard lost, no memory for the batch) gives them back; a put that fails before its commit leaves
no column dtype fixed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from entrepot.dock import _sharded_files
from entrepot.dock._batch import Batch, Layout
from entrepot.dock._checks import check_lease, check_rows, get_request, index_tensor, peek_request
from entrepot.dock._client import RemoteClient
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import DockConfigError, DockShardLostError, InvalidArgumentError
from entrepot.dock._grpo import _fan_out, count_prompts
from entrepot.dock._inputs import ColumnData, normalize_column, scalar_hint_matters
from entrepot.dock._leases import Lease
from entrepot.dock._ledger import Kind
from entrepot.dock._options import FIFO, ZERO_PADDING, Padding, Sampler
from entrepot.dock._put import check_put
from entrepot.dock._shard import DockShard
from entrepot.dock._shard_controller import ShardController
from entrepot.dock._shard_router import ShardRouter

START_TIMEOUT_S = 120.0
"""How long `launch` waits for Ray to place the shards before it gives up naming the free resources."""


class ShardedDockClient(RemoteClient):
    """DockClient for a dock sharded over Ray actors (see entrepot.dock.sharded); picklable."""

    def __init__(
        self,
        controller: Any,
        shards: list[Any],
        shard_nodes: list[str],
        node_names: dict[str, str],
        shard_of_group: torch.Tensor,
        template: ExperienceDock,
    ) -> None:
        self._router = ShardRouter(
            controller, shards, shard_nodes, node_names, shard_of_group, template.n_samples_per_prompt
        )
        self.capacity = template.capacity
        self.n_samples_per_prompt = template.n_samples_per_prompt
        self.rollout_consumer = template.rollout_consumer
        self._specs = dict(template._table.specs)

    @property
    def controller(self) -> Any:
        """The ShardController actor."""
        return self._router.controller

    @property
    def channel_capacities(self) -> list[int]:
        """Bytes of this process's same-node channel to each shard (0: none yet, or through Ray)."""
        return self._router.channel_capacities

    @property
    def channel_writes(self) -> int:
        """Shard writes of this process's puts that went through a same-node channel."""
        return self._router.over_links["write"]

    @property
    def channel_reads(self) -> int:
        """Shard reads of this process's gets and peeks that went through a same-node channel."""
        return self._router.over_links["read"]

    @property
    def shards(self) -> list[Any]:
        """The DockShard actors, in shard order."""
        return self._router.shards

    @property
    def controller_node(self) -> str:
        """The Ray node id of the controller (the node of the process that launched the dock)."""
        return str(self._router.controller_node)

    @property
    def shard_nodes(self) -> list[str]:
        """The Ray node id of each shard."""
        return self._router.shard_nodes

    @property
    def node_names(self) -> dict[str, str]:
        """Ray node id -> a readable name (address and short id)."""
        return self._router.node_names

    @property
    def shard_of_group(self) -> torch.Tensor:
        """int64 [capacity / n_samples_per_prompt] the shard holding each prompt group."""
        return self._router.shard_of_group

    @classmethod
    def launch(
        cls,
        dock_cls: type[ExperienceDock] = ExperienceDock,
        *,
        shards: int | None = None,
        num_cpus: float = 0.25,
        max_concurrency: int = 16,
        **dock_kwargs: Any,
    ) -> ShardedDockClient:
        """Start a controller and `shards` shard actors (None: one per alive node), shard i on node i mod N.

        Args:
            dock_cls: ExperienceDock or a subclass such as GRPODock (settings, columns and consumers).
            shards: number of shards; each holds whole prompt groups, so at most the number of groups.
            num_cpus: CPU request of each actor (they mostly wait and copy memory).
            max_concurrency: threads serving gets in the controller and reads / writes in each shard.
            dock_kwargs: the dock's constructor arguments.
        """
        template = dock_cls(**dock_kwargs)
        nodes = sorted(
            (node for node in ray.nodes() if node["Alive"]),
            key=lambda node: node["NodeID"] != ray.get_runtime_context().get_node_id(),  # ours first
        )
        count = len(nodes) if shards is None else shards
        num_groups = template.capacity // template.n_samples_per_prompt
        if not 1 <= count <= num_groups:
            raise DockConfigError(
                f"shards must be in [1, {num_groups}] (each shard holds whole prompt groups), got {count}"
            )
        shard_nodes = [nodes[i % len(nodes)]["NodeID"] for i in range(count)]
        node_names = {
            node["NodeID"]: f"{node['NodeManagerAddress']} (id {node['NodeID'][:12]})" for node in nodes
        }
        shard_of_group = torch.arange(num_groups) * count // num_groups  # contiguous blocks of groups
        shard_cls = ray.remote(num_cpus=num_cpus, concurrency_groups={"io": max_concurrency})(DockShard)
        actors = [
            shard_cls.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            ).remote(dock_cls, dock_kwargs)
            for node in shard_nodes
        ]
        controller_cls = ray.remote(
            num_cpus=num_cpus, concurrency_groups={"ctl": 4, "take": max_concurrency}
        )(ShardController)
        here = NodeAffinitySchedulingStrategy(node_id=nodes[0]["NodeID"], soft=False)  # the caller's node
        controller = controller_cls.options(scheduling_strategy=here).remote(
            dock_cls, dock_kwargs, shard_of_group, shard_nodes
        )
        client = cls(controller, actors, shard_nodes, node_names, shard_of_group, template)
        try:
            ray.get([actor.node.remote() for actor in actors], timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            client.close()
            raise DockConfigError(
                f"Ray could not start {count} dock shards of {num_cpus} CPU within {START_TIMEOUT_S:.0f} s; "
                f"the cluster has {ray.available_resources()} free"
            ) from None
        return client

    def describe(self) -> str:
        """Where the rows are: ``dock shard 0 on node 10.0.0.1 (id ...), shard 1 on node ...``."""
        where = [
            f"shard {i} on node {self.node_names.get(node, node)}" for i, node in enumerate(self.shard_nodes)
        ]
        return "dock " + ", ".join(where)

    def close(self) -> None:
        """Stop the controller and the shards (the rows are gone)."""
        for actor in [self.controller, *self.shards]:
            ray.kill(actor)

    # ------------------------------------------------------------------ put

    def put(
        self,
        data: Mapping[str, Any],
        indexes: Sequence[int] | torch.Tensor,
        *,
        lengths: Mapping[str, Any] | None = None,
        completed: Sequence[bool] | torch.Tensor | None = None,
        ack: Lease | None = None,
    ) -> None:
        """As ExperienceDock.put: the shards get the data, then the controller marks the cells ready.

        The arguments are checked in one dock's order, so a call with two mistakes names the same one.
        """
        checked = check_put(
            data, indexes, lengths, completed, ack, capacity=self.capacity, columns=self._specs,
            rollout_consumer=self.rollout_consumer, scalar_hints=self._scalar_hints,
        )  # fmt: skip
        if checked.rows.numel() == 0:
            return  # as in one dock: nothing stored, no dtype fixed
        self._put(checked.columns, checked.rows, checked.completed, checked.ack, claimed=False)

    def _scalar_hints(self, data: Mapping[str, Any], lengths: Mapping[str, Any]) -> dict[str, bool | None]:
        """Each column's kind as one dock reads a put: its spec's, else the kind a put fixed (asked of the
        controller only for the forms that read differently as scalars, see `scalar_hint_matters`)."""
        hints = {name: self._specs[name].scalar if name in self._specs else None for name in data}
        ask = [
            name
            for name, hint in hints.items()
            if hint is None and name in self._specs and scalar_hint_matters(data[name], lengths.get(name))
        ]
        if ask:
            known: dict[str, Kind] = self._router.call("kinds")
            hints.update({name: known[name][1] for name in ask if name in known})
        return hints

    def _put(
        self, columns: dict[str, ColumnData], rows: torch.Tensor, done: torch.Tensor | None,
        ack: Lease | None, claimed: bool,
    ) -> None:  # fmt: skip
        """Fix the columns' dtypes in the controller, write the shards, then commit the cells ready."""
        router = self._router
        kinds = {name: (column.dtype, column.scalar) for name, column in columns.items()}
        stored, fixed = router.control("prepare_put", kinds, rows, ack)
        try:
            router.write(columns, stored, rows)
        except BaseException as error:
            if not (isinstance(error, DockShardLostError) and error.part == "controller"):
                router.control("abort_put", list(columns), fixed)
            raise
        lengths = {
            name: torch.zeros(rows.numel(), dtype=torch.int64) if column.lengths is None else column.lengths
            for name, column in columns.items()
        }
        router.control("commit_put", lengths, rows, done, ack, claimed)

    def put_prompts(
        self,
        prompts: Any,
        n_samples_per_prompt: int | None = None,
        *,
        lengths: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> torch.Tensor:
        """GRPODock.put_prompts: P prompts fanned out to their n rows in free groups, spread over shards."""
        n = self.n_samples_per_prompt
        if n_samples_per_prompt is not None and n_samples_per_prompt != n:
            raise InvalidArgumentError(
                f"n_samples_per_prompt is {n} in this dock, got {n_samples_per_prompt}"
            )
        if "prompts" not in self._specs or "prompt_length" not in self._specs:
            raise InvalidArgumentError("put_prompts needs a GRPODock (columns prompts and prompt_length)")
        num_prompts = count_prompts(prompts, lengths)
        if num_prompts == 0:
            return torch.empty(0, dtype=torch.int64)  # as one dock: nothing stored, no dtype fixed
        column = normalize_column("prompts", prompts, lengths, num_prompts, False)
        assert column.lengths is not None  # sequences
        columns = {
            "prompts": _fan_out(column, n),
            "prompt_length": ColumnData(column.lengths.repeat_interleave(n), None),
        }
        extra = dict(extra or {})
        hints = self._scalar_hints(extra, {})
        for name, value in extra.items():
            columns[name] = _fan_out(normalize_column(name, value, None, num_prompts, hints[name]), n)
        rows = self._router.call("claim_groups", num_prompts)
        try:
            self._put(columns, rows, None, None, claimed=True)
        except BaseException as error:
            if not (isinstance(error, DockShardLostError) and error.part == "controller"):
                self._router.call("release_groups", rows)  # the groups are free again for the next put
            raise
        return rows

    # ------------------------------------------------------------------ get

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
        """As ExperienceDock.get: the controller picks rows (this node's shards first); shards send them."""
        request = get_request(
            consumer, columns, count, indexes=indexes, min_count=min_count, timeout=timeout, groups=groups,
            layout=layout, lease=lease, lease_key=lease_key, sampler=sampler, padding=padding,
        )  # fmt: skip
        router = self._router
        reply = router.control("take", request, router.my_node())
        if reply is None:
            return None
        rows, ages, granted, (nbytes, receipt) = reply
        try:
            batch = router.read_batch(request.columns, rows, ages, layout, padding)
        except BaseException as error:  # the rows go back, as in one dock
            if not (isinstance(error, DockShardLostError) and error.part == "controller"):
                router.control("untake", request.consumer, rows, nbytes, granted, receipt)
            raise
        return batch if granted is None else replace(batch, lease=granted)

    def peek(
        self,
        columns: Sequence[str],
        indexes: Sequence[int] | torch.Tensor,
        *,
        layout: Layout = "padded",
        padding: Padding = ZERO_PADDING,
    ) -> Batch:
        """As ExperienceDock.peek: the controller checks the cells are ready, the shards send them."""
        names, rows = peek_request(columns, indexes, layout, padding)
        ages = self._router.call("check_ready", names, rows, layout, padding)
        rows = check_rows(rows, self.capacity)  # valid: the controller checked them
        return self._router.read_batch(names, rows, ages, layout, padding)

    # ------------------------------------------------------------------ statuses

    def ack(self, lease: Lease, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        """ExperienceDock.ack in the controller."""
        check_lease("lease", lease)
        self._router.call("ack", lease, None if indexes is None else index_tensor(indexes))

    def release(self, lease: Lease) -> int:
        """ExperienceDock.release in the controller."""
        return int(self._router.call("release", check_lease("lease", lease)))

    def all_consumed(self, consumer: str) -> bool:
        return bool(self._router.call("all_consumed", consumer))

    def progress(self, consumer: str) -> dict[str, int]:
        result: dict[str, int] = self._router.call("progress", consumer)
        return result

    def finished_rows(self) -> torch.Tensor:
        result: torch.Tensor = self._router.call("finished_rows")
        return result

    def clear(self, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        """ExperienceDock.clear; the shards then drop the rows that left."""
        rows = None if indexes is None else index_tensor(indexes)
        _, dropped = self._router.call("clear", rows)
        self._router.forget(dropped)

    def set_policy_version(self, version: int) -> int:
        """ExperienceDock.set_policy_version; the shards drop the stale groups."""
        stale, dropped = self._router.call("set_policy_version", version)
        self._router.forget(dropped)
        return int(stale)

    def reset(self) -> None:
        self._router.call("reset")
        self._router.on_every_shard("reset")

    def metrics(self) -> dict[str, float]:
        """The controller's metrics, with the bytes the shards hold and the number of shards."""
        out: dict[str, float] = self._router.call("metrics")
        held = self._router.on_every_shard("bytes_held")
        out["dock/bytes_stored"] = float(sum(stored for stored, _ in held))
        out["dock/bytes_allocated"] = float(sum(allocated for _, allocated in held))
        out["dock/shards"] = float(len(self.shards))
        return out

    # ------------------------------------------------------------------ files

    def save(self, path: str) -> None:
        """Every status and row to one file at `path` (written by this process), then its manifest."""
        _sharded_files.save(self._router, path)

    def load(self, path: str) -> None:
        """Restore a `save`, into any number of shards; `DockStateError` naming the file if it does not fit.

        The file is checked in full first, so a bad one changes nothing.
        """
        _sharded_files.load(self._router, path, self.capacity, self._specs)
