"""Checks of a config against the token lengths of its prompts and responses.

Which lengths a synthetic task has is the data wing's knowledge, so these checks live here rather
than in `GRPOConfig.__post_init__` (config imports no other wing). They are pure, like the config's
own checks, and `entrepot.grpo.run.preflight.check_inputs` runs them before anything starts; the
messages name the key and value as the config's do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from entrepot.grpo.config.fields import check
from entrepot.grpo.data.lengths import longest_sequence, partial_max_age, response_budget
from entrepot.grpo.data.tasks import HELD_OUT_POOL, SYNTHETIC_TASKS, distinct_prompts
from entrepot.grpo.data.word_problems import distinct_word_problems

if TYPE_CHECKING:
    from entrepot.grpo.config import (
        BatchingConfig,
        DataConfig,
        DockConfig,
        GRPOConfig,
        ModelConfig,
        MultiTurnConfig,
        RewardConfig,
        RolloutConfig,
    )

__all__ = [
    "check_dock_groups",
    "check_overlong_buffer",
    "check_partial_budget",
    "check_positions",
    "check_prompt_space",
    "check_task_fits",
    "check_token_budgets",
]


def check_task_fits(config: GRPOConfig) -> None:
    """Raise `GRPOConfigError` (naming the key) if the config's sequences do not fit what holds them."""
    check_prompt_space(config.data)
    check_dock_groups(config.data, config.rollout, config.dock)
    check_positions(config.data, config.rollout, config.model, config.multiturn)
    check_token_budgets(config.data, config.rollout, config.batching, config.multiturn)
    check_partial_budget(config.data, config.rollout)
    check_overlong_buffer(config.data, config.rollout, config.reward)


def check_dock_groups(data: DataConfig, rollout: RolloutConfig, dock: DockConfig) -> None:
    """Each dock shard holds whole prompt groups: a step's, and under partial rollout earlier steps'."""
    if dock.shards is None:
        return
    groups = rollout.prompts_per_step * partial_max_age(data, rollout)
    check(dock.shards <= groups, "dock.shards", dock.shards,
          f"<= the dock's prompt groups ({groups}): each shard holds whole groups")  # fmt: skip


def check_positions(
    data: DataConfig, rollout: RolloutConfig, model: ModelConfig, multiturn: MultiTurnConfig | None = None
) -> None:
    """A prompt plus its response must fit the built decoder's learned positions (a character task's
    prompt is its fixed width; code_functions' is data.max_prompt_tokens, each prompt checked against
    it by `run.preflight`).

    A local model's positions are checked once its directory is read (`run.preflight`).
    """
    if model.path is not None:  # the built decoder serves only the character tasks (config checks)
        return
    need = longest_sequence(data, rollout, multiturn)
    what = "multiturn.max_tokens" if multiturn is not None and multiturn.enabled else "response"
    check(
        need <= model.max_positions,
        "model.max_positions",
        model.max_positions,
        f">= {need} (prompt + {what} tokens of data.task={data.task!r})",
    )


def check_token_budgets(
    data: DataConfig,
    rollout: RolloutConfig,
    batching: BatchingConfig,
    multiturn: MultiTurnConfig | None = None,
) -> None:
    """Each pass's micro-batch token budget must hold the longest possible sequence (never truncated)."""
    if not batching.dynamic_batch_size:
        return
    longest = longest_sequence(data, rollout, multiturn)
    for name in ("ref_log_prob", "old_log_prob", "update"):
        budget, _ = batching.limits(name)
        override = getattr(batching, name).max_tokens is not None
        key = f"batching.{name}.max_tokens" if override else "batching.max_tokens_per_micro_batch"
        check(
            budget >= longest,
            key,
            budget,
            f">= {longest}, the longest prompt + response this config allows "
            "(data.max_prompt_tokens or the task's prompt, plus rollout.max_new_tokens)",
        )


def check_partial_budget(data: DataConfig, rollout: RolloutConfig) -> None:
    """A partial rollout's per-step tokens must be below the response budget (else it is not partial)."""
    partial = rollout.partial_max_tokens
    if partial is None:
        return
    budget = response_budget(data, rollout)
    check(partial < budget, "rollout.partial_max_tokens", partial,
          f"< the response budget ({budget}, rollout.max_new_tokens or the task's): else every "
          "response finishes in one step; use null")  # fmt: skip


def check_overlong_buffer(data: DataConfig, rollout: RolloutConfig, reward: RewardConfig) -> None:
    """DAPO's overlong buffer is a part of the response budget (else every response is punished)."""
    if not reward.overlong_buffer:
        return
    budget = response_budget(data, rollout)
    check(reward.overlong_buffer < budget, "reward.overlong_buffer", reward.overlong_buffer,
          f"< the response budget ({budget}, rollout.max_new_tokens or the task's)")  # fmt: skip


def check_prompt_space(data: DataConfig) -> None:
    """A synthetic task has prompts to train on beside its held-out pool (too few digits: it has not,
    and drawing a training prompt outside the pool would never end)."""
    if data.task == "word_problems":
        space = distinct_word_problems(data.word_problems)
        check(space > 2 * HELD_OUT_POOL, "data.word_problems.max_operand", data.word_problems.max_operand,
              f"large enough that the task has more than {2 * HELD_OUT_POOL} distinct problems (at "
              f"least {space}; {HELD_OUT_POOL} are held out for evaluation)")  # fmt: skip
        return
    if data.task not in SYNTHETIC_TASKS:
        return
    space = distinct_prompts(data.task, data.num_digits)
    check(space > 2 * HELD_OUT_POOL, "data.num_digits", data.num_digits,
          f"large enough that the task has more than {2 * HELD_OUT_POOL} distinct prompts (it has "
          f"{space}; {HELD_OUT_POOL} are held out for evaluation): reverse >= 4, addition >= 2")  # fmt: skip
