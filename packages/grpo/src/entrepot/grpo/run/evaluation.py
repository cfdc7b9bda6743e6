"""Greedy evaluation on held-out prompts: accuracy (the accuracy verifier scores >= 1) and reward."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from entrepot.grpo.data import rewards
from entrepot.grpo.data.sources import TaskSetup, encode_prompt
from entrepot.grpo.engines.base import RolloutEngine, SamplingParams
from entrepot.grpo.multiturn import MultiTurnRollout, Row

if TYPE_CHECKING:
    from entrepot.grpo.config import RewardConfig

__all__ = ["greedy_eval"]


def greedy_eval(
    engine: RolloutEngine, setup: TaskSetup, reward: RewardConfig, num_prompts: int, *,
    max_prompt_tokens: int, multiturn: MultiTurnRollout | None = None,
) -> dict[str, float]:  # fmt: skip
    """Greedy-decode `num_prompts` held-out prompts with `engine`; returns accuracy (the accuracy verifier
    scores >= 1), mean reward under `reward.verifiers` and the prompt count. With `multiturn`, greedy
    trajectories in its environment: accuracy is the share it judges correct (`Trajectory.correct`),
    the reward the environment's, and ``eval_turns`` the mean model turns.

    The count is what was evaluated: a prompt file's held-out set may hold fewer than asked for.
    """
    tok = setup.tokenizer
    samples = setup.source.held_out(num_prompts)
    prompts = [encode_prompt(setup, s.prompt, max_prompt_tokens) for s in samples]
    params = SamplingParams(
        temperature=0.0, max_new_tokens=setup.max_new_tokens, stop_token_ids=(tok.eos_token_id,)
    )
    if multiturn is not None:
        starts = [
            (Row(s.prompt, s.answer, i), p) for i, (s, p) in enumerate(zip(samples, prompts, strict=True))
        ]
        trajectories, _ = multiturn.run(engine, starts, params, pad_token_id=tok.pad_token_id)
        env_rewards = torch.tensor([t.reward for t in trajectories])
        return {
            "accuracy": sum(t.correct for t in trajectories) / len(trajectories),
            "eval_reward": float(env_rewards.mean()),
            "eval_turns": sum(t.turns for t in trajectories) / len(trajectories),
            "eval_prompts": float(len(samples)),
        }
    out = engine.generate(prompts, params, pad_token_id=tok.pad_token_id)
    texts = [tok.decode(r.tolist(), skip_special_tokens=True) for r in out.responses()]
    answers = [s.answer for s in samples]
    correct = rewards.score(texts, answers, {reward.accuracy_verifier: 1.0})
    scores = rewards.score(texts, answers, reward.verifiers)
    return {
        "accuracy": float(torch.tensor(correct).ge(1.0).float().mean()),
        "eval_reward": float(torch.tensor(scores).mean()),
        "eval_prompts": float(len(samples)),
    }
