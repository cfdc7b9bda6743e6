"""Corruption matrix of saved docks and states: each bad case is one DockStateError, the live dock unchanged.

The matrix (each row counted by its test, which asserts silent == 0 and prints the counts):
- 200 seeded single-bit flips at random byte positions of a saved dock file;
- truncations of the file to 0, 1, 64, half, size - 64 and size - 1 bytes;
- the manifest deleted, and edited (hash, size, algorithm, file name, not JSON, empty);
- 38 in-process state_dicts, each with one invariant broken (keys, identity, shapes, dtypes, lengths
  against flat data and ready bits, statuses of empty rows, sampler states, counters).
A case is "caught" when loading raises DockStateError and the dock it was loaded into is exactly as it
was; "silent" when the load returned. On the code before manifests, 85 of 200 bit flips loaded silently.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from entrepot.dock import ColumnSpec, DockStateError, ExperienceDock, Sampler

NUM_BIT_FLIPS = 200


def _build(seed: int = 0) -> ExperienceDock:
    return ExperienceDock(
        16,
        columns={
            "tokens": ColumnSpec(torch.int64, scalar=False),
            "logp": ColumnSpec(torch.float32, scalar=False),
            "score": ColumnSpec(torch.float32, scalar=True),
            "extra": ColumnSpec(),  # dtype and kind fixed by the first put
        },
        consumers=["rollout", "ref", "train"],
        n_samples_per_prompt=2,
        rollout_consumer="rollout",
        seed=seed,
    )


def _saved_dock() -> ExperienceDock:
    """Sequence + scalar columns, unfinished rows with ages, partially consumed by two consumers."""
    dock = _build()
    dock.put({"tokens": [torch.tensor([7, 7])] * 2}, [12, 13], completed=[False, False])
    dock.clear()  # rows 12, 13 are an unfinished group: kept, aged
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (12,), generator=gen).tolist()
    dock.put({"tokens": [torch.arange(n) + 100 * i for i, n in enumerate(lengths)]}, range(12))
    dock.put({"logp": [torch.randn(n, generator=gen) for n in lengths[:8]]}, range(8))
    dock.put({"score": torch.arange(8.0), "extra": [torch.ones(3, dtype=torch.int16)] * 8}, range(8))
    dock.clear([0, 1])
    dock.get("ref", ["tokens"], 4)
    dock.get("train", ["tokens", "logp", "score"], 2, sampler=Sampler(kind="random"))
    return dock


def _victim() -> ExperienceDock:
    """The live dock that bad loads must leave alone: rows of its own, other sampler positions."""
    dock = _build(seed=5)
    dock.put({"tokens": [torch.full((n,), n) for n in (3, 1, 4, 1)], "score": torch.ones(4)}, range(4))
    dock.get("train", ["tokens", "score"], 2, sampler=Sampler(kind="random"))
    return dock


def _same(a: Any, b: Any) -> bool:
    """Deep equality of two state_dicts (tensors compared exactly)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


