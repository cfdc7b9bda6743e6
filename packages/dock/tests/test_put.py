"""put: every accepted input form, dtype handling, and every validation error (state unchanged)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tests_support_bad_inputs import assert_same_state

from entrepot.dock import (
    ColumnLayoutError,
    ColumnSpec,
    DockError,
    DockMemoryError,
    DuplicateIndexError,
    ExperienceDock,
    IndexOutOfRangeError,
    InvalidArgumentError,
    LengthMismatchError,
    LossyDtypeError,
    RowCountMismatchError,
    UnknownColumnError,
)


def test_list_of_tensors_round_trip(dock, make_rows):
    seqs = make_rows([3, 1, 4])
    dock.put({"tokens": seqs, "score": torch.tensor([0.5, 1.5, 2.5])}, [2, 0, 7])
    batch = dock.peek(["tokens", "score"], [7, 2, 0], layout="packed")
    assert batch.lengths["tokens"].tolist() == [4, 3, 1]
    assert torch.equal(batch.data["tokens"], torch.cat([seqs[2], seqs[0], seqs[1]]))
    assert batch.data["score"].tolist() == [2.5, 0.5, 1.5]


def test_padded_with_lengths_stores_only_valid_tokens(dock):
    padded = torch.tensor([[1, 2, 0, 0], [3, 4, 5, 6]])
    dock.put({"tokens": padded}, [0, 1], lengths={"tokens": torch.tensor([2, 4])})
    batch = dock.peek(["tokens"], [0, 1])
    assert torch.equal(batch.data["tokens"], padded)
    assert dock.metrics()["dock/bytes_stored"] == 6 * 8  # padding not kept


def test_padded_tuple_and_packed_forms_agree(dock):
    flat, lengths = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([2, 3])
    dock.put({"tokens": (flat, lengths)}, [0, 1])
    padded = torch.tensor([[1, 2, 9], [3, 4, 5]])
    dock.put({"tokens": (padded, lengths)}, [2, 3])
    a = dock.peek(["tokens"], [0, 1], layout="packed").data["tokens"]
    b = dock.peek(["tokens"], [2, 3], layout="packed").data["tokens"]
    assert torch.equal(a, b) and torch.equal(a, flat)


def test_tensordict_and_fixed_width_rows(dock):
    data = TensorDict({"logp": torch.ones(2, 3), "score": torch.tensor([1.0, 2.0])}, batch_size=[2])
    dock.put(data, torch.tensor([5, 6]))
    batch = dock.peek(["logp", "score"], [5, 6])
    assert batch.lengths["logp"].tolist() == [3, 3]
    assert torch.equal(batch.data["score"], torch.tensor([1.0, 2.0]))


def test_learned_dtype_and_kind_are_kept():
    dock = ExperienceDock(4, columns=["ids", "lp"], consumers=["c"])
    dock.put(
        {"ids": [torch.tensor([1, 2], dtype=torch.int32)], "lp": [torch.ones(2, dtype=torch.bfloat16)]}, [0]
    )
    batch = dock.peek(["ids", "lp"], [0])
    assert batch.data["ids"].dtype == torch.int32 and batch.data["lp"].dtype == torch.bfloat16
    dock.put({"ids": [torch.tensor([7], dtype=torch.int16)]}, [1])  # lossless widening is fine
    assert dock.peek(["ids"], [1]).data["ids"].dtype == torch.int32
    with pytest.raises(LossyDtypeError, match="'ids'"):
        dock.put({"ids": [torch.tensor([7], dtype=torch.int64)]}, [1])
    with pytest.raises(LossyDtypeError, match="'lp'"):
        dock.put({"lp": [torch.ones(1)]}, [1])


NARROW_FORMS = {
    "packed": lambda rows: (torch.cat(rows), torch.tensor([len(r) for r in rows])),
    "padded": lambda rows: (torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), torch.tensor([2, 0, 3])),
    "padded, every other column": lambda rows: (
        torch.nn.utils.rnn.pad_sequence(rows, batch_first=True).repeat_interleave(2, dim=1)[:, ::2],
        torch.tensor([2, 0, 3]),
    ),
    "list": lambda rows: rows,
}


@pytest.mark.parametrize("form", NARROW_FORMS)
def test_narrow_rows_are_widened_in_every_form(form):
    """A put converts to the stored dtype before it changes anything, whatever form its rows come in."""
    dock = ExperienceDock(4, columns={"ids": ColumnSpec(torch.int64)}, consumers=["c"])
    rows = [torch.tensor([5, -6], dtype=torch.int16), torch.tensor([], dtype=torch.int16),
            torch.tensor([7, 8, -9], dtype=torch.int16)]  # fmt: skip
    dock.put({"ids": NARROW_FORMS[form](rows)}, [3, 0, 1])
    batch = dock.peek(["ids"], [3, 0, 1], layout="packed")
    assert batch.data["ids"].dtype == torch.int64
    assert batch.data["ids"].tolist() == [5, -6, 7, 8, -9] and batch.lengths["ids"].tolist() == [2, 0, 3]


def test_rewrite_replaces_row_and_reclaims_space(dock, make_rows):
    for round_ in range(50):
        dock.put({"tokens": make_rows([100] * 4, start=round_)}, [0, 1, 2, 3])
    batch = dock.peek(["tokens"], [0, 3], layout="packed")
    expected = torch.cat(make_rows([100] * 4, start=49)[0::3])
    assert torch.equal(batch.data["tokens"], expected)
    metrics = dock.metrics()
    assert metrics["dock/bytes_stored"] == 400 * 8
    assert metrics["dock/bytes_allocated"] < 50 * 400 * 8  # compaction kept garbage bounded


@pytest.mark.parametrize(
    ("call", "error", "needle"),
    [
        (lambda d: d.put({"nope": torch.ones(1)}, [0]), UnknownColumnError, "'nope'"),
        (lambda d: d.put({"score": torch.ones(1)}, [16]), IndexOutOfRangeError, "16"),
        (lambda d: d.put({"score": torch.ones(1)}, [-1]), IndexOutOfRangeError, "-1"),
        (lambda d: d.put({"score": torch.ones(2)}, [3, 3]), DuplicateIndexError, "3"),
        (lambda d: d.put({"score": torch.ones(3)}, [0, 5, 16]), IndexOutOfRangeError, "16"),  # ascending
        (lambda d: d.put({"score": torch.ones(3)}, [5, 2, 5]), DuplicateIndexError, "5"),
        (lambda d: d.put({"score": torch.ones(3)}, [0, 1]), RowCountMismatchError, "'score'"),
        (
            lambda d: d.put({"tokens": torch.ones(2, 3, dtype=torch.int64)}, [0]),
            RowCountMismatchError,
            "'tokens'",
        ),
        (
            lambda d: d.put(
                {"tokens": torch.ones(2, 3, dtype=torch.int64)}, [0, 1], lengths={"tokens": [1, 4]}
            ),
            LengthMismatchError,
            "row 1",
        ),
        (
            lambda d: d.put({"tokens": torch.ones(5, dtype=torch.int64)}, [0, 1], lengths={"tokens": [1, 2]}),
            LengthMismatchError,
            "sum to 3",
        ),
        (
            lambda d: d.put(
                {"tokens": torch.ones(2, 3, dtype=torch.int64)}, [0, 1], lengths={"tokens": [-1, 2]}
            ),
            LengthMismatchError,
            ">= 0",
        ),
        (
            lambda d: d.put(
                {"tokens": torch.ones(1, dtype=torch.int64)}, [0, 1], lengths={"tokens": [-1, 2]}
            ),
            LengthMismatchError,
            ">= 0",
        ),
        (
            lambda d: d.put({"tokens": torch.ones(1, 2, 2, dtype=torch.int64)}, [0]),
            ColumnLayoutError,
            "shape",
        ),
        (lambda d: d.put({"score": [torch.ones(2)]}, [0]), ColumnLayoutError, "scalar"),
        (lambda d: d.put({"tokens": torch.ones(1, dtype=torch.int64)}, [0]), ColumnLayoutError, "sequences"),
        (lambda d: d.put({"tokens": [torch.ones(2)]}, [0]), LossyDtypeError, "float32"),
        (lambda d: d.put({"score": torch.ones(1, dtype=torch.float64)}, [0]), LossyDtypeError, "float64"),
        (lambda d: d.put({"score": "x"}, [0]), ColumnLayoutError, "str"),
        (lambda d: d.put({}, [0]), InvalidArgumentError, "at least one"),
        (lambda d: d.put({"score": torch.ones(1)}, [0], completed=[False]), DockError, "rollout_consumer"),
    ],
)
def test_put_errors_change_nothing(dock, make_rows, snapshot, same_state, call, error, needle):
    dock.put({"tokens": make_rows([2, 3]), "score": torch.tensor([1.0, 2.0])}, [0, 1])
    before = snapshot(dock)
    with pytest.raises(error, match=needle):
        call(dock)
    same_state(before, snapshot(dock))


def test_many_indexes_in_any_order_are_checked_alike():
    """Up to 512 ascending indexes are checked on a list, the rest with torch ops: same answers."""
    dock = ExperienceDock(4096, columns={"x": ColumnSpec(torch.int64, scalar=True)}, consumers=["c"])
    rows = torch.arange(4096)
    for index in (rows[:512], rows[:513], rows.flip(0), rows[1::2]):
        dock.put({"x": index * 3}, index)
        assert torch.equal(dock.peek(["x"], index).data["x"], index * 3)
    with pytest.raises(IndexOutOfRangeError, match="4096"):
        dock.put({"x": torch.ones(1025, dtype=torch.int64)}, torch.arange(3072, 4097))
    with pytest.raises(DuplicateIndexError, match="7"):
        repeated = torch.cat([torch.arange(1999), torch.tensor([7])])
        dock.put({"x": torch.ones(2000, dtype=torch.int64)}, repeated)


def test_error_in_second_column_leaves_first_unwritten(dock, make_rows, snapshot, same_state):
    before = snapshot(dock)
    with pytest.raises(LossyDtypeError):
        dock.put({"tokens": make_rows([2]), "score": torch.ones(1, dtype=torch.float64)}, [4])
    same_state(before, snapshot(dock))
    assert dock.metrics()["dock/rows_ready/tokens"] == 0


def test_declared_spec_fixed_up_front():
    dock = ExperienceDock(2, columns={"x": ColumnSpec(torch.float32, scalar=True)}, consumers=["c"])
    dock.put({"x": torch.tensor([1, 2], dtype=torch.int16)}, [0, 1])  # int16 fits float32 exactly
    assert dock.peek(["x"], [0, 1]).data["x"].dtype == torch.float32


@pytest.mark.parametrize("grown", [False, True])
def test_a_put_whose_last_column_gets_no_memory_leaves_the_dock_byte_identical(grown):
    """Three columns; the last one's rows need 1 PiB (a stride-0 view: the caller holds 8 bytes).

    Before, its first two cells were marked ready and a get delivered tok[40] = [0, 0, 0], never
    written. Now every column's memory is allocated before any cell changes. `grown`: the sequence
    columns already hold rows, so the put would add a segment to each (else it makes the stores).
    """
    dock = ExperienceDock(64, columns=["score", "logp", "tok"], consumers=["c"])
    if grown:
        dock.put({"logp": [torch.ones(5000)], "tok": [torch.arange(5000)], "score": torch.ones(1)}, [0])
    before = dock.state_dict(), dock.metrics()
    huge = torch.zeros(1, dtype=torch.int64).expand(2**47)
    data = {"score": torch.tensor([0.5]), "logp": [torch.ones(3)], "tok": [huge]}
    with pytest.raises(DockMemoryError, match=f"column 'tok': its rows need {2**50} bytes") as raised:
        dock.put(data, [40])
    assert isinstance(raised.value, MemoryError) and raised.value.__cause__ is not None
    assert_same_state(before[0], dock.state_dict())
    assert dock.metrics() == before[1]
    batch = dock.get("c", ["score", "logp"], 2, min_count=1, timeout=0)  # row 40 is not there to get
    assert (batch is None) if not grown else batch.indexes.tolist() == [0]
