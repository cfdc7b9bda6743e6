"""Small pieces of the training step shared by the plain loop and the actor worker."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from entrepot.grpo.algorithm import keep_varied_groups, lr_lambda
from entrepot.grpo.data import TaskSetup, encode_prompt
from entrepot.grpo.tasks import Sample

if TYPE_CHECKING:
    from entrepot.grpo.config import GRPOConfig

__all__ = ["build_optimizer", "encode_group_prompts", "keep_rows"]


def build_optimizer(
    model: torch.nn.Module, config: GRPOConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with the configured LR, betas and weight decay, plus the warm-up / cosine schedule."""
    algo = config.algorithm
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=algo.lr,
        betas=algo.adam_betas,
        weight_decay=algo.weight_decay,
    )
    mini = algo.mini_batch_size or config.rollout.batch_size
    total = config.max_steps * algo.epochs * (config.rollout.batch_size // mini)
    schedule = functools.partial(
        lr_lambda, warmup_steps=algo.warmup_steps, total_steps=total, schedule=algo.lr_schedule
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def encode_group_prompts(
    setup: TaskSetup, samples: Sequence[Sample], n_samples: int, max_tokens: int
) -> tuple[list[list[int]], list[str]]:
    """Prompt token ids and answers, each repeated `n_samples` times (one GRPO group per prompt)."""
    prompt_ids: list[list[int]] = []
    answers: list[str] = []
    for sample in samples:
        ids = encode_prompt(setup, sample.prompt, max_tokens)
        prompt_ids.extend([ids] * n_samples)
        answers.extend([sample.answer] * n_samples)
    return prompt_ids, answers


def keep_rows(scores: torch.Tensor, group_size: int, dynamic_sampling: bool) -> list[int]:
    """Rows to train on: all, or (dynamic sampling) those of groups whose scores vary."""
    if not dynamic_sampling:
        return list(range(scores.numel()))
    return torch.nonzero(keep_varied_groups(scores, group_size)).flatten().tolist()
