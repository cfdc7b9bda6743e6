"""The bad-input catalogue: one table of calls every dock client must refuse, and what they must say.

Each case is data: a method, its arguments, the typed error it must raise and the text its message
must name (the argument, or the column / consumer / index at fault). Every client runs the whole
table (in-process: test_bad_inputs.py, the unit tier; Ray and sharded: test_sharded_parity.py) on a
dock made by `DOCK_KWARGS` and `prepare`, and every case must leave that dock exactly as it was.

Also the state helpers the tests compare docks with (`dock_snapshot`, `assert_same_state`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from entrepot.dock import (
    AlreadyConsumedError,
    ArgumentTypeError,
    ColumnLayoutError,
    DockError,
    DockMemoryError,
    DuplicateIndexError,
    GroupSizeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    Lease,
    LeaseError,
    LengthMismatchError,
    Padding,
    RowCountMismatchError,
    UnknownColumnError,
    UnknownConsumerError,
)

# ---------------------------------------------------------------------- comparing docks


def dock_snapshot(dock: Any) -> dict[str, Any]:
    """Everything observable about a dock's rows and statuses (state_dict without counters)."""
    state = dock.state_dict()
    for key in ("counts", "rows_got", "wait_s", "bytes_got"):
        state.pop(key)
    return state


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Deep equality of two state_dicts (tensors compared exactly)."""
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        elif key == "columns":
            assert a[key].keys() == b[key].keys()
            for name, col in a[key].items():
                for field_name, value in col.items():
                    if isinstance(value, torch.Tensor):
                        assert torch.equal(value, b[key][name][field_name]), (name, field_name)
                    else:
                        assert value == b[key][name][field_name]
        elif key == "generators":
            assert all(torch.equal(x, y) for x, y in zip(a[key], b[key], strict=True))
        else:
            assert a[key] == b[key], key


# ---------------------------------------------------------------------- the dock the cases run on

DOCK_KWARGS: dict[str, Any] = {
    "capacity": 16, "n_samples_per_prompt": 2, "columns": ["x", "y", "s"], "consumers": ["a", "b", "c", "d"],
}  # fmt: skip
"""x: int64 sequences and s: float32 scalars in rows 0-7; y: never put (its dtype and kind are open)."""


@dataclass(frozen=True)
class Leases:
    """A dock's leases after `prepare`: `live` holds rows 0-1 for consumer a, `settled` was acked."""

    live: Lease
    settled: Lease


def prepare(call: Callable[..., Any]) -> Leases:
    """Put rows 0-7 and take the two leases through `call(method, *args, **kwargs)` (a dock's
    methods, or a parity trio's calls: then each lease is an `Each`)."""
    call("put", {"x": [torch.arange(n + 1) for n in range(8)], "s": torch.arange(8.0)}, range(8))
    live = call("get", "a", ["x"], 2, lease=math.inf).lease
    settled = call("get", "a", ["x"], 2, lease=math.inf).lease
    call("ack", settled)
    return Leases(live, settled)


class _LeaseOf:
    """A placeholder in a case's arguments for one of the dock's leases, forged from it or not."""

    def __init__(self, name: str, make: Callable[[Leases], Lease]) -> None:
        self.name, self.make = name, make

    def __repr__(self) -> str:
        return self.name


LIVE = _LeaseOf("LIVE", lambda leases: leases.live)
SETTLED = _LeaseOf("SETTLED", lambda leases: leases.settled)
RELABELLED = _LeaseOf("RELABELLED", lambda leases: replace(leases.live, consumer="b"))  # a's rows, as b's
FORGED = _LeaseOf("FORGED", lambda leases: replace(leases.live, token="0" * 64))  # the id, a made-up token
UNSIGNED = _LeaseOf("UNSIGNED", lambda leases: Lease(10**9, "a", math.inf))  # a guessed id, no token


