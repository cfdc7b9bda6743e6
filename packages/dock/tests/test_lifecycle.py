"""all_consumed, progress, clear, reset, metrics, state_dict / save / load and resume."""

from __future__ import annotations

import pytest
import torch

from entrepot.dock import ColumnSpec, DockStateError, ExperienceDock, Sampler


def test_all_consumed_and_progress(dock, make_rows):
    assert dock.all_consumed("ref")  # nothing to consume yet
    dock.put({"tokens": make_rows([1, 2, 3])}, [0, 1, 2])
    assert not dock.all_consumed("ref")
    dock.get("ref", ["tokens"], 2)
    assert dock.progress("ref") == {"consumed": 2, "live": 3}
    dock.get("ref", ["tokens"], 2)
    assert dock.all_consumed("ref") and not dock.all_consumed("train")


def test_clear_some_rows_then_all(dock, make_rows):
    dock.put({"tokens": make_rows([1, 2, 3]), "score": torch.ones(3)}, [0, 1, 2])
    dock.get("ref", ["tokens"], 3)
    dock.clear([1])
    assert dock.progress("ref") == {"consumed": 2, "live": 2}
    assert dock.metrics()["dock/rows_ready/tokens"] == 2
    dock.put({"tokens": make_rows([4], start=7)}, [1])
    assert dock.get("ref", ["tokens"], 1, layout="packed").data["tokens"].tolist() == [7000, 7001, 7002, 7003]
    dock.clear()
    assert dock.progress("ref") == {"consumed": 0, "live": 0}
    assert dock.metrics()["dock/bytes_stored"] == 0
    dock.put({"tokens": make_rows([2])}, [0])
    assert dock.get("ref", ["tokens"], 1).indexes.tolist() == [0]


def test_reset_forgets_learned_dtypes():
    dock = ExperienceDock(4, columns=["x"], consumers=["c"])
    dock.put({"x": [torch.ones(2, dtype=torch.float64)]}, [0])
    dock.reset()
    dock.put({"x": [torch.ones(2, dtype=torch.int8)]}, [0])  # a fresh column accepts any dtype
    assert dock.peek(["x"], [0]).data["x"].dtype == torch.int8
    assert dock.metrics()["dock/puts"] == 1


def test_metrics_count_calls_rows_and_bytes(dock, make_rows):
    dock.put({"tokens": make_rows([4, 4]), "logp": [torch.ones(4), torch.ones(2)]}, [0, 1])
    dock.get("train", ["tokens", "logp"], 2)
    metrics = dock.metrics()
    assert metrics["dock/puts"] == 1 and metrics["dock/gets"] == 1
    assert metrics["dock/rows_put"] == 2 and metrics["dock/rows_got/train"] == 2
    assert metrics["dock/bytes_stored"] == 8 * 8 + 6 * 4
    assert metrics["dock/bytes_got/train"] == 8 * 8 + 6 * 4  # what the get handed out
    assert metrics["dock/rows_ready/logp"] == 2 and metrics["dock/rows_ready/score"] == 0


def _drain(dock, consumer, columns, count, **kwargs):
    out = []
    while (batch := dock.get(consumer, columns, count, **kwargs)) is not None:
        out.append((batch.indexes.tolist(), {k: v.clone() for k, v in batch.data.items()}))
    return out


def _build(seed=3):
    return ExperienceDock(
        32,
        columns={
            "ids": ColumnSpec(torch.int32),
            "lp": ColumnSpec(torch.bfloat16),
            "s": ColumnSpec(scalar=True),
        },
        consumers=["a", "b"],
        seed=seed,
    )


def _fill(dock):
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 9, (32,), generator=gen)
    dock.put(
        {"ids": [torch.randint(0, 100, (int(n),), generator=gen, dtype=torch.int32) for n in lengths]},
        range(32),
    )
    dock.put({"lp": [torch.randn(int(n), generator=gen).bfloat16() for n in lengths]}, range(32))
    dock.put({"s": torch.arange(32.0)}, range(32))
    for round_ in range(3):  # rewrites leave garbage behind; the state must not carry it
        dock.put({"ids": [torch.full((3,), round_, dtype=torch.int32)] * 4}, [4, 5, 6, 7])


def test_resume_gives_the_same_remaining_deliveries(tmp_path):
    original = _build()
    _fill(original)
    original.get("a", ["ids", "lp"], 5, sampler=Sampler(kind="random"))
    original.get("b", ["ids", "s"], 7)
    original.save(tmp_path / "dock.pt")

    resumed = _build(seed=99)  # the sampler position comes from the file, not the seed
    resumed.load(tmp_path / "dock.pt")
    assert resumed.progress("a") == original.progress("a")
    for consumer, cols, kwargs in (
        ("a", ["ids", "lp"], {"sampler": Sampler(kind="random")}),
        ("b", ["ids", "s", "lp"], {}),
    ):
        expected = _drain(original, consumer, cols, 4, **kwargs)
        got = _drain(resumed, consumer, cols, 4, **kwargs)
        assert [rows for rows, _ in got] == [rows for rows, _ in expected]
        for (_, x), (_, y) in zip(got, expected, strict=True):
            assert all(torch.equal(x[k], y[k]) for k in x)
    assert resumed.metrics()["dock/bytes_stored"] == original.metrics()["dock/bytes_stored"]


def test_load_state_rejects_a_different_dock():
    state = _build().state_dict()
    other = ExperienceDock(16, columns=["ids", "lp", "s"], consumers=["a", "b"])
    with pytest.raises(DockStateError, match="capacity=32"):
        other.load_state_dict(state)


def test_clear_recycles_memory_between_iterations(dock, make_rows):
    sizes = []
    for round_ in range(4):
        dock.put({"tokens": make_rows([100] * 8, start=round_)}, range(8))
        batch = dock.get("ref", ["tokens"], 8, layout="packed")
        assert torch.equal(batch.data["tokens"], torch.cat(make_rows([100] * 8, start=round_)))
        sizes.append(dock.metrics()["dock/bytes_allocated"])
        dock.clear()
    assert sizes[1:] == [sizes[0]] * 3
