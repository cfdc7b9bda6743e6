"""get: selection modes, layouts, blocking, timeouts and argument errors (state unchanged)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch

from entrepot.dock import (
    AlreadyConsumedError,
    DockTimeout,
    ExperienceDock,
    GroupSizeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    NotReadyError,
    Padding,
    Sampler,
    UnknownColumnError,
    UnknownConsumerError,
)


def fill(dock, make_rows, rows, lengths=None):
    lengths = lengths or [i % 5 + 1 for i in rows]
    dock.put(
        {"tokens": make_rows(lengths, start=rows[0]), "score": torch.tensor(rows, dtype=torch.float32)}, rows
    )


def test_fifo_takes_lowest_ready_unconsumed_rows(dock, make_rows):
    fill(dock, make_rows, [5, 6, 7, 8])
    fill(dock, make_rows, [1, 2])
    assert dock.get("ref", ["tokens"], 3).indexes.tolist() == [1, 2, 5]
    assert dock.get("ref", ["tokens"], 3).indexes.tolist() == [6, 7, 8]
    assert dock.get("train", ["tokens", "score"], 2).indexes.tolist() == [1, 2]  # consumers independent


def test_padded_layout_pads_to_multiple(dock, make_rows):
    fill(dock, make_rows, [0, 1, 2], lengths=[1, 3, 2])
    batch = dock.get("ref", ["tokens", "score"], 3, padding=Padding(value=-1, multiple=4))
    assert batch.data.batch_size == torch.Size([3])
    assert batch.data["tokens"].shape == (3, 4)
    assert batch.data["tokens"][0].tolist() == [0, -1, -1, -1]
    assert batch.lengths["tokens"].tolist() == [1, 3, 2]
    assert batch.data["score"].tolist() == [0.0, 1.0, 2.0]


def test_packed_layout_has_cu_seqlens(dock, make_rows):
    fill(dock, make_rows, [0, 1, 2], lengths=[1, 3, 2])
    batch = dock.get("ref", ["tokens"], 3, layout="packed")
    assert batch.data["tokens"].shape == (6,)
    assert batch.cu_seqlens("tokens").tolist() == [0, 1, 4, 6]
    assert batch.cu_seqlens("tokens").dtype == torch.int32


def test_columns_are_the_tensors_data_holds_as_a_tensordict(dock, make_rows):
    fill(dock, make_rows, [0, 1, 2], lengths=[1, 3, 2])
    for layout, batch_size in (("padded", [3]), ("packed", [])):
        batch = dock.get("ref" if layout == "padded" else "train", ["tokens", "score"], 3, layout=layout)
        assert type(batch.data).__name__ == "TensorDict" and batch.data.batch_size == torch.Size(batch_size)
        assert batch.data is batch.data  # built once
        for name, column in batch.columns.items():
            assert batch.data[name] is column


@pytest.mark.integration  # a fresh interpreter (subprocess)
def test_a_consumer_reading_columns_never_imports_tensordict():
    """tensordict's import (which pulls in torch._dynamo) is paid only through `Batch.data`."""
    script = (
        "import sys, torch\n"
        "from entrepot.dock import ExperienceDock\n"
        "dock = ExperienceDock(4, columns=['tokens'], consumers=['train'])\n"
        "dock.put({'tokens': [torch.tensor([1, 2]), torch.tensor([3])]}, [0, 1])\n"
        "batch = dock.get('train', ['tokens'], 2)\n"
        "assert batch.columns['tokens'].tolist() == [[1, 2], [3, 0]]\n"
        "before = 'tensordict' in sys.modules\n"
        "batch.data\n"
        "print(before, 'tensordict' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"]


def test_rows_must_be_ready_in_all_requested_columns(dock, make_rows):
    fill(dock, make_rows, [0, 1])
    dock.put({"logp": [torch.ones(2)]}, [1])
    assert dock.get("ref", ["tokens", "logp"], 1).indexes.tolist() == [1]


def test_min_count_returns_partial_batch(dock, make_rows):
    fill(dock, make_rows, [0, 1])
    batch = dock.get("ref", ["tokens"], 8, min_count=2)
    assert batch.indexes.tolist() == [0, 1]


def test_tail_batch_when_fewer_rows_left_than_count(dock, make_rows):
    fill(dock, make_rows, [0, 1, 2])
    assert len(dock.get("ref", ["tokens"], 2)) == 2
    assert dock.get("ref", ["tokens"], 2).indexes.tolist() == [2]  # only one row left in the dock
    assert dock.get("ref", ["tokens"], 2) is None  # consumer has everything
    assert dock.all_consumed("ref")


def test_group_mode_takes_whole_groups():
    dock = ExperienceDock(
        prompts_num=4, n_samples_per_prompt=2, columns=["x"], consumers=["c"], group_gets=True
    )
    dock.put({"x": torch.arange(3.0)}, [0, 1, 2])  # group 1 incomplete
    dock.put({"x": torch.arange(2.0)}, [6, 7])
    assert dock.get("c", ["x"], 4).indexes.tolist() == [0, 1, 6, 7]
    with pytest.raises(GroupSizeError, match="n_samples_per_prompt"):
        dock.get("c", ["x"], 3)
    assert dock.get("c", ["x"], 1, groups=False).indexes.tolist() == [2]


