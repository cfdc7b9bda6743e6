"""Greedy evaluation on held-out prompts: accuracy (the accuracy verifier scores >= 1) and reward."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from entrepot.grpo.data import rewards
from entrepot.grpo.data.sources import TaskSetup, encode_prompt
from entrepot.grpo.engines.base import RolloutEngine, SamplingParams

if TYPE_CHECKING:
    from entrepot.grpo.config import RewardConfig

__all__ = ["greedy_eval"]


def greedy_eval(
    engine: RolloutEngine, setup: TaskSetup, reward: RewardConfig, num_prompts: int, *, max_prompt_tokens: int
) -> dict[str, float]:
    """Greedy-decode `num_prompts` held-out prompts with `engine`; returns accuracy (the accuracy verifier
    scores >= 1), mean reward under `reward.verifiers` and the prompt count.

    The count is what was evaluated: a prompt file's held-out set may hold fewer than asked for.
    """
    tok = setup.tokenizer
    samples = setup.source.held_out(num_prompts)
    prompts = [encode_prompt(setup, s.prompt, max_prompt_tokens) for s in samples]
    params = SamplingParams(
        temperature=0.0, max_new_tokens=setup.max_new_tokens, stop_token_ids=(tok.eos_token_id,)
    )
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
