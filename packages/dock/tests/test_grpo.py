"""GRPODock preset: columns, consumers, prompt fan-out, group gets."""

from __future__ import annotations

import pytest
import torch

from entrepot.dock import (
    GRPO_COLUMNS,
    GRPO_CONSUMERS,
    DockConfigError,
    DockFullError,
    GRPODock,
    InvalidArgumentError,
)


def test_preset_has_seed_columns_and_consumers_plus_user_ones():
    dock = GRPODock(2, 4, extra_columns=["answer"], extra_consumers=["judge"])
    assert set(GRPO_COLUMNS) <= set(dock.columns) and "answer" in dock.columns
    assert set(GRPO_CONSUMERS) <= set(dock.consumers) and "judge" in dock.consumers
    assert dock.capacity == 8
    with pytest.raises(DockConfigError, match="responses"):
        GRPODock(2, 4, extra_columns=["responses"])


def test_put_prompts_fans_out_each_prompt_to_its_group():
    dock = GRPODock(4, 3, extra_columns=["answer"])
    padded = torch.tensor([[5, 6, 0], [7, 8, 9]])
    rows = dock.put_prompts(padded, 3, lengths=torch.tensor([2, 3]), extra={"answer": torch.tensor([10, 20])})
    assert rows.tolist() == [0, 1, 2, 3, 4, 5]
    batch = dock.get("rule_reward", ["prompts", "prompt_length", "answer"], 6)
    assert batch.data["prompts"][:3].tolist() == [[5, 6, 0]] * 3
    assert batch.data["prompts"][3:].tolist() == [[7, 8, 9]] * 3
    assert batch.data["prompt_length"].tolist() == [2, 2, 2, 3, 3, 3]
    assert batch.data["answer"].tolist() == [10, 10, 10, 20, 20, 20]


def test_put_prompts_errors():
    dock = GRPODock(1, 2)
    with pytest.raises(InvalidArgumentError, match="n_samples_per_prompt is 2"):
        dock.put_prompts([torch.tensor([1])], 4)
    with pytest.raises(DockFullError, match="2 prompts need 2 free groups"):
        dock.put_prompts([torch.tensor([1]), torch.tensor([2])])
    assert dock.progress("actor_rollout")["live"] == 0


def test_grpo_phases_in_order():
    dock = GRPODock(2, 2)
    dock.put_prompts([torch.tensor([1, 2]), torch.tensor([3])])
    batch = dock.get("actor_rollout", ["prompts"], 4)
    responses = [torch.arange(n + 1) for n in range(4)]
    dock.put(
        {"responses": responses, "response_length": torch.tensor([1, 2, 3, 4]), "rm_scores": torch.ones(4)},
        batch.indexes,
    )
    for stage, column in (("ref_log_prob", "ref_log_prob"), ("actor_log_prob", "old_log_prob")):
        got = dock.get(stage, ["responses"], 2)
        dock.put({column: [torch.zeros(int(n)) for n in got.lengths["responses"]]}, got.indexes)
        got = dock.get(stage, ["responses"], 2)
        dock.put({column: [torch.zeros(int(n)) for n in got.lengths["responses"]]}, got.indexes)
    adv = dock.get("compute_advantage", ["rm_scores", "responses"], 4)
    dock.put({"advantages": torch.ones(len(adv))}, adv.indexes)
    train = dock.get("actor_train", ["responses", "old_log_prob", "ref_log_prob", "advantages"], 4)
    assert train.data["advantages"].shape == (4,)  # one scalar per response
    assert train.lengths["old_log_prob"].tolist() == [1, 2, 3, 4]
    assert dock.get("actor_train", ["responses"], 2) is None


def test_grpo_dock_is_a_grpo_dock_client():
    from entrepot.dock import DockClient, ExperienceDock, GRPODockClient

    assert isinstance(GRPODock(1, 2), GRPODockClient)
    plain = ExperienceDock(2, columns=["x"], consumers=["c"])
    assert isinstance(plain, DockClient) and not isinstance(plain, GRPODockClient)
