"""The in-run evaluation's figures outside a worker: greedy, the first held-out prompts (benchmarks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from entrepot.grpo.data.sources import TaskSetup
from entrepot.grpo.engines.base import RolloutEngine
from entrepot.grpo.evaluation.runner import EvalSettings, evaluate_samples
from entrepot.grpo.evaluation.summary import in_run_metrics
from entrepot.grpo.multiturn.runner import TrajectoryRollout

if TYPE_CHECKING:
    from entrepot.grpo.config import RewardConfig

__all__ = ["greedy_eval"]


def greedy_eval(
    engine: RolloutEngine, setup: TaskSetup, reward: RewardConfig, num_prompts: int, *,
    max_prompt_tokens: int, multiturn: TrajectoryRollout | None = None,
) -> dict[str, float]:  # fmt: skip
    """Greedy-decode `num_prompts` held-out prompts with `engine`: ``accuracy`` (the accuracy verifier
    scores >= 1), ``eval_reward`` under `reward.verifiers` and ``eval_prompts`` (a prompt file's held-out
    set may hold fewer than asked for); with `multiturn`, the environment's verdict and reward, and
    ``eval_turns``. What `ActorWorker.evaluate` reports, by the same `evaluate_samples`."""
    records = evaluate_samples(
        engine, setup, reward, setup.source.held_out(num_prompts), EvalSettings(),
        max_prompt_tokens=max_prompt_tokens, multiturn=multiturn,
    )  # fmt: skip
    return in_run_metrics(records, multiturn=multiturn is not None)
