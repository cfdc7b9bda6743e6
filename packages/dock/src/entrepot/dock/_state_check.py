"""Checks a dock state (from a file or a caller) in full before any of it reaches the live dock.

Every check raises `DockStateError` naming where the state came from and what is wrong. The checks
are the dock's own invariants (see the state table in _dock.py): shapes against capacity / columns /
consumers, dtypes, a sequence column's lengths against its flat data and its ready bits, and the
statuses of empty rows (not ready, not consumed, age 0, completed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NoReturn

import torch

from entrepot.dock._errors import DockStateError
from entrepot.dock._table import DockTable

FORMAT = 1
REQUIRED_KEYS = frozenset({
    "format", "capacity", "n_samples_per_prompt", "columns_order", "consumers", "columns", "ready",
    "consumed", "live", "age", "completed", "generators", "counts", "rows_got", "wait_s",
})  # fmt: skip
OPTIONAL_KEYS = frozenset({"bytes_got", "born", "policy_version"})  # older states lack them
COUNT_KEYS = frozenset({"puts", "gets", "rows_put"})
_GENERATOR_STATE_BYTES = torch.Generator().get_state().numel()


class StateCheck:
    """The checks of one state against one dock's table; `source` names the state in every error.

    Only the table's settings are read (capacity, columns, consumers, specs), never its rows.
    """

    def __init__(self, table: DockTable, source: str) -> None:
        self.table = table
        self.source = source

    def fail(self, detail: str) -> NoReturn:
        raise DockStateError(self.source, detail)

    def check(self, state: Any) -> None:
        """Raise DockStateError unless `state` is a whole, consistent state of a dock like this one."""
        if not isinstance(state, Mapping):
            self.fail(f"holds a {type(state).__name__}, not a dock state_dict mapping")
        missing, unknown = REQUIRED_KEYS - state.keys(), state.keys() - REQUIRED_KEYS - OPTIONAL_KEYS
        if missing or unknown:
            self.fail(f"missing keys {sorted(missing)}, unknown keys {sorted(map(str, unknown))}")
        self._check_identity(state)
        ready = self.tensor(state, "ready", torch.bool, (len(self.table.columns), self.table.capacity))
        live = self.tensor(state, "live", torch.bool, (self.table.capacity,))
        self._check_statuses(state, ready, live)
        self._check_columns(state["columns"], ready)
        self._check_generators(state["generators"])
        self._check_counters(state)

    def _check_identity(self, state: Mapping[str, Any]) -> None:
        t = self.table
        expected: dict[str, Any] = {
            "format": FORMAT,
            "capacity": t.capacity,
            "n_samples_per_prompt": t.n_samples_per_prompt,
            "columns_order": list(t.columns),
            "consumers": list(t.consumers),
        }
        for key, value in expected.items():
            got = state[key]
            same_type = type(got) is type(value) and (
                not isinstance(got, list) or all(type(item) is str for item in got)
            )
            if not same_type or got != value:
                self.fail(f"has {key}={_short(got)} but this dock has {value!r}")

    def tensor(
        self, state: Mapping[str, Any], key: str, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> torch.Tensor:
        """`state[key]` if it is a dense tensor of `dtype` and `shape`."""
        value = state[key]
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
            self.fail(f"{key} is a {type(value).__name__}, not a dense tensor")
        if value.dtype != dtype or tuple(value.shape) != shape:
            self.fail(f"{key} is {value.dtype} {list(value.shape)}; expected {dtype} {list(shape)}")
        return value

    def _check_statuses(self, state: Mapping[str, Any], ready: torch.Tensor, live: torch.Tensor) -> None:
        """Consumed bits, ages and completed flags; ready and consumed rows must be live."""
        t = self.table
        consumed = self.tensor(state, "consumed", torch.bool, (len(t.consumers), t.capacity))
        age = self.tensor(state, "age", torch.int32, (t.capacity,))
        completed = self.tensor(state, "completed", torch.bool, (t.capacity,))
        for bits, names, what in ((ready, t.columns, "column"), (consumed, t.consumers, "consumer")):
            stray = (bits & ~live).nonzero()
            if stray.numel():
                index, row = stray[0].tolist()
                self.fail(f"{what} {names[index]!r} marks row {row}, which holds no data (not live)")
        if bool((age < 0).any()):
            self.fail(f"age holds a negative value at row {int((age < 0).nonzero()[0])}")
        for bad, what in ((~live & (age != 0), "a nonzero age"), (~live & ~completed, "completed=False")):
            if bool(bad.any()):
                self.fail(f"row {int(bad.nonzero()[0])} holds no data but has {what}")
        self._check_versions(state, live)

    def _check_versions(self, state: Mapping[str, Any], live: torch.Tensor) -> None:
        """The policy version (an int >= 0) and each row's birth version (-1 unset, else <= it)."""
        version = state.get("policy_version", 0)
        if type(version) is not int or version < 0:
            self.fail(f"policy_version is {_short(version)}, not an int >= 0")
        if "born" not in state:
            return
        born = self.tensor(state, "born", torch.int64, (self.table.capacity,))
        bad = (born < -1) | (born > version) | (~live & (born != -1))
        if bool(bad.any()):
            row = int(bad.nonzero()[0])
            self.fail(f"born[{row}] is {int(born[row])}: must be -1 (empty row) or in [0, {version}]")

    def _check_columns(self, columns: Any, ready: torch.Tensor) -> None:
        t = self.table
        if not isinstance(columns, Mapping):
            self.fail(f"columns is a {type(columns).__name__}, not a mapping of column name -> data")
        unknown = [name for name in columns if name not in t.column_index]
        if unknown:
            self.fail(f"holds data of unknown columns {_short(unknown)}; this dock has {t.columns}")
        for name in t.columns:
            column_ready = ready[t.column_index[name]]
            if name in columns:
                self._check_column(name, columns[name], column_ready)
            elif bool(column_ready.any()):
                self.fail(f"column {name!r} has ready rows but no data")

    def _check_column(self, name: str, saved: Any, ready: torch.Tensor) -> None:
        """One column's dtype, kind and data; a sequence column's lengths against data and ready bits."""
        key = f"columns[{name!r}]"
        if not isinstance(saved, Mapping) or type(saved.get("scalar")) is not bool:
            self.fail(f"{key} is not a mapping with a bool 'scalar'")
        fields = {"dtype", "scalar", "values"} if saved["scalar"] else {"dtype", "scalar", "flat", "lengths"}
        if set(saved) != fields:
            self.fail(f"{key} has keys {sorted(map(str, saved))}; expected {sorted(fields)}")
        dtype = self.dtype(key, saved["dtype"])
        spec = self.table.specs[name]
        if spec.dtype is not None and spec.dtype != dtype:
            self.fail(f"{key} stores {dtype} but this dock's column is {spec.dtype}")
        if spec.scalar is not None and spec.scalar != saved["scalar"]:
            kind = "scalar" if spec.scalar else "sequence"
            self.fail(
                f"{key} is {'scalar' if saved['scalar'] else 'sequence'} but this dock's column is {kind}"
            )
        capacity = self.table.capacity
        if saved["scalar"]:
            self.tensor(saved, "values", dtype, (capacity,))
            return
        lengths = self.tensor(saved, "lengths", torch.int64, (capacity,))
        flat = saved["flat"]
        if (
            not isinstance(flat, torch.Tensor)
            or flat.layout != torch.strided
            or flat.dtype != dtype
            or flat.dim() != 1
        ):
            self.fail(f"{key} flat is not a 1-D {dtype} tensor")
        if bool((lengths < 0).any()):
            self.fail(f"{key} has a negative length at row {int((lengths < 0).nonzero()[0])}")
        if bool((lengths[~ready] != 0).any()):
            self.fail(
                f"{key} has a nonzero length at row {int((~ready & (lengths != 0)).nonzero()[0])}, not ready"
            )
        if int(lengths.sum()) != flat.numel():
            self.fail(f"{key} lengths sum to {int(lengths.sum())} but flat holds {flat.numel()} elements")

    def dtype(self, key: str, name: Any) -> torch.dtype:
        """The torch dtype a state names (``"torch.float32"``)."""
        dtype = getattr(torch, name.removeprefix("torch."), None) if isinstance(name, str) else None
        if not isinstance(dtype, torch.dtype):
            self.fail(f"{key} names an unknown dtype {_short(name)}")
        return dtype

    def _check_generators(self, generators: Any) -> None:
        num_consumers = len(self.table.consumers)
        if not isinstance(generators, list) or len(generators) != num_consumers:
            self.fail(f"generators is not a list of {num_consumers} sampler states")
        for k, saved in enumerate(generators):
            if (
                not isinstance(saved, torch.Tensor)
                or saved.dtype != torch.uint8
                or tuple(saved.shape) != (_GENERATOR_STATE_BYTES,)
            ):
                self.fail(f"generators[{k}] is not a uint8 [{_GENERATOR_STATE_BYTES}] sampler state")

    def _check_counters(self, state: Mapping[str, Any]) -> None:
        counts = state["counts"]
        if (
            not isinstance(counts, Mapping)
            or set(counts) != COUNT_KEYS
            or not all(_count(v) for v in counts.values())
        ):
            self.fail(f"counts is not a mapping of {sorted(COUNT_KEYS)} to counts >= 0: {_short(counts)}")
        num_consumers = len(self.table.consumers)
        for key, valid in (("rows_got", _count), ("bytes_got", _count), ("wait_s", _seconds)):
            values = state.get(key, [0] * num_consumers)
            if not isinstance(values, list) or len(values) != num_consumers or not all(map(valid, values)):
                self.fail(f"{key} is not a list of {num_consumers} values >= 0: {_short(values)}")


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _seconds(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def _short(value: Any) -> str:
    """repr of a value from a state, cut to a readable length (a corrupt value may be huge)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
