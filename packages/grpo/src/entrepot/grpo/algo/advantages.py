"""Advantage estimators: one scalar per response from its reward, chosen by `algorithm.advantage`.

Every estimator in `ESTIMATORS` is a pure tensor function (rewards [B], group_size G, token_counts
[B]) -> advantages [B]; `choose_estimator` picks one once, from the config. Rewards arrive group
after group (consecutive runs of G responses share a prompt). `token_counts` are the tokens of each
response the loss trains (response length; with multi-turn, its model tokens): the batch whitening of
REINFORCE++ weighs each response by them, as if its value were repeated on each of those tokens.

Simplified: the reward is the outcome at the last token and gamma = 1, so every token of a response
has the same return, its reward; with `kl_in_reward` the step subtracts the response's summed KL
from it (rather than a per-token KL return-to-go), so one scalar per response stays the dock's
`advantages` column. GAE is not here: it needs a value model (a PPO critic), not built yet.

Shape legend: B = responses (prompts x group size), G = group size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

__all__ = [
    "ESTIMATORS",
    "AdvantageKind",
    "Estimator",
    "choose_estimator",
    "dr_grpo",
    "group_advantages",
    "grpo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
    "whiten",
]

AdvantageKind = Literal["grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
Estimator = Callable[[torch.Tensor, int, torch.Tensor], torch.Tensor]
"""(rewards [B], group_size, token_counts [B]) -> advantages [B]."""
_EPS = 1e-6


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B] -> [B/G, G] float, refusing a batch that is not whole groups."""
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards shape {tuple(rewards.shape)} must be [B] with B a multiple of {group_size}"
        )
    return rewards.float().view(-1, group_size)


def group_advantages(rewards: torch.Tensor, group_size: int, *, normalize_std: bool = True) -> torch.Tensor:
    """Group-normalised advantages: (r - mean of the prompt's group) / (std of the group + eps).

    Args:
        rewards: [B] scalar reward per response; consecutive runs of `group_size` share a prompt.
        group_size: responses per prompt (G); B must be a multiple of it.
        normalize_std: divide by the group std (unbiased, as in the GRPO paper); False only centres
            (Dr. GRPO), which avoids up-weighting near-uniform groups.

    Returns:
        [B] advantages; a group whose rewards all agree gets zeros.
    """
    grouped = _grouped(rewards, group_size)  # [B/G, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # [B/G, G]
    if normalize_std:
        centred = centred / (grouped.std(dim=1, keepdim=True) + _EPS)
    return centred.view(-1)


def grpo(rewards: torch.Tensor, group_size: int, token_counts: torch.Tensor) -> torch.Tensor:
    """GRPO: A_i = (r_i - mean_g r) / (std_g r + eps), std unbiased over the group (token counts unused)."""
    return group_advantages(rewards, group_size)


def dr_grpo(rewards: torch.Tensor, group_size: int, token_counts: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO (grpo with `normalize_std: false`): A_i = r_i - mean_g r (token counts unused)."""
    return group_advantages(rewards, group_size, normalize_std=False)


def rloo(rewards: torch.Tensor, group_size: int, token_counts: torch.Tensor) -> torch.Tensor:
    """RLOO: A_i = r_i - mean_{j != i in the group} r_j = G / (G - 1) (r_i - mean_g r).

    The leave-one-out baseline does not depend on r_i, so the estimate is unbiased; G >= 2 (the
    config refuses a group of one). Token counts unused.
    """
    if group_size < 2:
        raise ValueError(f"rloo needs a group of at least 2 responses, got group_size={group_size}")
    grouped = _grouped(rewards, group_size)  # [B/G, G]
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # [B/G, G]
    return (grouped - others).view(-1)


def whiten(values: torch.Tensor, token_counts: torch.Tensor) -> torch.Tensor:
    """Batch whitening over tokens: (v_i - mu) / (sigma + eps), with mu and sigma the mean and
    (population) std of the values repeated on each response's tokens:
    mu = sum_i n_i v_i / N, sigma^2 = sum_i n_i (v_i - mu)^2 / N, N = sum_i n_i.

    Shape: values [B], token_counts [B] (n_i >= 0) -> [B]; zeros when no response has a token.
    """
    if values.shape != token_counts.shape or values.dim() != 1:
        raise ValueError(
            f"values {tuple(values.shape)} and token_counts {tuple(token_counts.shape)} must both be [B]"
        )
    weights = token_counts.to(device=values.device, dtype=torch.float64)  # [B]
    total = weights.sum()
    if total <= 0:  # nothing trains: no statistics to take
        return torch.zeros_like(values, dtype=torch.float32)
    v = values.to(torch.float64)  # [B]
    mean = (weights * v).sum() / total
    std = ((weights * (v - mean).square()).sum() / total).sqrt()
    return ((v - mean) / (std + _EPS)).float()


def reinforce_pp(rewards: torch.Tensor, group_size: int, token_counts: torch.Tensor) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): the outcome return R_i = r_i (gamma = 1), whitened over the batch's
    tokens: A_i = (R_i - mu) / (sigma + eps) (`whiten`; no group baseline, group size unused)."""
    return whiten(rewards.float(), token_counts)


def reinforce_pp_baseline(rewards: torch.Tensor, group_size: int, token_counts: torch.Tensor) -> torch.Tensor:
    """REINFORCE++ with baseline: subtract the prompt's group mean, then whiten over the batch's
    tokens: A_i = whiten(r_i - mean_g r)."""
    return whiten(group_advantages(rewards, group_size, normalize_std=False), token_counts)


ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
}
"""Estimator name -> function; `algorithm.advantage` names one (grpo with normalize_std false: dr_grpo)."""


def choose_estimator(advantage: str, *, normalize_std: bool = True) -> Estimator:
    """The estimator `algorithm.advantage` names; `normalize_std: false` turns grpo into Dr. GRPO."""
    name = "dr_grpo" if advantage == "grpo" and not normalize_std else advantage
    if name not in ESTIMATORS:
        raise ValueError(f"advantage estimator {advantage!r} is unknown; known: {', '.join(ESTIMATORS)}")
    return ESTIMATORS[name]
