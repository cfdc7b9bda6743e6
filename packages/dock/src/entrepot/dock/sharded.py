"""A dock sharded over Ray nodes: data in shard actors, statuses in one controller (extra `ray`).

    client = ShardedDockClient.launch(GRPODock, shards=2, prompts_num=256, n_samples_per_prompt=8)
    rows = client.put_prompts(prompts)
    batch = client.get("actor_rollout", ["prompts"], 64)

Same calls, arguments and guarantees as `ExperienceDock` (it is a `DockClient`), with the rows spread:

- **Shards** (`DockShard`, one per node by default) each hold the data of a contiguous block of
  prompt groups, one per node, pinned there. A shard is an ExperienceDock used as a store only.
- **The controller** (`ShardController`) holds a `Ledger`: the ready / consumed / lease bookkeeping
  of every row, with row lengths instead of data (see _ledger). It hands out row indexes and never
  sees a tensor's data.
- **Clients** move data straight between themselves and the shards as one zero-copy buffer per shard
  and call (see _wire). A put writes the shards first and then commits the cells ready in the
  controller, so a get never finds a ready cell whose data is not there yet. A get takes rows in
  the controller, then reads each shard holding some of them in parallel.
- **Locality**: a get looks first at rows held on the caller's node, and `put_prompts` spreads new
  prompt groups round robin over the shards, so each node's workers mostly read and write their own
  node's shard.

What sharding changes:
- `put_prompts` takes free groups round robin over the shards, not the lowest free groups as one dock
  does: the rows it returns differ (the same prompts, fanned out the same way) unless it fills every
  free group. Likewise, on several nodes a get takes the rows held on its node first, so its FIFO
  order differs from one dock's.
- A put is three calls (the controller fixes the column dtypes, so every shard stores a column in
  one dtype; the shards write; the controller commits) and a get two (take, read), where one dock
  actor takes one each. A put that acks a lease keeps the lease from expiring while it writes
  (`COMMIT_WINDOW_S`); a put slower than that can fail its commit with `LeaseError` after writing
  the shards, leaving cells that were already ready holding the new values and its column dtypes
  fixed.
- `clear` / `set_policy_version` drop rows in the controller, then in the shards; don't put into
  rows that a clear is dropping from another process at the same moment.
- `save` / `load` go through the caller, into one verified file: a checkpoint survives the loss of
  a node, and loads into a dock with a different number of shards.
- A shard or controller that died raises `DockShardLostError` naming its node; a get that fails so
  gives its rows back to the consumer first.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("entrepot.dock.sharded needs Ray: pip install 'entrepot-dock[ray]'") from error

from entrepot.dock._batch import LAYOUTS, Batch, Layout, build_batch
from entrepot.dock._columns import SequenceColumn
from entrepot.dock._dock import ExperienceDock, completed_flags
from entrepot.dock._errors import (
    DockConfigError,
    DockShardLostError,
    DockStateError,
    InvalidArgumentError,
    NotReadyError,
    UnknownColumnError,
)
from entrepot.dock._files import read_verified, write_verified
from entrepot.dock._grpo import _fan_out, count_prompts
from entrepot.dock._inputs import (
    ColumnData,
    as_index_tensor,
    normalize_column,
    normalize_put,
    scalar_hint_matters,
)
from entrepot.dock._leases import Lease
from entrepot.dock._ledger import Kind, Ledger
from entrepot.dock._rowcopy import RowSource, gather_into
from entrepot.dock._wire import WireLayout, as_uint8, decode, encode_columns, encode_taken

__all__ = ["COMMIT_WINDOW_S", "DockShard", "ShardController", "ShardedDockClient"]

COMMIT_WINDOW_S = 60.0
"""How long a put that acks a lease keeps the lease from expiring while it writes to the shards."""

START_TIMEOUT_S = 120.0
"""How long `launch` waits for Ray to place the shards before it gives up naming the free resources."""

FORMAT = "entrepot-sharded-dock/1"

_CALLS = frozenset(
    {
        "ack", "release", "all_consumed", "progress", "finished_rows", "set_policy_version", "clear",
        "reset", "metrics", "check_ready", "claim_groups", "release_groups", "state", "load_state", "kinds",
    }
)  # fmt: skip


class ShardController:
    """The statuses of every row (a `Ledger`); a plain class made a Ray actor by `ShardedDockClient`."""

    def __init__(
        self, dock_cls: type[ExperienceDock], dock_kwargs: dict[str, Any], shard_of_group: torch.Tensor,
        shard_nodes: list[str],
    ) -> None:  # fmt: skip
        torch.set_num_threads(1)
        self._ledger = Ledger(dock_cls(**dock_kwargs), shard_of_group)
        self._shard_nodes = shard_nodes
        self._local_rows: dict[str | None, torch.Tensor | None] = {}

    @ray.method(concurrency_group="ctl")
    def prepare_put(self, kinds: dict[str, Kind], rows: torch.Tensor, ack: Lease | None) -> dict[str, Kind]:
        """Check a put's lease, then its column kinds (one dock's order), and fix its column dtypes.

        A put refused here changes nothing: the lease is checked before any dtype is fixed, and is
        kept from expiring only once the put is accepted.
        """
        ledger = self._ledger
        with ledger._cond:
            if ack is not None:
                ledger.check_lease(ack, rows)
            fixed = ledger.kinds.fix(kinds)
            if ack is not None:
                ledger.pin(ack, COMMIT_WINDOW_S)
        return fixed

    @ray.method(concurrency_group="ctl")
    def commit_put(
        self, lengths: dict[str, torch.Tensor], rows: torch.Tensor, completed: torch.Tensor | None,
        ack: Lease | None, claimed: bool,
    ) -> None:  # fmt: skip
        """Mark the cells of a put ready (the shards hold its data now)."""
        try:
            self._ledger.put(lengths, rows, completed=completed, ack=ack)
        finally:
            if claimed:
                self._ledger.release_groups(rows)

    @ray.method(concurrency_group="take")
    def take(
        self, consumer: str, columns: list[str], count: int, kwargs: dict[str, Any], node: str | None
    ) -> tuple[torch.Tensor, torch.Tensor, Lease | None] | None:
        """Select and mark rows for a get (rows on `node` first): (rows, ages, lease), or None when done."""
        ledger = self._ledger
        taken = ledger.take_preferring(self._rows_on(node), consumer, columns, count, **kwargs)
        if taken is None:
            return None
        ledger._done_reading()  # the ledger's "data" (lengths) were copied by the snapshot
        return taken.rows, taken.ages, taken.lease

    @ray.method(concurrency_group="ctl")
    def untake(self, consumer: str, rows: torch.Tensor, ages: torch.Tensor, lease: Lease | None) -> None:
        """Give back the rows of a get that failed after `take` (a shard was lost)."""
        from entrepot.dock._taken import Taken

        self._ledger._untake(consumer, Taken(rows, {}, ages, lease))

    @ray.method(concurrency_group="ctl")
    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        """Run one of the controller's calls (`_CALLS`); anything else is an `InvalidArgumentError`."""
        if method not in _CALLS:
            raise InvalidArgumentError(f"sharded dock controller has no call {method!r}")
        if method in ("clear", "set_policy_version"):
            return self._dropping(method, *args)
        if method == "check_ready":
            return self._check_ready(*args)
        if method == "state":
            return self._ledger.state_dict(), self._ledger.kinds.known()
        if method == "load_state":
            return self._load_state(*args)
        if method == "kinds":
            return self._ledger.kinds.known()
        return getattr(self._ledger, method)(*args)

    def _dropping(self, method: str, *args: Any) -> tuple[Any, torch.Tensor]:
        """(result, rows that left the dock) of clear / set_policy_version, for the shards to forget."""
        ledger = self._ledger
        with ledger._cond:
            before = ledger._live.clone()
            result = getattr(ledger, method)(*args)
            return result, (before & ~ledger._live).nonzero().squeeze(1)

    def _check_ready(self, columns: list[str], indexes: Any) -> torch.Tensor:
        """The ages of rows `indexes` once every cell is ready, else `NotReadyError` naming one (a peek).

        The columns are checked before the indexes, as in one dock."""
        ledger = self._ledger
        col_ids = ledger._check_columns(columns)
        rows = as_index_tensor(indexes, ledger.capacity)
        with ledger._cond:
            for name, c in zip(columns, col_ids, strict=True):
                missing = (~ledger._ready[c, rows]).nonzero()
                if missing.numel():
                    raise NotReadyError(name, int(rows[missing[0, 0]]))
            return ledger._age[rows].clone()

    def _load_state(self, state: dict[str, Any], kinds: dict[str, Kind]) -> None:
        self._ledger.load_state_dict(state)
        self._ledger.kinds.reset()
        self._ledger.kinds.fix(kinds)

    def _rows_on(self, node: str | None) -> torch.Tensor | None:
        """bool [capacity] rows whose shard runs on `node` (None: no shard there, or all are there)."""
        if node not in self._local_rows:
            shards = [s for s, where in enumerate(self._shard_nodes) if where == node]
            if not shards or len(shards) == len(self._shard_nodes):
                self._local_rows[node] = None
            else:
                ledger = self._ledger
                local = torch.isin(ledger.shard_of_group, torch.tensor(shards))
                self._local_rows[node] = local.repeat_interleave(ledger.n_samples_per_prompt)
        return self._local_rows[node]


