"""Partial rollout: unfinished rows skip downstream consumers, survive clear with an age, max_age."""

from __future__ import annotations

import torch

from entrepot.dock import GRPODock


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
