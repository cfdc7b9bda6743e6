"""Partial rollout: unfinished rows skip downstream consumers, survive clear with an age, max_age."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch

from entrepot.dock import DockStateError, GRPODock, InvalidArgumentError


def _rollout(dock, finished):
    """One rollout pass: take every prompt row, write a response, mark rows finished or not."""
    batch = dock.get("actor_rollout", ["prompts"], 4, groups=False, min_count=1)
    rows = batch.indexes
    responses = [torch.full((2,), int(r)) for r in rows]
    dock.put({"responses": responses}, rows, completed=[int(r) in finished for r in rows])
    return rows.tolist(), batch.ages.tolist()


def test_unfinished_groups_wait_survive_clear_and_age():
    dock = GRPODock(2, 2, max_age=3)
    dock.put_prompts([torch.tensor([1, 2]), torch.tensor([3])])
    assert _rollout(dock, finished={0, 1, 2})[0] == [0, 1, 2, 3]
    # group 0 complete; group 1 has an unfinished row, so downstream sees only group 0
    assert dock.get("actor_train", ["responses"], 4, min_count=2).indexes.tolist() == [0, 1]
    dock.clear()
    assert dock.progress("actor_train") == {"consumed": 0, "live": 2}
    # only the unfinished row goes back to the rollout, one clear older
    rows, ages = _rollout(dock, finished=set())
    assert rows == [3] and ages == [1]
    assert dock.peek(["responses"], [3]).data["responses"].tolist() == [[3, 3]]
    dock.clear()
    rows, ages = _rollout(dock, finished=set())  # age 2 = max_age - 1: forced complete
    assert rows == [3] and ages == [2]
    assert dock.get("actor_train", ["responses"], 2).indexes.tolist() == [2, 3]
    dock.clear()
    assert dock.progress("actor_rollout") == {"consumed": 0, "live": 0}


def test_new_prompts_fill_free_groups_around_kept_ones():
    dock = GRPODock(3, 2)
    dock.put_prompts([torch.tensor([1]), torch.tensor([2])])
    _rollout(dock, finished={2, 3})  # group 0 unfinished
    dock.clear()
    rows = dock.put_prompts([torch.tensor([5]), torch.tensor([6])])
    assert rows.tolist() == [2, 3, 4, 5]


def test_downstream_ends_with_the_finished_groups_once_the_rollout_is_idle():
    """A downstream get returns the finished groups, then None; it does not wait for unfinished rows."""
    dock = GRPODock(3, 2)
    dock.put_prompts([torch.tensor([1]), torch.tensor([2]), torch.tensor([3])])
    batch = dock.get("actor_rollout", ["prompts"], 6, groups=False)
    dock.put({"responses": [torch.tensor([int(r)]) for r in batch.indexes]}, batch.indexes,
             completed=[True, True, True, False, True, True])  # fmt: skip
    assert dock.finished_rows().tolist() == [0, 1, 4, 5]
    got = dock.get("rule_reward", ["responses"], 6, min_count=2, timeout=5)
    assert got.indexes.tolist() == [0, 1, 4, 5]  # fewer than min_count's worth left: the tail
    assert dock.get("rule_reward", ["responses"], 2, timeout=5) is None


def test_downstream_waits_while_the_rollout_continues_under_a_lease():
    """Carried rows in flight (leased by the rollout) keep downstream gets waiting, not ending early."""
    dock = GRPODock(2, 2)
    dock.put_prompts([torch.tensor([1]), torch.tensor([2])])
    first = dock.get("actor_rollout", ["prompts"], 4, groups=False)
    dock.put({"responses": [torch.tensor([7])] * 4}, first.indexes, completed=[True, True, True, False])
    dock.clear()  # group 0 was trained; group 1 carries over (row 3 unfinished)
    carried = dock.get("actor_rollout", ["prompts"], 4, groups=False, min_count=1, lease=math.inf)
    assert carried.indexes.tolist() == [3]
    results: list = []
    reader = threading.Thread(target=lambda: results.append(
        dock.get("rule_reward", ["responses"], 2, timeout=10)))  # fmt: skip
    reader.start()
    time.sleep(0.2)
    assert reader.is_alive()  # the rollout still holds row 3: the reader must not give up
    dock.put({"responses": [torch.tensor([7, 8])]}, carried.indexes, completed=[True], ack=carried.lease)
    reader.join(5)
    assert results[0].indexes.tolist() == [2, 3]
    assert dock.get("rule_reward", ["responses"], 2, timeout=5) is None


def test_stale_groups_are_dropped_when_the_version_advances():
    dock = GRPODock(3, 2, max_staleness=1)
    dock.set_policy_version(4)
    dock.put_prompts([torch.tensor([1]), torch.tensor([2])])
    _rollout(dock, finished={1})  # both groups unfinished, born at version 4
    dock.clear()
    dock.set_policy_version(5)
    dock.put_prompts([torch.tensor([3])])  # group 2, born at 5
    batch = dock.get("actor_rollout", ["prompts"], 6, groups=False)
    dock.put({"responses": [torch.tensor([1])] * batch.indexes.numel()}, batch.indexes,
             completed=[False] * batch.indexes.numel())  # fmt: skip
    dock.clear()
    assert dock.set_policy_version(6) == 4  # groups 0 and 1 are 2 versions old: dropped
    assert dock.progress("actor_rollout")["live"] == 2
    assert dock.metrics()["dock/rows_stale"] == 4
    with pytest.raises(InvalidArgumentError, match="policy version"):
        dock.set_policy_version(5)


def test_versions_survive_a_state_round_trip_and_bad_ones_are_refused():
    dock = GRPODock(2, 2, max_staleness=3)
    dock.set_policy_version(2)
    dock.put_prompts([torch.tensor([1])])
    _rollout(dock, finished=set())
    state = dock.state_dict()
    again = GRPODock(2, 2, max_staleness=3)
    again.load_state_dict(state)
    assert again.policy_version == 2 and again.state_dict()["born"].tolist() == [2, 2, -1, -1]
    bad = dict(state, born=torch.tensor([2, 9, -1, -1]))
    with pytest.raises(DockStateError, match=r"born\[1\] is 9"):
        again.load_state_dict(bad)
