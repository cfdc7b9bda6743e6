"""Agent training runs: the shipped example config (`agent-calculator.yaml`) trains 2 steps, and agents
that edit their history (409), use a wrong token (401) or raise end only their own trajectories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrepot.grpo import load_config
from entrepot.grpo.trainer import Trainer

pytestmark = pytest.mark.integration  # training runs

CONFIG = Path(__file__).parents[2] / "cli" / "configs" / "agent-calculator.yaml"
SMALL = [
    "max_steps=2", "rollout.prompts_per_step=8", "rollout.n_samples_per_prompt=4", "eval.every=0",
    "eval.num_prompts=8", "checkpoint.save_every=0", "logging.tensorboard=false", "resources.use_ray=false",
]  # fmt: skip


def _fit(tmp_path: Path, *overrides: str) -> list[dict]:
    trainer = Trainer(load_config(CONFIG, [*SMALL, *overrides]), tmp_path / "run")
    try:
        return trainer.fit()
    finally:
        trainer.close()


def test_the_agent_calculator_config_trains_two_steps(tmp_path: Path) -> None:
    rows = _fit(tmp_path, "logging.samples_every=1")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["multiturn/trajectories"] == 32 and row["multiturn/env_failures"] == 0
        assert row["agents/requests"] >= 32 and row["agents/refused"] == 0
        assert row["multiturn/end_done"] == 32 and row["rollout_tokens"] > 0
    assert any(r["multiturn/env_token_frac"] > 0 for r in rows)  # tool messages, masked, in trajectories
    assert "accuracy" in rows[-1] and "eval_turns" in rows[-1]  # the greedy evaluation ran the agent too
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["end"] == "done" for s in samples)


def test_agents_that_edit_history_use_a_wrong_token_or_raise_end_only_their_trajectories(
    tmp_path: Path,
) -> None:
    rows = _fit(tmp_path, "multiturn.agent=tests_support_agents:misbehaves_by_row", "logging.samples_every=1",
                "logging.samples_per_step=32")  # fmt: skip
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["multiturn/end_agent_error"] == 24 and row["multiturn/env_failures"] == 24
        assert row["multiturn/end_done"] == 8
        assert row["agents/refused"] == 16  # the 409s and the 401s
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert {s["end"] for s in samples} == {"done", "agent_error"}