def test_random_sampler_is_seeded_and_covers_all_rows(make_rows):
    def order(seed):
        dock = ExperienceDock(64, columns=["x"], consumers=["c"], seed=seed)
        dock.put({"x": torch.arange(64)}, torch.arange(64))
        out = []
        while (batch := dock.get("c", ["x"], 8, sampler=Sampler(kind="random"))) is not None:
            out.append(batch.indexes.tolist())
        return out

    a, b, c = order(0), order(0), order(1)
    assert a == b and a != c
    assert sorted(i for chunk in a for i in chunk) == list(range(64))
    assert a[0] != list(range(8))


def test_explicit_indexes_keep_order_and_wait_for_rows(dock, make_rows):
    fill(dock, make_rows, [3])

    def late_put():
        time.sleep(0.1)
        fill(dock, make_rows, [9])

    thread = threading.Thread(target=late_put)
    thread.start()
    batch = dock.get("ref", ["tokens"], 0 + 2, indexes=[9, 3], timeout=10)
    thread.join()
    assert batch.indexes.tolist() == [9, 3]
    assert batch.data["tokens"][0, 0].item() == 9000
    with pytest.raises(AlreadyConsumedError, match="row 9"):
        dock.get("ref", ["tokens"], 1, indexes=[9])


def test_blocked_get_wakes_on_put(dock, make_rows):
    dock.put({"score": torch.zeros(2)}, [0, 1])  # rows 0 and 1 exist; their tokens come later
    result = {}

    def consumer():
        result["batch"] = dock.get("ref", ["tokens"], 2, timeout=10)

    thread = threading.Thread(target=consumer)
    thread.start()
    fill(dock, make_rows, [0])
    time.sleep(0.05)
    assert thread.is_alive()  # one row is not enough
    fill(dock, make_rows, [1])
    thread.join(5)
    assert result["batch"].indexes.tolist() == [0, 1]
    assert dock.metrics()["dock/wait_s/ref"] > 0


def test_timeout_raises_and_takes_nothing(dock, make_rows, snapshot, same_state):
    dock.put({"score": torch.zeros(2)}, [0, 1])
    dock.put({"tokens": make_rows([2])}, [0])  # row 1 has no tokens yet
    before = snapshot(dock)
    with pytest.raises(DockTimeout, match=r"'ref'.*2 rows.*\['tokens'\]"):
        dock.get("ref", ["tokens"], 2, timeout=0.05)
    with pytest.raises(DockTimeout, match="rows"):
        dock.get("ref", ["tokens"], 1, indexes=[4], timeout=0)
    same_state(before, snapshot(dock))


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"consumer": "nobody"}, UnknownConsumerError, "'nobody'"),
        ({"columns": ["tokens", "nope"]}, UnknownColumnError, "'nope'"),
        ({"columns": "tokens"}, InvalidArgumentError, "list"),
        ({"columns": ["tokens", "tokens"]}, InvalidArgumentError, "distinct"),
        ({"count": 0}, InvalidArgumentError, "count"),
        ({"min_count": 5}, InvalidArgumentError, "min_count"),
        ({"sampler": "random"}, InvalidArgumentError, "sampler must be a Sampler"),
        ({"layout": "ragged"}, InvalidArgumentError, "layout"),
        ({"padding": -1}, InvalidArgumentError, "padding must be a Padding"),
        ({"indexes": [99]}, IndexOutOfRangeError, "99"),
        ({"sampler": Sampler(kind="balanced", num_ranks=3)}, InvalidArgumentError, "num_ranks"),
        ({"groups": True}, GroupSizeError, "multiples"),
    ],
)
def test_get_errors_change_nothing(make_dock, make_rows, snapshot, same_state, kwargs, error, needle):
    dock = make_dock(n_samples_per_prompt=4)  # only read by group mode
    fill(dock, make_rows, [0, 1])
    call = {"consumer": "ref", "columns": ["tokens"], "count": 2, **kwargs}
    before = snapshot(dock)
    with pytest.raises(error, match=needle):
        dock.get(call.pop("consumer"), call.pop("columns"), call.pop("count"), **call)
    same_state(before, snapshot(dock))


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: Sampler(kind="lifo"), "sampler kind must be one of"),
        (lambda: Sampler(kind="balanced", num_ranks=0), "num_ranks must be an int >= 1, got 0"),
        (lambda: Padding(multiple=0), "multiple must be an int >= 1, got 0"),
        (lambda: Padding(multiple=2.0), "multiple must be an int >= 1, got 2.0"),
    ],
)
def test_bad_get_options_are_refused_when_built(build, needle):
    with pytest.raises(InvalidArgumentError, match=needle):
        build()


def test_peek_does_not_consume(dock, make_rows):
    fill(dock, make_rows, [0])
    assert dock.peek(["tokens"], [0]).indexes.tolist() == [0]
    assert dock.get("ref", ["tokens"], 1).indexes.tolist() == [0]
    with pytest.raises(NotReadyError, match="row 0 of column 'logp'"):
        dock.peek(["logp"], [0])


def test_get_cost_does_not_scan_capacity_in_python():
    # 1M rows: a FIFO get stops at the first chunk holding enough rows (a correctness check of the
    # chunked scan at large capacity; the timing claim lives in the benchmark).
    dock = ExperienceDock(1_000_000, columns=["x"], consumers=["c"])
    dock.put({"x": torch.arange(10.0)}, torch.arange(999_990, 1_000_000))
    dock.put({"x": torch.arange(4.0)}, torch.arange(4))
    assert dock.get("c", ["x"], 6).indexes.tolist() == [0, 1, 2, 3, 999_990, 999_991]
