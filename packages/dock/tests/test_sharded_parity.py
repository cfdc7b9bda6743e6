"""Parity: the same calls on one dock, a Ray dock and a sharded dock give the same results, errors, state.

Each test drives a `Trio` (tests_support_parity): every call runs on a one-process dock, then on a
`RayDockClient` and a `ShardedDockClient` built with the same arguments; results (indexes, data,
lengths, ages, leases), errors (type and message) and afterwards the state must be equal. The
bad-input catalogue (tests_support_bad_inputs) runs here on all three.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")

from tests_support_bad_inputs import CATALOGUE, DOCK_KWARGS, prepare  # noqa: E402
from tests_support_parity import Each, Trio, each, launch_trio, run_catalogue  # noqa: E402

from entrepot.dock import (  # noqa: E402
    AlreadyConsumedError,
    ColumnLayoutError,
    DockConfigError,
    DockFullError,
    DockTimeout,
    DuplicateIndexError,
    ExperienceDock,
    GroupSizeError,
    GRPODock,
    IndexOutOfRangeError,
    InvalidArgumentError,
    LeaseError,
    LossyDtypeError,
    NotReadyError,
    Padding,
    RowCountMismatchError,
    Sampler,
    UnknownColumnError,
    UnknownConsumerError,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("local_ray")]  # a Ray of 2 CPUs (conftest)


# Launching a dock actor starts a worker process per actor (seconds each on a small machine), so the
# tests share two trios; each test starts from a `reset` (itself compared on every dock).
@pytest.fixture(scope="module")
def _plain(local_ray: None) -> Any:
    """16 rows in groups of 2 over 3 shards; no partial rollout (the catalogue's DOCK_KWARGS)."""
    yield from launch_trio(ExperienceDock, 3, **DOCK_KWARGS)


@pytest.fixture(scope="module")
def _grpo(local_ray: None) -> Any:
    """4 prompt groups of 2 over 2 shards, partial rollout (max_age 3, max_staleness 1)."""
    yield from launch_trio(
        GRPODock, 2, prompts_num=4, n_samples_per_prompt=2, max_age=3, max_staleness=1,
        extra_columns=["answer", "tag"], extra_consumers=["judge"],
    )  # fmt: skip


@pytest.fixture
def plain(_plain: Trio) -> Trio:
    _plain("reset")
    return _plain


@pytest.fixture
def grpo(_grpo: Trio) -> Trio:
    _grpo("reset")
    return _grpo


def _seqs(lengths: list[int], start: int = 0) -> list[torch.Tensor]:
    return [torch.arange(n) + 100 * (start + i) for i, n in enumerate(lengths)]


# ---------------------------------------------------------------------- sampling


def test_balanced_and_random_samplers_pick_and_order_rows_as_one_dock(plain):
    dock = plain
    lengths = [n for g in (200, 180, 20, 10, 150, 160, 30, 40) for n in (g // 2, g // 2)]
    dock("put", {"x": [torch.zeros(n) for n in lengths], "s": torch.arange(16)}, range(16))
    batch = dock("get", "c", ["x", "s"], 16, sampler=Sampler(kind="balanced", num_ranks=4), groups=True)[0]
    parts = [int(part.lengths["x"].sum()) for part in batch.split(4)]
    assert sorted(batch.indexes.tolist()) == list(range(16)) and max(parts) - min(parts) < 100
    with pytest.raises(InvalidArgumentError, match="num_ranks"):
        dock("get", "d", ["x"], 8, sampler=Sampler(kind="balanced", num_ranks=3))
    with pytest.raises(InvalidArgumentError, match="min_count == count"):
        dock("get", "d", ["x"], 8, sampler=Sampler(kind="balanced", num_ranks=2), min_count=4)
    # single rows (no groups), balanced by a scalar column (one token a row) and a sequence column; random
    dock("get", "d", ["s"], 4, sampler=Sampler(kind="balanced", num_ranks=2))
    dock("get", "d", ["x"], 4, sampler=Sampler(kind="balanced", num_ranks=2), layout="packed")
    dock("get", "d", ["x"], 2, sampler=Sampler(kind="random"), groups=True)
    for _ in range(2):
        dock("get", "d", ["x", "s"], 3, sampler=Sampler(kind="random"), min_count=1)
    assert dock("get", "d", ["x"], 2, sampler=Sampler(kind="random")) == each(None)


# ---------------------------------------------------------------------- leases


def test_lease_key_retries_release_and_acking_puts(plain):
    dock = plain
    dock("put", {"x": _seqs([1, 2, 3, 4, 5, 6, 7, 8])}, range(8))
    first = dock("get", "a", ["x"], 4, lease=60, lease_key="task-7")
    retry = dock("get", "a", ["x"], 4, lease=60, lease_key="task-7")  # a retried task: the same rows
    assert all(a == b for a, b in zip(retry.lease, first.lease, strict=True))
    other = dock("get", "a", ["x"], 4, lease=60, lease_key="task-8")
    assert dock("release", other.lease) == each(4)
    assert dock("release", other.lease) == each(0)  # idempotent: a settled lease the dock issued
    again = dock("get", "a", ["x"], 4, lease=60, lease_key="task-8")  # released: taken anew
    assert again.indexes[0].tolist() == [4, 5, 6, 7]
    dock("ack", retry.lease, [0, 1])  # part of a lease
    with pytest.raises(LeaseError, match="does not hold row 0"):
        dock("ack", retry.lease, [0, 2])
    partial = dock("get", "a", ["x"], 4, lease=60, lease_key="task-7")  # the rows it still holds
    assert partial.indexes[0].tolist() == [2, 3]
    dock("put", {"y": torch.ones(2)}, [2, 3], ack=retry.lease)
    assert dock("get", "a", ["x"], 4, lease=60, lease_key="task-7") == each(None)  # done
    with pytest.raises(LeaseError, match="does not hold row 3"):
        dock("put", {"y": torch.ones(2)}, [3, 4], ack=again.lease)
    dock("put", {"y": torch.ones(4)}, [4, 5, 6, 7], ack=again.lease)
    with pytest.raises(LeaseError, match="expired, was released or acked"):
        dock("put", {"y": torch.ones(4)}, [4, 5, 6, 7], ack=again.lease)
    with pytest.raises(InvalidArgumentError, match="needs a lease"):
        dock("get", "b", ["x"], 4, lease_key="k")
    with pytest.raises(InvalidArgumentError, match="lease must be"):
        dock("get", "b", ["x"], 4, lease=0)
    assert dock("all_consumed", "a") == each(True)
    dock("clear")
    dock("put", {"x": _seqs([2] * 8)}, range(8))
    reused = dock("get", "a", ["x"], 4, lease=60, lease_key="task-7")  # a new iteration reuses keys
    assert reused.indexes[0].tolist() == [0, 1, 2, 3]


def test_expired_leases_give_rows_back_and_a_stale_acking_put_stores_nothing(plain):
    dock = plain
    dock("put", {"x": _seqs([3] * 8)}, range(8))
    dead = dock("get", "a", ["x"], 8, lease=0.3)
    time.sleep(0.5)
    late = dock("get", "a", ["x"], 8, lease=math.inf, timeout=5)  # the expired lease gave them back
    assert late.indexes[0].tolist() == list(range(8))
    # the put fails on the lease: y keeps no dtype, so an int64 put to y is fine afterwards
    with pytest.raises(LeaseError):
        dock("put", {"y": torch.ones(8)}, range(8), ack=dead.lease)
    dock("put", {"y": torch.arange(8)}, range(8), ack=late.lease)
    assert dock("progress", "a") == each({"consumed": 8, "live": 8})


# ---------------------------------------------------------------------- partial rollout


def _rollout(dock: Trio, finished: set[int], lease: float | None = None) -> Each:
    batch = dock("get", "actor_rollout", ["prompts"], 8, groups=False, min_count=1, lease=lease)
    rows = batch.indexes[0]
    responses = [torch.full((int(r) % 3 + 1,), int(r)) for r in rows]
    done = [int(r) in finished for r in rows]
    dock("put", {"responses": responses}, rows, completed=done, ack=batch.lease if lease else None)
    return batch


def test_partial_rollout_keeps_unfinished_groups_ages_them_and_max_age(grpo):
    dock = grpo
    prompts = [torch.arange(n + 1) for n in range(4)]
    assert dock("put_prompts", prompts, 2)[0].tolist() == list(range(8))  # every group: the same rows
    with pytest.raises(RowCountMismatchError, match="'completed'"):
        dock("put", {"responses": [torch.ones(1)] * 2}, [0, 1], completed=[True])
    _rollout(dock, finished={0, 1, 2, 5, 6, 7})  # groups 1 (row 3) and 2 (row 4) unfinished
    assert dock("finished_rows")[0].tolist() == [0, 1, 6, 7]
    got = dock("get", "actor_train", ["responses", "prompts"], 8, min_count=2, timeout=5)
    assert got.indexes[0].tolist() == [0, 1, 6, 7]
    assert dock("get", "actor_train", ["responses"], 2, timeout=5) == each(None)
    dock("clear")  # groups 1 and 2 stay, one clear older; only their unfinished rows go back
    assert dock("progress", "actor_train") == each({"consumed": 0, "live": 4})
    carried = _rollout(dock, finished={3}, lease=math.inf)
    assert carried.indexes[0].tolist() == [3, 4] and carried.ages[0].tolist() == [1, 1]
    dock("peek", ["prompts", "responses"], [2, 3, 4, 5], layout="packed")
    assert dock("finished_rows")[0].tolist() == [2, 3]
    # new prompts fill the free groups around the kept one (every free group: the same rows)
    assert dock("put_prompts", prompts[:2])[0].tolist() == [0, 1, 6, 7]
    dock("clear")
    rows = _rollout(dock, finished=set()).indexes[0]  # group 2 is at age 2 = max_age - 1: completed
    assert 4 in rows.tolist()
    dock("peek", ["responses"], [4, 5])
    dock("get", "rule_reward", ["responses"], 8, min_count=2, timeout=5)
    dock("clear")
    dock("clear", [0, 1])


def test_set_policy_version_drops_stale_groups(grpo):
    dock = grpo
    dock("set_policy_version", 4)
    prompts = [torch.tensor([p]) for p in range(4)]
    dock("put_prompts", prompts)
    _rollout(dock, finished={1, 4, 5, 6, 7})  # groups 0 and 1 unfinished, every row born at version 4
    dock("clear")  # groups 2 and 3 leave
    dock("set_policy_version", 5)
    assert dock("put_prompts", prompts[:2])[0].tolist() == [4, 5, 6, 7]
    _rollout(dock, finished=set())  # groups 2 and 3 born at 5
    dock("clear")
    assert dock("set_policy_version", 6) == each(4)  # groups 0 and 1 are 2 versions old: dropped
    assert dock("progress", "actor_rollout") == each({"consumed": 0, "live": 4})
    with pytest.raises(InvalidArgumentError, match="policy version"):
        dock("set_policy_version", 5)
    with pytest.raises(InvalidArgumentError, match="policy version"):
        dock("set_policy_version", True)
    with pytest.raises(NotReadyError, match="row 0 of column 'prompts'"):
        dock("peek", ["prompts"], [0])
    assert dock("put_prompts", prompts[:2])[0].tolist() == [0, 1, 2, 3]
    assert dock("set_policy_version", 7) == each(4)  # groups 2 and 3 (born at 5) are 2 versions old
    assert [dock.metrics()["dock/rows_stale"] for dock in dock.docks] == [8, 8, 8]


# ---------------------------------------------------------------------- prompts


def test_put_prompts_with_extra_columns_and_a_full_dock(grpo):
    dock = grpo
    padded = torch.tensor([[5, 6, 0], [7, 8, 9], [1, 0, 0], [2, 3, 0]])
    rows = dock("put_prompts", padded, 2, lengths=torch.tensor([2, 3, 1, 2]),
                extra={"answer": torch.tensor([10, 20, 30, 40])})  # fmt: skip
    assert rows[0].tolist() == list(range(8))
    batch = dock("get", "rule_reward", ["prompts", "prompt_length", "answer"], 8)[0]
    assert batch.data["answer"].tolist() == [10, 10, 20, 20, 30, 30, 40, 40]
    with pytest.raises(DockFullError, match="1 prompts need 1 free groups of 2 rows; 0 are free"):
        dock("put_prompts", [torch.tensor([1])], extra={"answer": torch.tensor([50])})
    with pytest.raises(InvalidArgumentError, match="n_samples_per_prompt is 2"):
        dock("put_prompts", [torch.tensor([1])], 4)
    dock("clear", [2, 3, 4, 5])  # groups 1 and 2 are free again
    with pytest.raises(UnknownColumnError, match="'nope'"):
        dock("put_prompts", [torch.tensor([1])], extra={"nope": torch.tensor([1])})
    with pytest.raises(LossyDtypeError, match="'answer'"):
        dock(
            "put_prompts", [torch.tensor([1]), torch.tensor([2])], extra={"answer": torch.tensor([0.5, 1.5])}
        )
    with pytest.raises(DockFullError, match="3 prompts need 3 free groups of 2 rows; 2 are free"):
        dock("put_prompts", [torch.tensor([1])] * 3)
    # the failed calls held no group: both free groups are there for the next put
    answers = torch.tensor([[7], [8]])  # [P, 1]: one scalar per prompt in a column that learned scalars
    rows = dock("put_prompts", [torch.tensor([4, 4]), torch.tensor([6])], extra={"answer": answers})
    assert rows[0].tolist() == [2, 3, 4, 5]
    dock("get", "actor_rollout", ["prompts", "answer"], 8, layout="packed")


def test_put_prompts_spreads_groups_over_shards_where_one_dock_takes_the_first(grpo):
    """Documented in sharded.py ("What sharding changes"): other free groups, the same prompt data."""
    dock = grpo
    prompts = [torch.tensor([1, 2]), torch.tensor([3])]
    one, sharded = dock.one.put_prompts(prompts), dock.sharded.put_prompts(prompts)
    assert one.tolist() == [0, 1, 2, 3] and sharded.tolist() == [0, 1, 4, 5]  # group 2: shard 1's first
    a, b = (
        dock.one.peek(["prompts", "prompt_length"], one),
        dock.sharded.peek(["prompts", "prompt_length"], sharded),
    )
    assert torch.equal(a.data["prompts"], b.data["prompts"])
    assert torch.equal(a.data["prompt_length"], b.data["prompt_length"])


# ---------------------------------------------------------------------- reset


def test_reset_forgets_rows_leases_and_learned_dtypes(plain):
    dock = plain
    dock("put", {"x": [torch.ones(2, dtype=torch.float64)] * 4, "s": torch.arange(4)}, range(4))
    held = dock("get", "c", ["x"], 2, lease=math.inf)
    dock("get", "c", ["x", "s"], 2, sampler=Sampler(kind="random"))
    dock("reset")
    with pytest.raises(LeaseError):
        dock("ack", held.lease)
    dock("put", {"x": [torch.ones(3, dtype=torch.int8)] * 2, "s": torch.tensor([0.5, 1.5])}, [4, 5])
    assert dock("peek", ["x", "s"], [5, 4]).data[0]["x"].dtype == torch.int8
    again = dock("get", "c", ["x", "s"], 2, sampler=Sampler(kind="random"), timeout=5)
    assert again.indexes[0].tolist() == [4, 5]
    assert dock("all_consumed", "c") == each(True)


# ---------------------------------------------------------------------- explicit indexes, errors


def test_explicit_indexes_already_consumed_and_group_size_errors(plain):
    dock = plain
    dock("put", {"x": _seqs(list(range(1, 13))), "s": torch.arange(12, dtype=torch.float64)}, range(12))
    assert dock("get", "c", ["x"], 3, indexes=[9, 2, 5]).indexes[0].tolist() == [9, 2, 5]
    with pytest.raises(AlreadyConsumedError, match="consumer 'c' already received row 9"):
        dock("get", "c", ["x"], 2, indexes=[1, 9])
    with pytest.raises(GroupSizeError, match="multiples of n_samples_per_prompt"):
        dock("get", "c", ["x"], 3, groups=True)
    with pytest.raises(GroupSizeError, match="multiples"):
        dock("get", "c", ["x"], 4, min_count=3, groups=True)
    with pytest.raises(DockTimeout, match="rows \\[0, 1\\]"):
        dock("get", "c", ["x", "y"], 2, indexes=[0, 1], timeout=0.1)  # y is not ready
    with pytest.raises(DockTimeout, match="4 rows"):
        dock("get", "d", ["y"], 4, timeout=0.1)
    held = dock("get", "d", ["x"], 2, indexes=[11, 10], lease=math.inf)
    with pytest.raises(DockTimeout):  # held under a lease by the same consumer: waits
        dock("get", "d", ["x"], 1, indexes=[10], timeout=0.1)
    dock("release", held.lease)
    dock("get", "d", ["x"], 2, indexes=[10], layout="packed", padding=Padding(multiple=4))
    for layout in ("padded", "packed"):  # no rows: empty columns of the stored dtypes and kinds
        dock("get", "d", ["x", "s"], 2, indexes=[], layout=layout)
        dock("peek", ["x", "s"], [], layout=layout)
    got = dock("get", "c", ["x"], 4, groups=True, padding=Padding(value=-1, multiple=4))  # whole groups only
    assert got.indexes[0].tolist() == [0, 1, 6, 7]
    assert dock("progress", "c") == each({"consumed": 7, "live": 12})


def test_failed_puts_and_gets_change_nothing(grpo):
    dock = grpo
    dock("put_prompts", [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4]), torch.tensor([5, 6])])
    dock("put", {"rm_scores": torch.arange(8, dtype=torch.int32), "tag": torch.arange(8)}, range(8))
    bad_puts = [
        (UnknownColumnError, ({"nope": torch.ones(1)}, [0])),
        (LossyDtypeError, ({"rm_scores": torch.ones(1)}, [0])),
        (DuplicateIndexError, ({"rm_scores": torch.ones(2, dtype=torch.int32)}, [1, 1])),
        (IndexOutOfRangeError, ({"rm_scores": torch.ones(1, dtype=torch.int32)}, [8])),
        (RowCountMismatchError, ({"responses": [torch.ones(2)]}, [0, 1])),
        (ColumnLayoutError, ({"responses": torch.ones(2)}, [0, 1])),  # scalars into a sequence column
        (ColumnLayoutError, ({"tag": [torch.ones(2), torch.ones(2)]}, [0, 1])),  # sequences into scalars
        (InvalidArgumentError, ({}, [0])),
        # two errors at once: the first check that fails is the one reported
        (UnknownColumnError, ({"responses": torch.ones(3, 3, 3), "nope": torch.ones(1)}, [0])),
    ]
    for error, (data, rows) in bad_puts:
        with pytest.raises(error):
            dock("put", data, rows)
    with pytest.raises(RowCountMismatchError, match="'completed'"):
        dock("put", {"responses": torch.ones(3, 3, 3)}, [0], completed=[True, False])
    # forms read as scalars because the column learned scalars (its spec leaves the kind open)
    dock("put", {"tag": torch.tensor([[5]])}, [0])
    dock("put", {"tag": [torch.tensor([6]), torch.tensor(7)]}, [1, 2])
    dock("put", {"old_log_prob": torch.empty(0, dtype=torch.float64)}, [])  # no rows: nothing learned
    dock("put", {"old_log_prob": [torch.ones(2, dtype=torch.float16)]}, [1])
    bad_gets = [
        (UnknownConsumerError, ("nobody", ["prompts"], 2), {}),
        (UnknownColumnError, ("judge", ["nope"], 2), {}),
        (InvalidArgumentError, ("judge", "prompts", 2), {}),  # a name, not a list of names
        (InvalidArgumentError, ("judge", ["prompts"], 0), {}),
        (GroupSizeError, ("judge", ["prompts"], 3), {}),
        (IndexOutOfRangeError, ("judge", ["prompts"], 2), {"indexes": [8]}),
        (DuplicateIndexError, ("judge", ["prompts"], 2), {"indexes": [1, 1]}),
        (InvalidArgumentError, ("judge", ["prompts"], 2), {"sampler": "lifo"}),
        (InvalidArgumentError, ("judge", ["prompts"], 2), {"layout": "ragged"}),
        (InvalidArgumentError, ("judge", ["prompts"], 2), {"min_count": 4}),
        (DockTimeout, ("judge", ["prompts", "responses"], 2), {"timeout": 0.05}),
    ]
    for error, args, kwargs in bad_gets:
        with pytest.raises(error):
            dock("get", *args, **kwargs)
    with pytest.raises(UnknownColumnError):
        dock("peek", ["nope"], [99])  # the column is checked first
    with pytest.raises(InvalidArgumentError, match="'prompts'"):
        dock("peek", "prompts", [0])
    with pytest.raises(NotReadyError, match="row 0 of column 'responses'"):
        dock("peek", ["prompts", "responses"], [0, 1])
    assert dock("progress", "judge") == each({"consumed": 0, "live": 8})
    dock("get", "judge", ["prompts", "tag", "rm_scores", "old_log_prob"], 4, indexes=[1])


def test_completed_needs_partial_rollout(plain):
    with pytest.raises(DockConfigError, match="rollout_consumer"):
        plain("put", {"x": torch.ones(2)}, [0, 1], completed=[True, True])
    with pytest.raises(DockConfigError, match="rollout_consumer"):
        plain("put", {"x": torch.ones(0)}, [], completed=[])


# ---------------------------------------------------------------------- one behaviour on every client


def test_the_bad_input_catalogue_on_every_client(plain):
    """Every case of the catalogue (tests_support_bad_inputs) on one dock, the Ray dock and the sharded
    dock: the same typed error naming the argument, the same message, and every dock as it was."""
    tally, problems = run_catalogue(plain, prepare(plain))
    print(f"\nbad-input catalogue, {len(CATALOGUE)} cases: {tally}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("lease", [None, math.inf])
def test_a_get_that_fails_in_the_client_after_the_take_gives_its_rows_back(plain, monkeypatch, lease):
    """The batch cannot be laid out (no memory) where the get runs: in this process for every client,
    after the Ray actor or the sharded dock's controller took the rows. The rows go back, the metrics
    count no get, and the next get takes them."""
    import entrepot.dock._dock as one_module
    import entrepot.dock._ray_client as ray_module
    import entrepot.dock._shard_router as sharded_module

    dock = plain
    dock("put", {"x": [torch.arange(n + 1) for n in range(8)]}, range(8))

    def no_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("no memory for the batch")

    with monkeypatch.context() as patch:
        for module in (one_module, ray_module, sharded_module):
            patch.setattr(module, "build_batch", no_memory)
        with pytest.raises(MemoryError):
            dock("get", "a", ["x"], 4, lease=lease)
    assert dock("progress", "a") == each({"consumed": 0, "live": 8})
    for key in (
        "dock/gets",
        "dock/rows_got/a",
        "dock/bytes_got/a",
        "dock/rows_leased/a",
        "dock/rows_returned/a",
    ):
        assert [d.metrics()[key] for d in dock.docks] == [0, 0, 0], key
    again = dock("get", "a", ["x"], 4, lease=lease)
    assert again.indexes[0].tolist() == [0, 1, 2, 3]