class DockShard:
    """The data of one block of rows: an ExperienceDock used as a store (statuses are the controller's)."""

    def __init__(self, dock_cls: type[ExperienceDock], dock_kwargs: dict[str, Any]) -> None:
        torch.set_num_threads(1)
        template = dock_cls(**dock_kwargs)
        self._dock = ExperienceDock(template.capacity, columns=template._specs, consumers=["shard"])

    def node(self) -> str:
        """The Ray node id this shard runs on."""
        return str(ray.get_runtime_context().get_node_id())

    @ray.method(concurrency_group="io")
    def write(self, layout: WireLayout, buffer: Any, rows: torch.Tensor) -> None:
        """Store a put's rows (the wire buffer holds them in `rows` order)."""
        _, raw, _ = decode(layout, as_uint8(buffer))
        self._dock.put(
            {name: flat if lengths is None else (flat, lengths) for name, (flat, lengths) in raw.items()},
            rows,
        )

    @ray.method(concurrency_group="io")
    def read(self, columns: list[str], rows: torch.Tensor) -> tuple[WireLayout, Any]:
        """`rows` of `columns` as one wire buffer, in `rows` order."""
        dock = self._dock
        with dock._cond:
            for name in columns:
                missing = (~dock._ready[dock._column_index[name], rows]).nonzero()
                if missing.numel():  # the controller said ready: the shard lost the data
                    raise NotReadyError(name, int(rows[missing[0, 0]]))
            taken = dock._snapshot(columns, rows)
        try:
            layout, buffer = encode_taken(taken)
        finally:
            dock._done_reading()
        return layout, buffer.numpy()

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
        for store in self._dock._stores.values():
            if isinstance(store, SequenceColumn):
                stored += store.nbytes_live
            if store is not None:
                allocated += store.nbytes_allocated
        return stored, allocated


