"""Off-policy correction of the train / inference mismatch: a detached weight per token.

The rollout engine sampled token t with log-prob b_t (`behaviour_logp`: its own kernels and
precision, and in asynchronous training possibly several policy versions within one response); the
trainer recomputes the proximal log-prob o_t (`old_logp`) of the same token at the start of the
update. The PPO ratio exp(logp - o) is left as it is; the correction multiplies each token's
surrogate loss by a weight w_t built from

    log rho_t = o_t - b_t                          (token level)
    log rho_i = sum_{t in row i} (o_t - b_t)       (sequence level: the product of the token ratios)

both clamped to [-20, 20] before exp. With `algorithm.correction` (kind, level, cap, low, high):

- ``none``: w_t = 1.
- ``tis`` (truncated IS): w_t = min(rho, cap).
- ``mis`` (masked IS, rejection): w_t = 1 if low <= rho <= high else 0; at sequence level a row
  outside the bounds loses all of its tokens.
- ``icepop`` (Ring-1T's IcePop, token level only): w_t = rho_t if low <= rho_t <= high else 0.

Here rho is rho_t at token level and rho_i (the token's row) at sequence level. The weights carry
no gradient. Nothing here knows about ranks: the diagnostics are sums weighted 1 / num_tokens so
that micro-batches and DP ranks add up, except the max.

Shape legend: B = responses, R = response tokens of the B rows (flat, row after row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from entrepot.grpo.config.correction import CorrectionConfig

__all__ = ["METRIC_MAX", "METRIC_SUMS", "CorrectionOutput", "correction_metrics", "correction_weights"]

_LOG_CLAMP = 20.0
METRIC_SUMS = ("offpolicy/is_weight_mean", "offpolicy/masked_frac")
"""Diagnostics summed over micro-batches and DP ranks (each token weighs 1 / num_tokens)."""
METRIC_MAX = "offpolicy/is_weight_max"
"""The diagnostic combined by max, like ratio_max."""


@dataclass
class CorrectionOutput:
    """The per-token weights w [R] (float32, detached) and which tokens a mask dropped [R] (bool)."""

    weights: torch.Tensor
    masked: torch.Tensor


def correction_weights(
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    response_lengths: torch.Tensor,
    config: CorrectionConfig,
) -> CorrectionOutput:
    """The off-policy correction w_t of each response token (formulas in the module docstring).

    Args:
        old_logp: [R] proximal log-probs the trainer recomputed at the start of the update.
        behaviour_logp: [R] log-probs the rollout engine sampled each token with.
        response_lengths: int [B] response tokens per row (they sum to R).
        config: a resolved `algorithm.correction` (kind not None: `entrepot.grpo.config.correction.resolve`).

    Returns:
        CorrectionOutput: weights [R] float32 and masked [R] bool (always False for none and tis).

    Raises:
        ValueError: shapes disagree, or the kind is unresolved (None).
    """
    if old_logp.shape != behaviour_logp.shape or old_logp.dim() != 1:
        raise ValueError(
            f"old_logp {tuple(old_logp.shape)} and behaviour_logp {tuple(behaviour_logp.shape)} "
            "must both be [R]"
        )
    if int(response_lengths.sum()) != old_logp.numel():
        raise ValueError(
            f"response_lengths sum to {int(response_lengths.sum())}, not the {old_logp.numel()} tokens"
        )
    if config.kind is None:
        raise ValueError("algorithm.correction.kind (None) must be resolved first (correction.resolve)")
    with torch.no_grad():
        log_rho = old_logp.detach().float() - behaviour_logp.detach().float().to(old_logp.device)  # [R]
        if config.level == "sequence":
            lengths = response_lengths.to(log_rho.device)
            rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=log_rho.device), lengths)
            per_row = torch.zeros(lengths.numel(), dtype=log_rho.dtype, device=log_rho.device)
            per_row.index_add_(0, rows, log_rho)  # [B] log of the product of the row's ratios
            log_rho = per_row[rows]  # [R] the row's value on each of its tokens
        rho = log_rho.clamp(-_LOG_CLAMP, _LOG_CLAMP).exp()  # [R]
        inside = (rho >= config.low) & (rho <= config.high)  # [R]
        no_mask = torch.zeros_like(inside)
        if config.kind == "none":
            return CorrectionOutput(torch.ones_like(rho), no_mask)
        if config.kind == "tis":
            return CorrectionOutput(rho.clamp(max=config.cap), no_mask)
        if config.kind == "mis":
            return CorrectionOutput(inside.to(rho.dtype), ~inside)
        if config.kind == "icepop":  # token level: the config refuses icepop with level sequence
            return CorrectionOutput(torch.where(inside, rho, torch.zeros_like(rho)), ~inside)
    raise ValueError(f"algorithm.correction.kind ({config.kind!r}) must be one of none, tis, mis, icepop")


def correction_metrics(
    out: CorrectionOutput, num_tokens: float, counted: torch.Tensor | None = None
) -> dict[str, float]:
    """Diagnostics of `out` over the tokens `counted` ([R] bool; None: all).

    ``offpolicy/is_weight_mean`` = sum w_t / num_tokens and ``offpolicy/masked_frac`` = (masked
    tokens) / num_tokens, sums that add up over micro-batches and DP ranks when `num_tokens` is the
    global mini-batch's; ``offpolicy/is_weight_max`` = max w_t here (0 without tokens), to combine
    with max.
    """
    share = 1.0 / max(num_tokens, 1.0)
    weights, masked = out.weights, out.masked
    if counted is not None:
        counted = counted.to(weights.device)
        weights, masked = weights[counted], masked[counted]
    return {
        "offpolicy/is_weight_mean": float(weights.sum()) * share,
        "offpolicy/masked_frac": float(masked.sum()) * share,
        METRIC_MAX: float(weights.max()) if weights.numel() else 0.0,
    }