class Matrix:
    """Counts of one row of the corruption matrix."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tried = self.caught = self.silent = 0
        self.other: list[str] = []  # raised something other than DockStateError

    def attempt(self, load: Callable[[ExperienceDock], None], case: str) -> None:
        """Load into a live dock; count it caught only if DockStateError left the dock unchanged."""
        victim = _victim()
        before = victim.state_dict()
        self.tried += 1
        try:
            load(victim)
        except DockStateError:
            assert _same(victim.state_dict(), before), f"{self.name}: {case} changed the live dock"
            self.caught += 1
            return
        except Exception as error:  # counted: anything but DockStateError fails the test
            self.other.append(f"{case}: {type(error).__name__}: {error}")
            return
        self.silent += 1

    def report(self) -> None:
        print(f"\n{self.name}: tried {self.tried}, caught {self.caught}, silent {self.silent}")
        assert self.silent == 0 and not self.other, self.other
        assert self.caught == self.tried


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "dock.pt"
    _saved_dock().save(path)
    return path


def test_a_saved_dock_loads_back_whole_and_leaves_no_temp_files(saved: Path) -> None:
    victim = _victim()
    victim.load(saved)
    assert _same(victim.state_dict(), torch.load(saved, weights_only=True))
    assert sorted(p.name for p in saved.parent.iterdir()) == ["dock.pt", "dock.pt.manifest.json"]
    manifest = json.loads((saved.parent / "dock.pt.manifest.json").read_text())
    assert manifest["algorithm"] == "sha256" and manifest["size"] == saved.stat().st_size


def test_every_single_bit_flip_is_caught(saved: Path) -> None:
    good = saved.read_bytes()
    rng = random.Random(13)
    matrix = Matrix("dock file bit flips")
    for _ in range(NUM_BIT_FLIPS):
        position, bit = rng.randrange(len(good)), rng.randrange(8)
        flipped = bytearray(good)
        flipped[position] ^= 1 << bit
        saved.write_bytes(bytes(flipped))
        matrix.attempt(lambda dock: dock.load(saved), f"byte {position} bit {bit}")
    matrix.report()


def test_every_truncation_is_caught(saved: Path) -> None:
    good = saved.read_bytes()
    matrix = Matrix("dock file truncations")
    for size in (0, 1, 64, len(good) // 2, len(good) - 64, len(good) - 1):
        saved.write_bytes(good[:size])
        matrix.attempt(lambda dock: dock.load(saved), f"{size} of {len(good)} bytes")
    matrix.report()
    with pytest.raises(DockStateError, match=r"dock\.pt.* is \d+ bytes but its manifest says \d+"):
        _victim().load(saved)  # the last truncation


def test_a_missing_or_edited_manifest_is_caught(saved: Path) -> None:
    manifest = saved.parent / "dock.pt.manifest.json"
    good = json.loads(manifest.read_text())
    edits: dict[str, Any] = {
        "hash": {**good, "hash": "0" * 64},
        "size": {**good, "size": good["size"] + 1},
        "algorithm": {**good, "algorithm": "md4-or-nothing"},
        "file": {**good, "file": "other.pt"},
        "no hash": {k: v for k, v in good.items() if k != "hash"},
        "a list": [good],
    }
    matrix = Matrix("dock manifest edits")
    for case, edited in edits.items():
        manifest.write_text(json.dumps(edited))
        matrix.attempt(lambda dock: dock.load(saved), case)
    for case, text in (("not JSON", "{not json"), ("empty", "")):
        manifest.write_text(text)
        matrix.attempt(lambda dock: dock.load(saved), case)
    manifest.unlink()
    matrix.attempt(lambda dock: dock.load(saved), "deleted")
    matrix.report()
    with pytest.raises(DockStateError, match=r"dock\.pt.* has no manifest .*dock\.pt\.manifest\.json"):
        _victim().load(saved)


def _broken_states() -> dict[str, Callable[[dict[str, Any]], None]]:
    """One invariant broken per case, applied to a deep copy of a good state_dict."""
    cols = "columns"

    def setitem(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
        def edit(state: dict[str, Any]) -> None:
            target = state
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value(target[path[-1]]) if callable(value) else value

        return edit

    def pop(key: str) -> Callable[[dict[str, Any]], None]:
        return lambda state: state.pop(key)

    def flip(key: str, index: tuple[int, ...]) -> Callable[[dict[str, Any]], None]:
        def edit(state: dict[str, Any]) -> None:
            state[key][index] = ~state[key][index]

        return edit

    def shifted_lengths(state: dict[str, Any]) -> None:  # same sum, one negative length
        lengths = state[cols]["tokens"]["lengths"]
        lengths[2] -= 100
        lengths[3] += 100

    def length_where_not_ready(state: dict[str, Any]) -> None:  # row 0 was cleared; sum kept
        lengths = state[cols]["tokens"]["lengths"]
        lengths[0] += 1
        lengths[2] -= 1

    return {
        "missing key": pop("ready"),
        "unknown key": setitem(("leases",), torch.zeros(1)),
        "format": setitem(("format",), 2),
        "capacity": setitem(("capacity",), 32),
        "capacity as tensor": setitem(("capacity",), torch.tensor(16)),
        "columns order": setitem(("columns_order",), ["logp", "tokens", "score", "extra"]),
        "consumers": setitem(("consumers",), ["rollout", "train"]),
        "ready shape": setitem(("ready",), lambda t: t[:, :8]),
        "ready dtype": setitem(("ready",), lambda t: t.to(torch.uint8)),
        "consumed shape": setitem(("consumed",), lambda t: t[:2]),
        "live not a tensor": setitem(("live",), lambda t: t.tolist()),
        "age dtype": setitem(("age",), lambda t: t.to(torch.int64)),
        "age negative": setitem(("age", 12), -1),
        "age on an empty row": setitem(("age", 15), 3),
        "unfinished empty row": setitem(("completed", 15), False),
        "ready but not live": flip("ready", (0, 15)),
        "consumed but not live": flip("consumed", (1, 15)),
        "lengths sum > flat": setitem((cols, "tokens", "flat"), lambda t: t[:-1]),
        "lengths sum < flat": setitem((cols, "tokens", "flat"), lambda t: torch.cat([t, t[:1]])),
        "negative length": shifted_lengths,
        "length where not ready": length_where_not_ready,
        "lengths dtype": setitem((cols, "tokens", "lengths"), lambda t: t.to(torch.int32)),
        "flat dtype": setitem((cols, "tokens", "flat"), lambda t: t.to(torch.int32)),
        "flat 2-D": setitem((cols, "tokens", "flat"), lambda t: t.unsqueeze(0)),
        "scalar shape": setitem((cols, "score", "values"), lambda t: t[:-1]),
        "scalar dtype": setitem((cols, "score", "values"), lambda t: t.double()),
        "unknown dtype": setitem((cols, "extra", "dtype"), "torch.nope"),
        "dtype not a string": setitem((cols, "extra", "dtype"), 5),
        "dtype against spec": setitem((cols, "logp", "dtype"), "torch.float64"),
        "scalar against spec": setitem((cols, "score", "scalar"), False),
        "unknown column": setitem((cols, "nope"), {"dtype": "torch.int64", "scalar": True, "values": None}),
        "ready column without data": lambda state: state[cols].pop("logp"),
        "column extra field": setitem((cols, "score", "flat"), torch.zeros(0)),
        "columns not a mapping": setitem((cols,), lambda c: list(c.values())),
        "generators count": setitem(("generators",), lambda g: g[:2]),
        "generator state size": setitem(("generators", 0), lambda t: t[:-1]),
        "counts negative": setitem(("counts", "puts"), -1),
        "wait_s not finite": setitem(("wait_s", 0), float("nan")),
    }


def test_every_broken_invariant_of_a_state_dict_is_caught() -> None:
    good = _saved_dock().state_dict()
    matrix = Matrix("in-process state_dicts")
    cases = _broken_states()
    for case, edit in cases.items():
        state = copy.deepcopy(good)
        edit(state)
        matrix.attempt(lambda dock, state=state: dock.load_state_dict(state), case)
    matrix.attempt(lambda dock: dock.load_state_dict([good]), "not a mapping")  # type: ignore[arg-type]
    matrix.report()
    assert matrix.tried == 39
    victim = _victim()
    victim.load_state_dict(good)  # the unbroken state loads: the cases above fail for their one edit
    assert _same(victim.state_dict(), good)


def test_a_broken_state_names_its_source_and_what_is_wrong(saved: Path) -> None:
    state = _saved_dock().state_dict()
    state["columns"]["tokens"]["flat"] = state["columns"]["tokens"]["flat"][:-1]
    with pytest.raises(
        DockStateError, match=r"^dock state_dict: columns\['tokens'\] lengths sum to \d+ but flat"
    ):
        _victim().load_state_dict(state)
    other = ExperienceDock(16, columns=["tokens"], consumers=["train"], n_samples_per_prompt=2)
    with pytest.raises(DockStateError, match=r"^dock file '.*dock\.pt': has columns_order=\["):
        other.load(saved)
