"""The policy-gradient surrogates `algorithm.loss` chooses: PPO-clip, GSPO and CISPO.

Each maps per-token log-probs to a per-token loss l_t; `losses.policy_loss` weighs l_t with the
aggregation's token weights and adds the KL and entropy terms, the same for every surrogate. With
r_t = exp(logp_t - old_t), A_t the (row's) advantage, eps_lo / eps_hi = `algorithm.clip_low` /
`clip_high` and sg() a stop-gradient:

- ``ppo_clip``: l_t = -min(r_t A_t, clip(r_t, 1 - eps_lo, 1 + eps_hi) A_t)  (PPO; DAPO clip-higher).
- ``gspo``: s_i = exp(mean_{t in i} (logp_t - old_t)), the length-normalised sequence ratio of
  row i, and l_t = -min(s_i A_i, clip(s_i, 1 - eps_lo, 1 + eps_hi) A_i) on each of its tokens
  (GSPO, Zheng et al. 2025; with `seq-mean-token-mean` aggregation this is the paper's sequence
  mean; its clip ranges are small, e.g. 3e-4 / 4e-4).
- ``cispo``: l_t = -sg(clip(r_t, 1 - eps_lo, 1 + eps_hi)) A_t logp_t: REINFORCE with clipped,
  stop-gradient IS weights, so no token's gradient is dropped (CISPO, MiniMax-M1 2025).

Shapes: every per-token tensor is [R] (the response tokens of B rows, row after row); response
lengths are [B].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["SURROGATES", "LossKind", "Surrogate", "SurrogateOutput", "cispo", "gspo", "ppo_clip"]

LossKind = Literal["ppo_clip", "gspo", "cispo"]


@dataclass
class SurrogateOutput:
    """Per-token loss [R] (differentiable), the ratio it used [R] and where it clipped [R] (detached)."""

    per_token: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor


Surrogate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, float], SurrogateOutput]
"""(logp, old_logp, advantages, response_lengths, clip_low, clip_high) -> SurrogateOutput."""


def _log_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    return (logp - old_logp).clamp(-20.0, 20.0)  # [R]


def _clipped(ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float) -> SurrogateOutput:
    """PPO's pessimistic clip of `ratio` [R] (a token's, or its sequence's): -min(r A, clip(r) A)."""
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - low, 1.0 + high) * advantages
    return SurrogateOutput(-torch.minimum(unclipped, clipped), ratio.detach(), (clipped < unclipped).detach())


def ppo_clip(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, response_lengths: torch.Tensor,
    clip_low: float, clip_high: float,
) -> SurrogateOutput:  # fmt: skip
    """PPO's clipped surrogate on the token ratio, with separate low and high clip."""
    return _clipped(_log_ratio(logp, old_logp).exp(), advantages, clip_low, clip_high)


def gspo(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, response_lengths: torch.Tensor,
    clip_low: float, clip_high: float,
) -> SurrogateOutput:  # fmt: skip
    """GSPO: PPO's clip on the sequence ratio exp(mean log-ratio of the row), the same on its tokens."""
    rows = torch.repeat_interleave(
        torch.arange(response_lengths.numel(), device=logp.device), response_lengths.to(logp.device)
    )  # [R] row of each token
    lengths = response_lengths.to(device=logp.device, dtype=logp.dtype).clamp(min=1)  # [B]
    summed = torch.zeros(response_lengths.numel(), dtype=logp.dtype, device=logp.device)
    sequence_log_ratio = summed.index_add(0, rows, _log_ratio(logp, old_logp)) / lengths  # [B]
    return _clipped(sequence_log_ratio.exp()[rows], advantages, clip_low, clip_high)  # s_i on row i's tokens


def cispo(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, response_lengths: torch.Tensor,
    clip_low: float, clip_high: float,
) -> SurrogateOutput:  # fmt: skip
    """CISPO: REINFORCE on every token, weighted by the clipped IS ratio under a stop-gradient."""
    ratio = _log_ratio(logp, old_logp).detach().exp()  # [R]
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # [R], no gradient
    return SurrogateOutput(-weight * advantages * logp, ratio, weight != ratio)


SURROGATES: dict[str, Surrogate] = {"ppo_clip": ppo_clip, "gspo": gspo, "cispo": cispo}
"""`algorithm.loss` -> its surrogate."""
