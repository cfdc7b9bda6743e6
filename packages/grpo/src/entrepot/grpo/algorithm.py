"""GRPO maths on tensors: group advantages, KL estimators, the PPO-clip loss, aggregation, schedule.

Nothing here knows about ranks, workers or the dock. Losses return the scalar loss plus a dict of
detached diagnostics.

Shape legend: B = responses (prompts x group size), T = response tokens (padded), G = group size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "LossOutput",
    "aggregate_loss",
    "group_advantages",
    "keep_varied_groups",
    "kl_penalty",
    "lr_lambda",
    "policy_loss",
]

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
KLKind = Literal["k1", "abs", "mse", "low_var_kl", "k3", "clamped"]
_EPS = 1e-6


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
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards shape {tuple(rewards.shape)} must be [B] with B a multiple of {group_size}"
        )
    grouped = rewards.float().view(-1, group_size)  # [B/G, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # [B/G, G]
    if normalize_std:
        centred = centred / (grouped.std(dim=1, keepdim=True) + _EPS)
    return centred.view(-1)


def keep_varied_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dynamic sampling: a [B] bool mask keeping only groups whose rewards are not all equal."""
    grouped = rewards.view(-1, group_size)  # [B/G, G]
    varied = (grouped.max(dim=1).values - grouped.min(dim=1).values) > 0  # [B/G]
    return varied.repeat_interleave(group_size)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate from sampled-token log-probs.

    kinds: ``k1`` = logp - ref; ``abs`` = |logp - ref|; ``mse`` = 0.5 (logp - ref)^2;
    ``low_var_kl`` / ``k3`` = exp(ref - logp) - (ref - logp) - 1 (Schulman's unbiased, >= 0 estimator),
    clamped to [-10, 10] as upstream does; ``clamped`` = k1 clamped to [-10, 10].

    Shape: logp, ref_logp [B, T] -> [B, T].
    """
    diff = logp - ref_logp  # [B, T]
    if kind == "k1":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "mse":
        return 0.5 * diff.square()
    if kind in ("low_var_kl", "k3"):
        log_ratio = (-diff).clamp(-20.0, 20.0)  # ref - logp
        return (log_ratio.exp() - log_ratio - 1).clamp(-10.0, 10.0)
    if kind == "clamped":
        return diff.clamp(-10.0, 10.0)
    raise ValueError(f"kl kind ({kind!r}) must be one of k1, abs, mse, low_var_kl, k3, clamped")


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, mode: LossAgg) -> torch.Tensor:
    """Reduce a [B, T] per-token loss over valid tokens (mask [B, T]) to a scalar.

    ``token-mean`` averages over all valid tokens of the batch (long answers weigh more);
    ``seq-mean-token-mean`` averages each response, then responses; ``seq-mean-token-sum`` sums each
    response, then averages responses.
    """
    mask = mask.to(per_token.dtype)
    if mode == "token-mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    per_seq = (per_token * mask).sum(-1)  # [B]
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"loss_agg ({mode!r}) must be token-mean, seq-mean-token-mean or seq-mean-token-sum")
    return per_seq.mean()


@dataclass
class LossOutput:
    """The loss to backpropagate and detached diagnostics (python floats)."""

    loss: torch.Tensor
    metrics: dict[str, float]


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "low_var_kl",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    loss_agg: LossAgg = "token-mean",
) -> LossOutput:
    """PPO-clip surrogate with separate low/high clip, optional KL to the reference and entropy bonus.

    loss = agg(-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)) + kl_coef agg(KL) - entropy_coef agg(H)

    Args:
        logp: [B, T] current log-probs of the sampled tokens (requires grad).
        old_logp: [B, T] log-probs at sampling time.
        advantages: [B] or [B, T] advantages.
        mask: [B, T] 1 on response tokens.
        ref_logp: [B, T] reference log-probs; needed when kl_coef > 0.
        entropy: [B, T] policy entropy; needed when entropy_coef > 0.

    Returns:
        LossOutput with metrics pg_loss, kl, clip_frac, ratio_mean, ratio_max, entropy (when given).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]  # [B, 1]
    mask_f = mask.to(logp.dtype)
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # [B, T]
    ratio = log_ratio.exp()  # [B, T]
    unclipped = ratio * advantages  # [B, T]
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages  # [B, T]
    pg_per_token = -torch.minimum(unclipped, clipped)  # [B, T]
    pg_loss = aggregate_loss(pg_per_token, mask_f, loss_agg)
    loss = pg_loss
    n_tokens = mask_f.sum().clamp(min=1)
    metrics: dict[str, float] = {"pg_loss": float(pg_loss.detach())}
    with torch.no_grad():
        metrics["clip_frac"] = float(((clipped < unclipped).to(logp.dtype) * mask_f).sum() / n_tokens)
        metrics["ratio_mean"] = float((ratio * mask_f).sum() / n_tokens)
        metrics["ratio_max"] = float(ratio.masked_fill(mask_f == 0, 0.0).max()) if mask_f.any() else 1.0
    if ref_logp is not None:
        kl = kl_penalty(logp, ref_logp, kl_kind)  # [B, T]
        kl_loss = aggregate_loss(kl, mask_f, loss_agg)
        if kl_coef > 0:
            loss = loss + kl_coef * kl_loss
        metrics["kl"] = float(kl_loss.detach())
    elif kl_coef > 0:
        raise ValueError("policy_loss: kl_coef > 0 needs ref_logp")
    if entropy is not None:
        entropy_mean = aggregate_loss(entropy, mask_f, loss_agg)
        if entropy_coef > 0:
            loss = loss - entropy_coef * entropy_mean
        metrics["entropy"] = float(entropy_mean.detach())
    elif entropy_coef > 0:
        raise ValueError("policy_loss: entropy_coef > 0 needs entropy")
    return LossOutput(loss=loss, metrics=metrics)


def lr_lambda(step: int, *, warmup_steps: int, total_steps: int, schedule: str = "constant") -> float:
    """LR multiplier at optimiser step `step`: linear warm-up, then constant or cosine to 0."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
