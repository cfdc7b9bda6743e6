"""Environments the multi-turn training tests load by dotted path (``tests_support_envs:Name``), and the
calculator task's overrides the multi-turn runs share."""

from __future__ import annotations

from entrepot.grpo.multiturn import Environment, Row, Step

CALCULATOR = [
    "data.task=addition", "data.num_digits=4", "model.max_positions=32", "rollout.max_new_tokens=6",
    "multiturn.environment=calculator", "multiturn.max_turns=3", "multiturn.max_tokens=20",
    "multiturn.max_observation_tokens=8", "algorithm.kl_coef=0.0",
]  # fmt: skip
"""The calculator task as `packages/cli/configs/calculator.yaml` sets it up, without the reference."""


class Echo(Environment):
    """Answers each model turn with ``ok`` twice, then ends; reward: 1 when the last turn is short."""

    def reset(self, row: Row) -> None:
        self.turns = 0

    def step(self, action: str) -> Step:
        self.turns += 1
        if self.turns < 3:
            return Step(observation="ok", info={"turns": float(self.turns)})
        return Step(reward=float(len(action) <= 2), done=True)


class FailsOnOddRows(Environment):
    """Raises in `step` for odd dock rows; the others end after one turn with reward 1."""

    def reset(self, row: Row) -> None:
        self.row = row

    def step(self, action: str) -> Step:
        if self.row.index % 2:
            raise RuntimeError(f"tool backend down for row {self.row.index}")
        return Step(reward=1.0, done=True)
