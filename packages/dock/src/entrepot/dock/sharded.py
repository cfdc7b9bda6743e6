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

The parts, each in its own module: the controller (_shard_controller), the shard (_shard), the
client (_sharded_client), its routing of rows to shards and the Ray calls (_shard_router), and
save / load (_sharded_files).
"""

from __future__ import annotations

from entrepot.dock import _install

try:
    import ray  # noqa: F401 - checked here, used by the modules below
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"entrepot.dock.sharded needs Ray: {_install.RAY}") from error

from entrepot.dock._shard import DockShard
from entrepot.dock._shard_controller import COMMIT_WINDOW_S, ShardController
from entrepot.dock._sharded_client import ShardedDockClient

__all__ = ["COMMIT_WINDOW_S", "DockShard", "ShardController", "ShardedDockClient"]
