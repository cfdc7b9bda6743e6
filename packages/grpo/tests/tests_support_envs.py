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


class MisbehavesOnOddRows(Environment):
    """Odd dock rows misbehave: rows 1 and 3 of every 8 raise in `step`, row 5 answers a str in its
    info, row 7 a NaN verdict with reward 1; the even rows end after one turn with reward 1 and are
    judged wrong (so any accuracy above 0 is a false success)."""

    def reset(self, row: Row) -> None:
        self.row = row

    def step(self, action: str) -> Step:
        kind = self.row.index % 8
        if kind in (1, 3):
            raise RuntimeError(f"tool backend down for row {self.row.index}")
        if kind == 5:
            return Step(reward=1.0, done=True, info={"x": "str"})  # type: ignore[dict-item]
        if kind == 7:
            return Step(reward=1.0, done=True, info={"correct": float("nan")})
        return Step(reward=1.0, done=True, info={"correct": 0.0})
