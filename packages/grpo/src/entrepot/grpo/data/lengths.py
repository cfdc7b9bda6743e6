"""Token lengths a config implies: the response budget, the longest prompt + response, and the steps a
partial response may span.

The synthetic tasks' prompt and answer widths live with the tasks (`entrepot.grpo.data.tasks`); these
combine them with the `data` and `rollout` sections. Pure Python, so the preflight checks and the CLI
use them before torch loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from entrepot.grpo.data.tasks import SYNTHETIC_TASKS, answer_tokens, prompt_tokens

if TYPE_CHECKING:
    from entrepot.grpo.config import DataConfig, MultiTurnConfig, RolloutConfig

__all__ = ["FILE_RESPONSE_TOKENS", "longest_sequence", "partial_max_age", "response_budget"]

FILE_RESPONSE_TOKENS = 64  # response budget of file prompts when rollout.max_new_tokens is null


def response_budget(data: DataConfig, rollout: RolloutConfig) -> int:
    """Most tokens one response may have: rollout.max_new_tokens, else the task's answer width (files: 64)."""
    if rollout.max_new_tokens is not None:
        return rollout.max_new_tokens
    if data.task in SYNTHETIC_TASKS:
        return answer_tokens(data.task, data.num_digits)
    return FILE_RESPONSE_TOKENS


def longest_sequence(
    data: DataConfig, rollout: RolloutConfig, multiturn: MultiTurnConfig | None = None
) -> int:
    """Most tokens one prompt + response can have (what micro-batches and positions must hold); a
    multi-turn trajectory's response is up to `multiturn.max_tokens` long."""
    if data.task in SYNTHETIC_TASKS:
        prompt = prompt_tokens(data.task, data.num_digits)
    else:
        prompt = data.max_prompt_tokens
    if multiturn is not None and multiturn.enabled:
        return prompt + multiturn.max_tokens
    return prompt + response_budget(data, rollout)


def partial_max_age(data: DataConfig, rollout: RolloutConfig) -> int:
    """Steps a partial response may span: rollout.max_age, else what the response budget needs (1
    without partial rollout)."""
    partial = rollout.partial_max_tokens
    if partial is None:
        return 1
    return rollout.max_age or -(-response_budget(data, rollout) // partial)
