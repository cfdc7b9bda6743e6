"""Greedy evaluation on held-out prompts: accuracy (the accuracy verifier scores >= 1) and reward."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from entrepot.grpo.data import rewards
from entrepot.grpo.data.sources import TaskSetup, encode_prompt
from entrepot.grpo.engines.rollout_embedded import RolloutEngine, SamplingParams

if TYPE_CHECKING:
    from entrepot.grpo.config import GRPOConfig

__all__ = ["greedy_eval"]


def greedy_eval(
    engine: RolloutEngine, setup: TaskSetup, config: GRPOConfig, num_prompts: int | None = None
) -> dict[str, float]:
    """Greedy-decode held-out prompts with `engine`; returns accuracy, mean reward and the prompt count.

    The count is what was evaluated: a prompt file's held-out set may hold fewer than asked for.
    """
    tok = setup.tokenizer
    samples = setup.source.held_out(num_prompts or config.eval.num_prompts)
    prompts = [encode_prompt(setup, s.prompt, config.data.max_prompt_tokens) for s in samples]
    params = SamplingParams(
        temperature=0.0, max_new_tokens=setup.max_new_tokens, stop_token_ids=(tok.eos_token_id,)
    )
    responses = engine.generate(prompts, params, pad_token_id=tok.pad_token_id)
    texts = [tok.decode(r, skip_special_tokens=True) for r in responses]
    answers = [s.answer for s in samples]
    correct = rewards.score(texts, answers, {config.reward.accuracy_verifier: 1.0})
    reward = rewards.score(texts, answers, config.reward.verifiers)
    return {
        "accuracy": float(torch.tensor(correct).ge(1.0).float().mean()),
        "eval_reward": float(torch.tensor(reward).mean()),
        "eval_prompts": float(len(samples)),
    }
