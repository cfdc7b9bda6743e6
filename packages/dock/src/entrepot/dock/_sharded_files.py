"""Save and load of a sharded dock: every status and row in one verified file, through the caller.

The file holds the controller's ledger state, each shard's state and the column kinds. It is
written by the calling process (a checkpoint survives the loss of a node) and loads into a sharded
dock with any number of shards: the saved shards' rows are written to whichever shards hold those
rows now.
"""

from __future__ import annotations

import io
from typing import Any

import torch

from entrepot.dock._columns import ColumnSpec
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import DockStateError
from entrepot.dock._files import read_verified, write_verified
from entrepot.dock._inputs import ColumnData
from entrepot.dock._ledger import Kind
from entrepot.dock._shard_router import ShardRouter

FORMAT = "entrepot-sharded-dock/1"


def save(router: ShardRouter, path: str) -> None:
    """Every status and row to one file at `path` (written by this process), then its manifest."""
    ledger, kinds = router.call("state")
    shards = router.on_every_shard("state_dict")
    state = {
        "format": FORMAT, "ledger": ledger, "shards": shards,
        "kinds": {name: (str(dtype).removeprefix("torch."), scalar)
                  for name, (dtype, scalar) in kinds.items()},
    }  # fmt: skip
    write_verified(path, lambda file: torch.save(state, file))


def load(router: ShardRouter, path: str, capacity: int, specs: dict[str, ColumnSpec]) -> None:
    """Restore a `save`, into any number of shards; `DockStateError` naming the file if it does not fit.

    The file is checked in full first (against a dock of `capacity` rows and columns `specs`), so a
    bad one changes nothing.
    """
    source = f"sharded dock file {str(path)!r}"
    data = read_verified(path, source)
    try:
        state = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:
        raise DockStateError(source, f"is not a dock state ({type(error).__name__}: {error})") from error
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise DockStateError(source, f"is not a sharded dock state (format {FORMAT})")
    stores = [_store_from(shard_state, source, capacity, specs) for shard_state in state["shards"]]
    kinds = {name: (getattr(torch, dtype), scalar) for name, (dtype, scalar) in state["kinds"].items()}
    router.call("load_state", state["ledger"], kinds)
    router.on_every_shard("reset")
    for store in stores:
        _copy_rows(router, store, kinds)


def _store_from(shard_state: Any, source: str, capacity: int, specs: dict[str, ColumnSpec]) -> ExperienceDock:
    store = ExperienceDock(capacity, columns=specs, consumers=["shard"])
    try:
        store.load_state_dict(shard_state)
    except DockStateError as error:
        raise DockStateError(source, f"a shard's rows do not fit this dock ({error})") from None
    return store


def _copy_rows(router: ShardRouter, store: ExperienceDock, kinds: dict[str, Kind]) -> None:
    """Write every ready cell of `store` (a saved shard) to the shards holding those rows now."""
    t = store._table
    for name in store.columns:
        rows = t.ready[t.column_index[name]].nonzero().squeeze(1)
        if not rows.numel():
            continue
        batch = store.peek([name], rows, layout="packed")
        scalar = name not in batch.lengths
        column = ColumnData(batch.columns[name], None if scalar else batch.lengths[name])
        router.write({name: column}, kinds, rows)
