"""state_dict capture / restore for ExperienceDock (called with the dock lock held).

The state is plain tensors, ints and strings, so `torch.load(weights_only=True)` reads it back.
Sequence columns are saved compacted: the ready rows' tokens in row order plus lengths [R].
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from entrepot.dock._columns import ScalarColumn, SequenceColumn
from entrepot.dock._errors import DockConfigError

if TYPE_CHECKING:
    from entrepot.dock._lifecycle import DockLifecycle

_FORMAT = 1


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise DockConfigError(f"state names an unknown dtype {name!r}")
    return dtype


def capture(dock: DockLifecycle) -> dict[str, Any]:
    columns: dict[str, Any] = {}
    for name, store in dock._stores.items():
        ready = dock._ready[dock._column_index[name]]
        if store is None:
            continue
        if isinstance(store, ScalarColumn):
            columns[name] = {"dtype": str(store.dtype), "scalar": True, "values": store.values.clone()}
            continue
        rows = ready.nonzero().squeeze(1)
        snap = store.snapshot(rows)
        lengths = torch.zeros(dock.capacity, dtype=torch.int64)
        lengths[rows] = snap.lengths
        columns[name] = {
            "dtype": str(store.dtype),
            "scalar": False,
            "flat": snap.gather(),
            "lengths": lengths,
        }
    return {
        "format": _FORMAT,
        "capacity": dock.capacity,
        "n_samples_per_prompt": dock.n_samples_per_prompt,
        "columns_order": list(dock.columns),
        "consumers": list(dock.consumers),
        "columns": columns,
        "ready": dock._ready.clone(),
        "consumed": dock._consumed.clone(),
        "live": dock._live.clone(),
        "age": dock._age.clone(),
        "completed": dock._completed.clone(),
        "generators": [g.get_state() for g in dock._generators],
        "counts": dict(dock._counts),
        "rows_got": list(dock._rows_got),
        "wait_s": list(dock._wait_s),
        "bytes_got": list(dock._bytes_got),
    }


def restore(dock: DockLifecycle, state: Mapping[str, Any]) -> None:
    expected = {
        "format": _FORMAT,
        "capacity": dock.capacity,
        "n_samples_per_prompt": dock.n_samples_per_prompt,
        "columns_order": list(dock.columns),
        "consumers": list(dock.consumers),
    }
    for key, value in expected.items():
        if state.get(key) != value:
            raise DockConfigError(f"state has {key}={state.get(key)!r} but this dock has {value!r}")
    dock._init_state()
    for name, saved in state["columns"].items():
        dtype = _dtype(saved["dtype"])
        if saved["scalar"]:
            scalar = ScalarColumn(dock.capacity, dtype)
            scalar.values.copy_(saved["values"])
            dock._stores[name] = scalar
            continue
        column = SequenceColumn(dock.capacity, dtype)
        ready = state["ready"][dock._column_index[name]]
        rows = ready.nonzero().squeeze(1)
        column.write(rows, saved["flat"], saved["lengths"][rows], torch.zeros_like(ready))
        dock._stores[name] = column
    dock._ready.copy_(state["ready"])
    dock._consumed.copy_(state["consumed"])
    dock._live.copy_(state["live"])
    dock._age.copy_(state["age"])
    dock._completed.copy_(state["completed"])
    for generator, saved_state in zip(dock._generators, state["generators"], strict=True):
        generator.set_state(saved_state)
    dock._counts.update(state["counts"])
    dock._rows_got = list(state["rows_got"])
    # states saved by dock 0.1.0 lack it
    dock._bytes_got = list(state.get("bytes_got", [0] * len(dock.consumers)))
    dock._wait_s = list(state["wait_s"])
    dock._recount()
