"""state_dict capture / stage / install for ExperienceDock.

The state is plain tensors, ints and strings, so `torch.load(weights_only=True)` reads it back.
Sequence columns are saved compacted: the ready rows' tokens in row order plus lengths [R].
A state is loaded in two halves so that a bad one changes nothing: `stage` checks all of it and builds
new stores off to the side (no lock), `install` swaps them in under the lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from entrepot.dock._columns import ScalarColumn, SequenceColumn
from entrepot.dock._state_check import FORMAT, StateCheck

if TYPE_CHECKING:
    from entrepot.dock._lifecycle import DockLifecycle


def capture(dock: DockLifecycle) -> dict[str, Any]:
    """The dock's state as plain tensors and values (called with the dock lock held)."""
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
        "format": FORMAT,
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
        "born": dock._born.clone(),
        "policy_version": dock.policy_version,
        "generators": [g.get_state() for g in dock._generators],
        "counts": dict(dock._counts),
        "rows_got": list(dock._rows_got),
        "wait_s": list(dock._wait_s),
        "bytes_got": list(dock._bytes_got),
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


def stage(dock: DockLifecycle, state: Any, source: str) -> Staged:
    """Check `state` in full against `dock` and build it off to the side (the dock is not touched).

    Needs no lock: it reads only the dock's fixed shape (capacity, columns, consumers, specs).
    """
    check = StateCheck(dock, source)
    check.check(state)
    stores: dict[str, SequenceColumn | ScalarColumn] = {}
    for name, saved in state["columns"].items():
        dtype = check.dtype(f"columns[{name!r}]", saved["dtype"])
        if saved["scalar"]:
            scalar = ScalarColumn(dock.capacity, dtype)
            scalar.values.copy_(saved["values"])
            stores[name] = scalar
            continue
        column = SequenceColumn(dock.capacity, dtype)
        ready = state["ready"][dock._column_index[name]]
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
        born=state["born"].clone() if "born" in state else torch.full((dock.capacity,), -1).long(),
        policy_version=int(state.get("policy_version", 0)),
        generators=generators,
        counts=dict(state["counts"]),
        rows_got=list(state["rows_got"]),
        wait_s=[float(s) for s in state["wait_s"]],
        bytes_got=list(state.get("bytes_got", [0] * len(dock.consumers))),
    )


def install(dock: DockLifecycle, staged: Staged) -> None:
    """Swap a staged state in (called with the dock lock held; nothing here can fail half-way).

    Starts from `_init_state` so that any state not saved (added later) is fresh, as after `reset`;
    the count of readers copying out of old segments survives (they still finish their copies).
    """
    readers = dock._readers
    dock._init_state()
    dock._readers = readers
    dock._stores.update(staged.stores)
    dock._ready, dock._consumed, dock._live = staged.ready, staged.consumed, staged.live
    dock._age, dock._completed, dock._born = staged.age, staged.completed, staged.born
    dock.policy_version = staged.policy_version
    dock._generators = staged.generators
    dock._counts.update(staged.counts)
    dock._rows_got, dock._wait_s, dock._bytes_got = staged.rows_got, staged.wait_s, staged.bytes_got
    dock._recount()
