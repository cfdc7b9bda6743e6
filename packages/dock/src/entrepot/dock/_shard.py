"""DockShard: the data of one block of a sharded dock's rows, in one Ray actor (extra `ray`).

A shard is an ExperienceDock used as a store only: the statuses are the controller's (see
_shard_controller). Clients write a put's rows to it and read a get's rows from it, one wire
buffer per call (see _wire).
"""

from __future__ import annotations

from typing import Any

import ray
import torch

from entrepot.dock._columns import SequenceColumn
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import NotReadyError
from entrepot.dock._wire import WireLayout, as_uint8, decode, encode_taken


class DockShard:
    """The data of one block of rows: an ExperienceDock used as a store (statuses are the controller's)."""

    def __init__(self, dock_cls: type[ExperienceDock], dock_kwargs: dict[str, Any]) -> None:
        torch.set_num_threads(1)
        template = dock_cls(**dock_kwargs)
        self._dock = ExperienceDock(template.capacity, columns=template._table.specs, consumers=["shard"])

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
        t = self._dock._table
        with t.cond:
            for name in columns:
                missing = (~t.ready[t.column_index[name], rows]).nonzero()
                if missing.numel():  # the controller said ready: the shard lost the data
                    raise NotReadyError(name, int(rows[missing[0, 0]]))
            taken = t.snapshot(columns, rows)
        try:
            layout, buffer = encode_taken(taken)
        finally:
            t.done_reading()
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
        for store in self._dock._table.stores.values():
            if isinstance(store, SequenceColumn):
                stored += store.nbytes_live
            if store is not None:
                allocated += store.nbytes_allocated
        return stored, allocated
