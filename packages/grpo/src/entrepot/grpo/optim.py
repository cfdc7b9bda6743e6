"""The optimiser and LR schedule of the policy: AdamW, linear warm-up, then constant or cosine."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

from entrepot.grpo.config import AlgorithmConfig

__all__ = ["build_optimizer", "lr_lambda"]


def build_optimizer(
    model: torch.nn.Module, algo: AlgorithmConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with the configured LR, betas and weight decay, plus the warm-up / cosine schedule.

    Args:
        model: the trainable module (parameters with requires_grad).
        algo: the `algorithm` section.
        total_steps: optimiser steps of the whole run (for the cosine schedule).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=algo.lr, betas=algo.adam_betas, weight_decay=algo.weight_decay, fused=_fusable(params)
    )
    schedule = functools.partial(
        lr_lambda, warmup_steps=algo.warmup_steps, total_steps=total_steps, schedule=algo.lr_schedule
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def _fusable(params: Sequence[torch.Tensor]) -> bool | None:
    """True where AdamW's fused kernel takes `params` (CPU / CUDA floats), else None (torch's default).

    One kernel per tensor instead of about a dozen small ops each.
    """
    fits = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return True if params and fits else None


def lr_lambda(step: int, *, warmup_steps: int, total_steps: int, schedule: str = "constant") -> float:
    """LR multiplier at optimiser step `step`: linear warm-up, then constant or cosine to 0."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
