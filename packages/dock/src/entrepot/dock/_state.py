"""state_dict capture / stage / install for a dock's table (see _table).

The state is plain tensors, ints and strings, so `torch.load(weights_only=True)` reads it back.
Sequence columns are saved compacted: the ready rows' tokens in row order plus lengths [R].
A state is loaded in two halves so that a bad one changes nothing: `stage` checks all of it and builds
new stores off to the side (no lock), `install` swaps them in under the lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from entrepot.dock._columns import ScalarColumn, SequenceColumn
from entrepot.dock._state_check import FORMAT, StateCheck
from entrepot.dock._table import DockTable


def capture(t: DockTable) -> dict[str, Any]:
    """The dock's state as plain tensors and values (called with the lock of table `t` held)."""
    columns: dict[str, Any] = {}
    for name, store in t.stores.items():
        ready = t.ready[t.column_index[name]]
        if store is None:
            continue
        if isinstance(store, ScalarColumn):
            columns[name] = {"dtype": str(store.dtype), "scalar": True, "values": store.values.clone()}
            continue
        rows = ready.nonzero().squeeze(1)
        snap = store.snapshot(rows)
        lengths = torch.zeros(t.capacity, dtype=torch.int64)
        lengths[rows] = snap.lengths
        columns[name] = {
            "dtype": str(store.dtype),
            "scalar": False,
            "flat": snap.gather(),
            "lengths": lengths,
        }
    return {
        "format": FORMAT,
        "capacity": t.capacity,
        "n_samples_per_prompt": t.n_samples_per_prompt,
        "columns_order": list(t.columns),
        "consumers": list(t.consumers),
        "columns": columns,
        "ready": t.ready.clone(),
        "consumed": t.consumed.clone(),
        "live": t.live.clone(),
        "age": t.age.clone(),
        "completed": t.completed.clone(),
        "born": t.born.clone(),
        "policy_version": t.policy_version,
        "generators": [g.get_state() for g in t.generators],
        "counts": dict(t.counts),
        "rows_got": list(t.rows_got),
        "wait_s": list(t.wait_s),
        "bytes_got": list(t.bytes_got),
    }


@dataclass
class Staged:
    """A checked state built into fresh stores and tensors, ready to be swapped into the dock."""

    stores: dict[str, SequenceColumn | ScalarColumn]
    ready: torch.Tensor
    consumed: torch.Tensor
    live: torch.Tensor
    age: torch.Tensor
    completed: torch.Tensor
    born: torch.Tensor
    policy_version: int
    generators: list[torch.Generator]
    counts: dict[str, int]
    rows_got: list[int]
    wait_s: list[float]
    bytes_got: list[int]


def stage(t: DockTable, state: Any, source: str) -> Staged:
    """Check `state` in full against table `t` and build it off to the side (`t` is not touched).

    Needs no lock: it reads only the table's settings (capacity, columns, consumers, specs).
    """
    check = StateCheck(t, source)
    check.check(state)
    stores: dict[str, SequenceColumn | ScalarColumn] = {}
    for name, saved in state["columns"].items():
        dtype = check.dtype(f"columns[{name!r}]", saved["dtype"])
        if saved["scalar"]:
            scalar = ScalarColumn(t.capacity, dtype)
            scalar.values.copy_(saved["values"])
            stores[name] = scalar
            continue
        column = SequenceColumn(t.capacity, dtype)
        ready = state["ready"][t.column_index[name]]
        rows = ready.nonzero().squeeze(1)
        column.write(rows, saved["flat"], saved["lengths"][rows], torch.zeros_like(ready))
        stores[name] = column
    generators = []
    for k, saved_state in enumerate(state["generators"]):
        generator = torch.Generator()
        try:
            generator.set_state(saved_state)
        except RuntimeError as error:
            check.fail(f"generators[{k}] is not a valid sampler state: {error}")
        generators.append(generator)
    return Staged(
        stores=stores,
        **{key: state[key].clone() for key in ("ready", "consumed", "live", "age", "completed")},
        born=state["born"].clone() if "born" in state else torch.full((t.capacity,), -1).long(),
        policy_version=int(state.get("policy_version", 0)),
        generators=generators,
        counts=dict(state["counts"]),
        rows_got=list(state["rows_got"]),
        wait_s=[float(s) for s in state["wait_s"]],
        bytes_got=list(state.get("bytes_got", [0] * len(t.consumers))),
    )


def install(t: DockTable, staged: Staged) -> None:
    """Swap a staged state into table `t` (called with its lock held; nothing here can fail half-way).

    Starts from `t.reset()` so that any state not saved (added later) is fresh, as after `reset`;
    the count of readers copying out of old segments survives (they still finish their copies).
    """
    readers = t.readers
    t.reset()
    t.readers = readers
    t.stores.update(staged.stores)
    t.ready, t.consumed, t.live = staged.ready, staged.consumed, staged.live
    t.age, t.completed, t.born = staged.age, staged.completed, staged.born
    t.policy_version = staged.policy_version
    t.generators = staged.generators
    t.counts.update(staged.counts)
    t.rows_got, t.wait_s, t.bytes_got = staged.rows_got, staged.wait_s, staged.bytes_got
    t.recount()
