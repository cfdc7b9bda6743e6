"""One multi-turn trajectory: its tokens after the prompt, who wrote each, and why it ended."""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["FAILURES", "EndReason", "Trajectory", "trajectory_metrics"]


class EndReason(enum.IntEnum):
    """Why a trajectory ended (the dock's ``end_reason`` column holds the value)."""

    RUNNING = 0
    DONE = 1  # the environment said done
    MAX_TURNS = 2  # multiturn.max_turns model turns
    MAX_TOKENS = 3  # multiturn.max_tokens: no room for another model token
    OBSERVATION_TOO_LONG = 4  # a message over multiturn.max_observation_tokens (never cut)
    ENV_ERROR = 5  # the environment raised
    ENV_TIMEOUT = 6  # an environment call passed multiturn.env_timeout_s
    ENV_MALFORMED = 7  # the environment returned something that is not a Step, or a message it cannot render
    AGENT_ERROR = 8  # an agent (multiturn.agent) raised or returned no finite reward
    AGENT_TIMEOUT = 9  # an agent's episode passed multiturn.agent_timeout_s

    @property
    def label(self) -> str:
        return self.name.lower()


FAILURES = frozenset({
    EndReason.ENV_ERROR, EndReason.ENV_TIMEOUT, EndReason.ENV_MALFORMED, EndReason.AGENT_ERROR,
    EndReason.AGENT_TIMEOUT,
})  # fmt: skip
"""The reasons that are the environment's (or agent's) failures (counted in ``multiturn/env_failures``)."""


@dataclass
class Trajectory:
    """The tokens after the prompt, flat: model turns and environment messages in order.

    Attributes:
        row: its dock row.
        prompt: the prompt's tokens.
        tokens: every token after the prompt.
        model_mask: per token, whether the model sampled it (False: the environment's).
        logprobs: per token, the rollout's log-prob of a sampled token (0 at the environment's).
        reward: the sum of the environment's step rewards.
        turns: model turns taken.
        end: why it ended (RUNNING while in flight).
        detail: the failure's text, for the samples.
        info: the environment's last `Step.info`.
    """

    row: int
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    model_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    end: EndReason = EndReason.RUNNING
    detail: str = ""
    info: Mapping[str, float] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        """Whether it counts as accurate: the environment's ``info["correct"]``, else a reward >= 1;
        never when the environment failed (its last answer was an error, a timeout or malformed)."""
        if self.end in FAILURES:
            return False
        return bool(self.info["correct"]) if "correct" in self.info else self.reward >= 1.0

    @property
    def running(self) -> bool:
        return self.end is EndReason.RUNNING

    def add_model_turn(self, tokens: list[int], logprobs: list[float]) -> None:
        self.tokens += tokens
        self.model_mask += [True] * len(tokens)
        self.logprobs += logprobs
        self.turns += 1

    def add_observation(self, tokens: list[int]) -> None:
        self.tokens += tokens
        self.model_mask += [False] * len(tokens)
        self.logprobs += [0.0] * len(tokens)

    def context(self) -> torch.Tensor:
        """The prompt and everything after it: what the model's next turn continues."""
        return torch.tensor(self.prompt + self.tokens, dtype=torch.long)

    def finish(self, reason: EndReason, detail: str = "") -> None:
        if self.running:
            self.end, self.detail = reason, detail


def trajectory_metrics(
    trajs: Sequence[Trajectory], *, generated: int, generate_s: float, wait_s: float
) -> dict[str, float]:
    """The ``multiturn/*`` metrics of one batch of finished trajectories (`generated`: model tokens
    sampled; `generate_s`, `wait_s`: seconds in the engine and waiting for environments or agents)."""
    count = max(len(trajs), 1)
    ends = Counter(t.end for t in trajs)
    tokens = sum(len(t.tokens) for t in trajs)
    metrics = {
        "multiturn/turns_mean": sum(t.turns for t in trajs) / count,
        "multiturn/env_token_frac": sum(m is False for t in trajs for m in t.model_mask) / max(tokens, 1),
        "multiturn/env_failures": float(sum(ends[r] for r in FAILURES)),
        "multiturn/trajectories": float(len(trajs)),
        "time/multiturn_generate": generate_s,
        "time/multiturn_env_wait": wait_s,
        "rollout_tokens": float(generated),
    }
    metrics.update({f"multiturn/end_{reason.label}": float(ends[reason]) for reason in EndReason
                    if reason is not EndReason.RUNNING})  # fmt: skip
    keys = sorted({k for t in trajs for k in t.info})
    metrics.update({f"env/{k}": sum(float(t.info.get(k, 0.0)) for t in trajs) / count for k in keys})
    return metrics