class ShardedDockClient:
    """DockClient for a dock sharded over Ray actors (see the module docstring); picklable."""

    def __init__(
        self,
        controller: Any,
        shards: list[Any],
        shard_nodes: list[str],
        node_names: dict[str, str],
        shard_of_group: torch.Tensor,
        template: ExperienceDock,
    ) -> None:
        self.controller = controller
        self.shards = shards
        self.shard_nodes = shard_nodes
        self.controller_node = ray.get_runtime_context().get_node_id()  # where `launch` puts it
        self.node_names = node_names
        self.shard_of_group = shard_of_group
        self.capacity = template.capacity
        self.n_samples_per_prompt = template.n_samples_per_prompt
        self.rollout_consumer = template.rollout_consumer
        self._specs = dict(template._specs)
        self._node: str | None = None

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

    # ------------------------------------------------------------------ Ray calls

    def _lost(self, part: int | None, error: Exception) -> DockShardLostError:
        """The error for a dead shard `part` (None: the controller, on the launching caller's node)."""
        node_id = self.controller_node if part is None else self.shard_nodes[part]
        what = "controller" if part is None else f"shard {part}"
        return DockShardLostError(
            what, self.node_names.get(node_id, node_id), str(error).splitlines()[0][:200]
        )

    def _gather(self, refs: list[Any], parts: Sequence[int | None]) -> list[Any]:
        """ray.get of calls to the actors `parts` (shard index, None: the controller); a dead actor
        raises `DockShardLostError` naming its node, a dock error raised there comes back as itself."""
        out = []
        for ref, part in zip(refs, parts, strict=True):
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayActorError as error:
                raise self._lost(part, error) from None
            except ray.exceptions.RayTaskError as error:
                raise error.cause from None
        return out

    def _call(self, method: str, *args: Any) -> Any:
        return self._gather([self.controller.call.remote(method, args)], [None])[0]

    def _my_node(self) -> str:
        if self._node is None:
            self._node = str(ray.get_runtime_context().get_node_id())
        return self._node

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_node": None}  # the node of whoever unpickles it

    def _by_shard(self, rows: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(shard, positions in `rows` it holds) for every shard holding some of `rows`."""
        if rows.numel() == 0:
            return []
        shard = self.shard_of_group[rows // self.n_samples_per_prompt]
        if bool((shard == shard[0]).all()):
            return [(int(shard[0]), torch.arange(rows.numel()))]
        return [(int(s), (shard == s).nonzero().squeeze(1)) for s in shard.unique().tolist()]

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
        rows = as_index_tensor(indexes, self.capacity)
        data = dict(data.items())  # a TensorDict iterates over rows, not keys
        if not data:
            raise InvalidArgumentError("put needs at least one column")
        for name in data:
            if name not in self._specs:
                raise UnknownColumnError(name, list(self._specs))
        done = completed_flags(completed, rows.numel(), self.rollout_consumer)
        if rows.numel() == 0:
            return  # as in one dock: nothing stored, no dtype fixed
        columns = normalize_put(data, lengths, rows.numel(), self._scalar_hints(data, lengths or {}))
        self._put(columns, rows, done, ack, claimed=False)

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
            known: dict[str, Kind] = self._call("kinds")
            hints.update({name: known[name][1] for name in ask if name in known})
        return hints

    def _put(
        self, columns: dict[str, ColumnData], rows: torch.Tensor, done: torch.Tensor | None,
        ack: Lease | None, claimed: bool,
    ) -> None:  # fmt: skip
        kinds = {name: (column.dtype, column.scalar) for name, column in columns.items()}
        fixed = self._gather([self.controller.prepare_put.remote(kinds, rows, ack)], [None])[0]
        parts = self._by_shard(rows)
        refs = [self.shards[s].write.remote(*self._wire(columns, fixed, at, len(parts) > 1), rows[at])
                for s, at in parts]  # fmt: skip
        self._gather(refs, [s for s, _ in parts])
        lengths = {
            name: torch.zeros(rows.numel(), dtype=torch.int64) if column.lengths is None else column.lengths
            for name, column in columns.items()
        }
        self._gather([self.controller.commit_put.remote(lengths, rows, done, ack, claimed)], [None])

    @staticmethod
    def _wire(
        columns: dict[str, ColumnData], kinds: dict[str, Kind], at: torch.Tensor, subset: bool
    ) -> tuple[WireLayout, Any]:
        """Rows `at` of the columns as one buffer, each in its stored dtype (the rows' only copy here)."""
        picked = {name: column.select(at) if subset else column for name, column in columns.items()}
        layout, buffer = encode_columns(picked, {name: kind[0] for name, kind in kinds.items()})
        return layout, buffer.numpy()

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
        rows = self._call("claim_groups", num_prompts)
        try:
            self._put(columns, rows, None, None, claimed=True)
        except BaseException as error:
            if not (isinstance(error, DockShardLostError) and error.part == "controller"):
                self._call("release_groups", rows)  # the groups are free again for the next put
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
        sampler: Any = "fifo",
        num_ranks: int = 1,
        layout: Layout = "padded",
        pad_value: float = 0,
        pad_multiple: int = 1,
        lease: float | None = None,
        lease_key: str | None = None,
    ) -> Batch | None:
        """As ExperienceDock.get: the controller picks rows (this node's shards first); shards send them."""
        if layout not in LAYOUTS:
            raise InvalidArgumentError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if pad_multiple < 1:
            raise InvalidArgumentError(f"pad_multiple must be >= 1, got {pad_multiple}")
        kwargs = {
            "indexes": None if indexes is None else torch.as_tensor(indexes),
            "min_count": min_count, "timeout": timeout, "groups": groups, "sampler": sampler,
            "num_ranks": num_ranks, "lease": lease, "lease_key": lease_key,
        }  # fmt: skip
        names = columns if isinstance(columns, str) else list(columns)  # a str: the controller says so
        ref = self.controller.take.remote(consumer, names, count, kwargs, self._my_node())
        reply = self._gather([ref], [None])[0]
        if reply is None:
            return None
        rows, ages, granted = reply
        try:
            raw = self._read(list(columns), rows, layout)
        except BaseException:
            self._gather([self.controller.untake.remote(consumer, rows, ages, granted)], [None])
            raise
        batch = build_batch(rows, raw, ages, layout, pad_value, pad_multiple)
        return batch if granted is None else replace(batch, lease=granted)

    def peek(
        self,
        columns: Sequence[str],
        indexes: Sequence[int] | torch.Tensor,
        *,
        layout: Layout = "padded",
        pad_value: float = 0,
        pad_multiple: int = 1,
    ) -> Batch:
        """As ExperienceDock.peek: the controller checks the cells are ready, the shards send them."""
        if layout not in LAYOUTS:
            raise InvalidArgumentError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        names = columns if isinstance(columns, str) else list(columns)
        ages = self._call("check_ready", names, torch.as_tensor(indexes))
        rows = as_index_tensor(indexes, self.capacity)  # valid: the controller checked them
        raw = self._read(list(columns), rows, layout)
        return build_batch(rows, raw, ages, layout, pad_value, pad_multiple)

    def _read(self, columns: list[str], rows: torch.Tensor, layout: str) -> dict[str, tuple[Any, Any]]:
        """column -> (values or RowSource, lengths | None) of `rows`, in `rows` order, read from the shards.

        The shards' buffers arrive zero-copy; each row is copied once out of them (into the padded
        tensor by build_batch, or here into the packed flat tensor).
        """
        if rows.numel() == 0:  # no shard to ask: the controller knows each column's dtype and kind
            kinds: dict[str, Kind] = self._call("kinds")
            empty: dict[str, tuple[Any, Any]] = {}
            for name in columns:
                dtype, scalar = kinds.get(name, (torch.float32, True))  # (a column never put: float)
                empty[name] = (
                    torch.empty(0, dtype=dtype),
                    None if scalar else torch.empty(0, dtype=torch.int64),
                )
            return empty
        parts = self._by_shard(rows)
        replies = self._gather(
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

    # ------------------------------------------------------------------ statuses

    def ack(self, lease: Lease, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        """ExperienceDock.ack in the controller."""
        self._call("ack", lease, None if indexes is None else torch.as_tensor(indexes))

    def release(self, lease: Lease) -> int:
        """ExperienceDock.release in the controller."""
        return int(self._call("release", lease))

    def all_consumed(self, consumer: str) -> bool:
        return bool(self._call("all_consumed", consumer))

    def progress(self, consumer: str) -> dict[str, int]:
        result: dict[str, int] = self._call("progress", consumer)
        return result

    def finished_rows(self) -> torch.Tensor:
        result: torch.Tensor = self._call("finished_rows")
        return result

    def clear(self, indexes: Sequence[int] | torch.Tensor | None = None) -> None:
        """ExperienceDock.clear; the shards then drop the rows that left."""
        rows = None if indexes is None else torch.as_tensor(indexes)
        _, dropped = self._call("clear", rows)
        self._forget(dropped)

    def set_policy_version(self, version: int) -> int:
        """ExperienceDock.set_policy_version; the shards drop the stale groups."""
        stale, dropped = self._call("set_policy_version", version)
        self._forget(dropped)
        return int(stale)

    def _forget(self, rows: torch.Tensor) -> None:
        if rows.numel():
            parts = self._by_shard(rows)
            self._gather([self.shards[s].forget.remote(rows[at]) for s, at in parts], [s for s, _ in parts])

    def reset(self) -> None:
        self._call("reset")
        self._gather([shard.reset.remote() for shard in self.shards], range(len(self.shards)))

    def metrics(self) -> dict[str, float]:
        """The controller's metrics, with the bytes the shards hold and the number of shards."""
        out: dict[str, float] = self._call("metrics")
        held = self._gather([shard.bytes_held.remote() for shard in self.shards], range(len(self.shards)))
        out["dock/bytes_stored"] = float(sum(stored for stored, _ in held))
        out["dock/bytes_allocated"] = float(sum(allocated for _, allocated in held))
        out["dock/shards"] = float(len(self.shards))
        return out

    # ------------------------------------------------------------------ files

    def save(self, path: str) -> None:
        """Every status and row to one file at `path` (written by this process), then its manifest."""
        ledger, kinds = self._call("state")
        shards = self._gather([shard.state_dict.remote() for shard in self.shards], range(len(self.shards)))
        state = {
            "format": FORMAT, "ledger": ledger, "shards": shards,
            "kinds": {name: (str(dtype).removeprefix("torch."), scalar)
                      for name, (dtype, scalar) in kinds.items()},
        }  # fmt: skip
        write_verified(path, lambda file: torch.save(state, file))

    def load(self, path: str) -> None:
        """Restore a `save`, into any number of shards; `DockStateError` naming the file if it does not fit.

        The file is checked in full first, so a bad one changes nothing.
        """
        source = f"sharded dock file {str(path)!r}"
        data = read_verified(path, source)
        try:
            state = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as error:
            raise DockStateError(source, f"is not a dock state ({type(error).__name__}: {error})") from error
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise DockStateError(source, f"is not a sharded dock state (format {FORMAT})")
        stores = [self._store_from(shard_state, source) for shard_state in state["shards"]]
        kinds = {name: (getattr(torch, dtype), scalar) for name, (dtype, scalar) in state["kinds"].items()}
        self._call("load_state", state["ledger"], kinds)
        self._gather([shard.reset.remote() for shard in self.shards], range(len(self.shards)))
        for store in stores:
            self._copy_rows(store, kinds)

    def _store_from(self, shard_state: Any, source: str) -> ExperienceDock:
        store = ExperienceDock(self.capacity, columns=self._specs, consumers=["shard"])
        try:
            store.load_state_dict(shard_state)
        except DockStateError as error:
            raise DockStateError(source, f"a shard's rows do not fit this dock ({error})") from None
        return store

    def _copy_rows(self, store: ExperienceDock, kinds: dict[str, Kind]) -> None:
        """Write every ready cell of `store` (a saved shard) to the shards holding those rows now."""
        for name in store.columns:
            rows = store._ready[store._column_index[name]].nonzero().squeeze(1)
            if not rows.numel():
                continue
            batch = store.peek([name], rows, layout="packed")
            scalar = name not in batch.lengths
            column = ColumnData(batch.columns[name], None if scalar else batch.lengths[name])
            parts = self._by_shard(rows)
            subset = len(parts) > 1
            refs = [self.shards[s].write.remote(*self._wire({name: column}, kinds, at, subset), rows[at])
                    for s, at in parts]  # fmt: skip
            self._gather(refs, [s for s, _ in parts])