@dataclass(frozen=True)
class Case:
    """One bad call: `method(*args, **kwargs)` must raise exactly `error`, its message naming `names`."""

    name: str
    error: type[DockError]
    names: str
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def call_for(self, leases: Leases) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments for a dock whose leases are `leases` (placeholders replaced)."""

        def real(value: Any) -> Any:
            return value.make(leases) if isinstance(value, _LeaseOf) else value

        return tuple(real(a) for a in self.args), {key: real(v) for key, v in self.kwargs.items()}

    @property
    def argument(self) -> str | None:
        """The argument an InvalidArgumentError must name in its `argument` attribute."""
        return self.names if issubclass(self.error, InvalidArgumentError) else None


def _get(name: str, error: type[DockError], names: str, *args: Any, **kwargs: Any) -> Case:
    return Case(name, error, names, "get", args or ("b", ["x"], 2), kwargs)


def _put(name: str, error: type[DockError], names: str, data: Any, rows: Any = (0,), **kwargs: Any) -> Case:
    return Case(name, error, names, "put", (data, list(rows) if isinstance(rows, tuple) else rows), kwargs)


_ROW = [torch.arange(3)]  # one int64 row for x
_PB = torch.zeros(1, dtype=torch.int64).expand(
    2**47
)  # a row of 1 PiB: no memory holds it (a view of 8 bytes)
_NAN_PAD, _BIG_PAD = Padding(value=math.nan), Padding(value=1e30)


def _altered(multiple: Any) -> Padding:
    """A Padding whose width multiple changed after its checks ran (as one unpickled from a caller)."""
    padding = Padding()
    object.__setattr__(padding, "multiple", multiple)
    return padding


# fmt: off
CATALOGUE: list[Case] = [
    # ------------------------------------------------------------ get: counts (no bool, float or str)
    _get("count True", ArgumentTypeError, "count", "b", ["x"], True),
    _get("count False", ArgumentTypeError, "count", "b", ["x"], False),
    _get("count str", ArgumentTypeError, "count", "b", ["x"], "x"),
    _get("count 2.0", ArgumentTypeError, "count", "b", ["x"], 2.0),
    _get("count nan", ArgumentTypeError, "count", "b", ["x"], math.nan),
    _get("count inf", ArgumentTypeError, "count", "b", ["x"], math.inf),
    _get("count 0", InvalidArgumentError, "count", "b", ["x"], 0),
    _get("count -1", InvalidArgumentError, "count", "b", ["x"], -1),
    _get("count None", ArgumentTypeError, "count", "b", ["x"], None),
    _get("count not whole groups", GroupSizeError, "count", "b", ["x"], 3, groups=True),
    _get("min_count True", ArgumentTypeError, "min_count", min_count=True),
    _get("min_count 1.5", ArgumentTypeError, "min_count", min_count=1.5),
    _get("min_count 0", InvalidArgumentError, "min_count", min_count=0),
    _get("min_count > count", InvalidArgumentError, "min_count", min_count=3),
    # ------------------------------------------------------------ get: seconds (no NaN, bool, negative)
    _get("timeout nan", InvalidArgumentError, "timeout", timeout=math.nan),
    _get("timeout -1", InvalidArgumentError, "timeout", timeout=-1),
    _get("timeout -inf", InvalidArgumentError, "timeout", timeout=-math.inf),
    _get("timeout str", ArgumentTypeError, "timeout", timeout="5"),
    _get("timeout True", ArgumentTypeError, "timeout", timeout=True),
    _get("lease nan", InvalidArgumentError, "lease", lease=math.nan),
    _get("lease 0", InvalidArgumentError, "lease", lease=0),
    _get("lease -inf", InvalidArgumentError, "lease", lease=-math.inf),
    _get("lease True", ArgumentTypeError, "lease", lease=True),
    _get("lease_key without lease", InvalidArgumentError, "lease_key", lease_key="k"),
    _get("lease_key int", ArgumentTypeError, "lease_key", lease=60, lease_key=3),
    # ------------------------------------------------------------ get: flags and specs
    _get("groups str", ArgumentTypeError, "groups", groups="yes"),
    _get("groups 1", ArgumentTypeError, "groups", groups=1),
    _get("layout unknown", InvalidArgumentError, "layout", layout="ragged"),
    _get("layout None", InvalidArgumentError, "layout", layout=None),
    _get("sampler str", ArgumentTypeError, "sampler", sampler="random"),
    _get("padding int", ArgumentTypeError, "padding", padding=0),
    _get("pad multiple 0", InvalidArgumentError, "padding", padding=_altered(0)),
    _get("pad multiple 1.5", InvalidArgumentError, "padding", padding=_altered(1.5)),
    _get("pad nan, int column", InvalidArgumentError, "padding", padding=_NAN_PAD),
    _get("pad 1e30, int column", InvalidArgumentError, "padding", padding=_BIG_PAD),
    _get("pad 0.5, int column", InvalidArgumentError, "padding", padding=Padding(value=0.5)),
    _get("pad -inf, int column", InvalidArgumentError, "padding", padding=Padding(value=-math.inf)),
    # ------------------------------------------------------------ get: names
    _get("consumer int", ArgumentTypeError, "consumer", 3, ["x"], 2),
    _get("consumer list", ArgumentTypeError, "consumer", ["b"], ["x"], 2),
    _get("consumer unknown", UnknownConsumerError, "'nobody'", "nobody", ["x"], 2),
    _get("columns str", InvalidArgumentError, "columns", "b", "x", 2),
    _get("columns empty", InvalidArgumentError, "columns", "b", [], 2),
    _get("columns repeated", InvalidArgumentError, "columns", "b", ["x", "x"], 2),
    _get("columns int", ArgumentTypeError, "columns", "b", [3], 2),
    _get("columns nested", ArgumentTypeError, "columns", "b", [["x"]], 2),
    _get("columns unknown", UnknownColumnError, "'nope'", "b", ["nope"], 2),
    # ------------------------------------------------------------ get: indexes
    _get("indexes 2-D list", InvalidArgumentError, "indexes", indexes=[[0, 1]]),
    _get("indexes 2-D tensor", InvalidArgumentError, "indexes", indexes=torch.tensor([[0, 1]])),
    _get("indexes float", ArgumentTypeError, "indexes", indexes=[0.5]),
    _get("indexes nan", ArgumentTypeError, "indexes", indexes=[math.nan]),
    _get("indexes bools", ArgumentTypeError, "indexes", indexes=[True, False]),
    _get("indexes a bool among ints", ArgumentTypeError, "indexes", indexes=[0, True]),
    _get("indexes str items", ArgumentTypeError, "indexes", indexes=["0"]),
    _get("indexes str", ArgumentTypeError, "indexes", indexes="01"),
    _get("indexes 2**64", IndexOutOfRangeError, "18446744073709551616", indexes=[2**64]),
    _get("indexes past capacity", IndexOutOfRangeError, "16", indexes=[16]),
    _get("indexes negative", IndexOutOfRangeError, "-1", indexes=[-1]),
    _get("indexes repeated", DuplicateIndexError, "4", indexes=[4, 4]),
    _get("indexes meta", ArgumentTypeError, "indexes", indexes=torch.zeros(2, dtype=torch.long).to("meta")),
    _get("indexes sparse", ArgumentTypeError, "indexes", indexes=torch.tensor([0, 1]).to_sparse()),
    _get("indexes float tensor", ArgumentTypeError, "indexes", indexes=torch.tensor([0.0, 1.0])),
    _get("indexes consumed", AlreadyConsumedError, "row 2", "a", ["x"], 2, indexes=[2]),
    # ------------------------------------------------------------ put
    _put("data a list", ArgumentTypeError, "data", [torch.ones(1)]),
    _put("data empty", InvalidArgumentError, "data", {}),
    _put("data int key", ArgumentTypeError, "data", {3: torch.ones(1)}),
    _put("data unknown column", UnknownColumnError, "'nope'", {"nope": torch.ones(1)}),
    _put("indexes None", ArgumentTypeError, "indexes", {"y": torch.ones(1)}, None),
    _put("indexes 2-D", InvalidArgumentError, "indexes", {"y": torch.ones(1)}, [[0]]),
    _put("indexes empty, a row of data", RowCountMismatchError, "'y'", {"y": torch.ones(1)}, []),
    _put("indexes 2**64", IndexOutOfRangeError, "18446744073709551616", {"y": torch.ones(1)}, [2**64]),
    _put("indexes bools", ArgumentTypeError, "indexes", {"y": torch.ones(1)}, [True]),
    _put("values str", ColumnLayoutError, "'y'", {"y": ["a"]}),
    _put("values a str", ColumnLayoutError, "'y'", {"y": "a"}),
    _put("values None", ColumnLayoutError, "'y'", {"y": None}),
    _put("values meta", ColumnLayoutError, "'y'", {"y": torch.ones(1, device="meta")}),
    _put("values sparse", ColumnLayoutError, "'y'", {"y": torch.ones(1).to_sparse()}),
    _put("values a meta row", ColumnLayoutError, "'y'", {"y": [torch.ones(2, device="meta")]}),
    _put("lengths a list", ArgumentTypeError, "lengths", {"y": torch.ones(1, 2)}, lengths=[2]),
    _put("lengths str", LengthMismatchError, "'y'", {"y": torch.ones(1, 2)}, lengths={"y": ["2"]}),
    _put("lengths float", LengthMismatchError, "'y'", {"y": torch.ones(1, 2)}, lengths={"y": [1.5]}),
    _put("completed str", ArgumentTypeError, "completed", {"y": torch.ones(1)}, completed="yes"),
    _put("completed ints", ArgumentTypeError, "completed", {"y": torch.ones(1)}, completed=[1]),
    _put("ack str", ArgumentTypeError, "ack", {"y": torch.ones(1)}, ack="lease"),
    _put("ack relabelled", LeaseError, "consumer 'b'", {"y": torch.ones(2)}, (0, 1), ack=RELABELLED),
    _put("ack forged token", LeaseError, "did not issue", {"y": torch.ones(2)}, (0, 1), ack=FORGED),
    _put("ack guessed id", LeaseError, "did not issue", {"y": torch.ones(2)}, (0, 1), ack=UNSIGNED),
    _put("ack settled", LeaseError, "released or acked", {"y": torch.ones(2)}, (2, 3), ack=SETTLED),
    _put("ack another row", LeaseError, "row 5", {"y": torch.ones(2)}, (0, 5), ack=LIVE),
    _put("last of 3 columns has no memory", DockMemoryError, "'x'",
         {"s": torch.ones(1), "y": torch.ones(1), "x": [_PB]}, (8,)),
    # ------------------------------------------------------------ ack, release
    Case("ack str", ArgumentTypeError, "lease", "ack", ("x",)),
    Case("ack relabelled", LeaseError, "consumer 'b'", "ack", (RELABELLED,)),
    Case("ack forged token", LeaseError, "did not issue", "ack", (FORGED,)),
    Case("ack guessed id", LeaseError, "did not issue", "ack", (UNSIGNED,)),
    Case("ack settled", LeaseError, "expired, was released or acked", "ack", (SETTLED,)),
    Case("ack indexes 2-D", InvalidArgumentError, "indexes", "ack", (LIVE, [[0]])),
    Case("ack a row not held", LeaseError, "row 5", "ack", (LIVE, [5])),
    Case("release str", ArgumentTypeError, "lease", "release", ("x",)),
    Case("release relabelled", LeaseError, "consumer 'b'", "release", (RELABELLED,)),
    Case("release forged token", LeaseError, "did not issue", "release", (FORGED,)),
    Case("release guessed id", LeaseError, "did not issue", "release", (UNSIGNED,)),
    # ------------------------------------------------------------ peek, clear, control calls
    Case("peek columns str", InvalidArgumentError, "columns", "peek", ("x", [0])),
    Case("peek indexes 2-D", InvalidArgumentError, "indexes", "peek", (["x"], [[0]])),
    Case("peek indexes float", ArgumentTypeError, "indexes", "peek", (["x"], [0.5])),
    Case("peek pad nan, int column", InvalidArgumentError, "padding", "peek", (["x"], [0]),
         {"padding": _NAN_PAD}),
    Case("peek layout unknown", InvalidArgumentError, "layout", "peek", (["x"], [0]), {"layout": "ragged"}),
    Case("clear str", ArgumentTypeError, "indexes", "clear", ("01",)),
    Case("clear 2-D", InvalidArgumentError, "indexes", "clear", ([[0]],)),
    Case("clear 2**64", IndexOutOfRangeError, "18446744073709551616", "clear", ([2**64],)),
    Case("progress int", ArgumentTypeError, "consumer", "progress", (3,)),
    Case("all_consumed list", ArgumentTypeError, "consumer", "all_consumed", (["a"],)),
    Case("set_policy_version True", InvalidArgumentError, "version", "set_policy_version", (True,)),
]
# fmt: on


def check_outcome(case: Case, error: BaseException | None) -> str | None:
    """What is wrong with a dock's answer to `case` (None: the typed error it must raise)."""
    if error is None:
        return "no error"
    if type(error) is not case.error:
        return f"{type(error).__name__} ({str(error)[:120]}), not {case.error.__name__}"
    if case.names not in str(error):
        return f"the message does not name {case.names!r}: {error}"
    if case.argument is not None and getattr(error, "argument", None) != case.argument:
        return f"argument {getattr(error, 'argument', None)!r}, not {case.argument!r}"
    return None
