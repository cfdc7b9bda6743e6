"""GRPO maths on tensors: KL estimators, the policy loss and its aggregation.

Nothing here knows about ranks, workers or the dock. Per-token values are flat [R] (the response
tokens of B rows, row after row: `entrepot.grpo.algo.sequences`). Aggregation is a weight per token
whose normalizer the caller counts over the global mini-batch, so data parallelism and
micro-batching change nothing in the maths. Losses return the scalar loss plus detached diagnostics.

Shape legend: B = responses (prompts x group size), R = response tokens of the batch, G = group size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from entrepot.grpo.algo.advantages import group_advantages  # re-exported: it lived here first
from entrepot.grpo.algo.surrogates import SURROGATES, LossKind

__all__ = [
    "LossOutput",
    "group_advantages",
    "keep_varied_groups",
    "kl_penalty",
    "loss_normalizer",
    "policy_loss",
    "row_sums",
    "sequence_kl",
    "token_weights",
]

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
KLKind = Literal["k1", "abs", "mse", "low_var_kl", "k3", "clamped"]


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

    Shape: logp, ref_logp [R] (or any equal shapes) -> the same shape.
    """
    diff = logp - ref_logp  # [R]
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


def sequence_kl(
    logp: torch.Tensor, ref_logp: torch.Tensor, response_lengths: torch.Tensor, kind: KLKind
) -> torch.Tensor:
    """Summed per-token KL of each response (for `kl_in_reward`): [R], [R], lengths [B] -> [B]."""
    return row_sums(kl_penalty(logp, ref_logp, kind), response_lengths)


def row_sums(per_token: torch.Tensor, response_lengths: torch.Tensor) -> torch.Tensor:
    """Each response's sum of its per-token values: [R], lengths [B] -> [B], on `per_token`'s device."""
    device = per_token.device
    rows = torch.repeat_interleave(torch.arange(response_lengths.numel(), device=device),
                                   response_lengths.to(device))  # fmt: skip
    return torch.zeros(response_lengths.numel(), dtype=per_token.dtype, device=device).index_add_(
        0, rows, per_token
    )


def loss_normalizer(response_lengths: torch.Tensor, mode: LossAgg, horizon: int = 1) -> float:
    """What `mode` divides by, counted over these rows: response tokens (token-mean), responses, or
    responses x `horizon` (seq-mean-token-sum-norm: Dr. GRPO's constant, the generation budget).

    Under data parallelism each rank counts its rows and the counts are summed over ranks, so the
    loss is the mean over the global mini-batch, not a mean of per-rank means.
    """
    if mode == "token-mean":
        return float(response_lengths.sum())
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        return float(response_lengths.numel())
    if mode == "seq-mean-token-sum-norm":
        return float(response_lengths.numel() * horizon)
    raise ValueError(
        f"loss_agg ({mode!r}) must be token-mean, seq-mean-token-mean, seq-mean-token-sum or "
        "seq-mean-token-sum-norm"
    )


def token_weights(response_lengths: torch.Tensor, mode: LossAgg, normalizer: float) -> torch.Tensor:
    """Weight of each response token in the aggregated loss, so that loss = sum(weights * per_token).

    ``token-mean``: 1 / (valid tokens of the mini-batch); long answers weigh more.
    ``seq-mean-token-mean``: 1 / (r_i * responses): each response's token mean, averaged.
    ``seq-mean-token-sum``: 1 / responses: each response's token sum, averaged.
    ``seq-mean-token-sum-norm``: 1 / (responses x horizon): token sums over a constant (Dr. GRPO), so
    neither the response's nor the batch's length changes a token's weight.

    Args:
        response_lengths: int [B] response tokens per row (r_i).
        mode: the aggregation.
        normalizer: `loss_normalizer` of the whole (global) mini-batch (>= 1; the horizon already in).

    Returns:
        [R] float32 weights, row after row.
    """
    lengths = response_lengths.to(torch.float32)
    if mode == "seq-mean-token-mean":
        per_row = 1.0 / (lengths.clamp(min=1) * max(normalizer, 1.0))  # [B]
    else:
        loss_normalizer(response_lengths, mode)  # validates the mode
        per_row = torch.full_like(lengths, 1.0 / max(normalizer, 1.0))  # [B]
    return torch.repeat_interleave(per_row, response_lengths)


@dataclass
class LossOutput:
    """The loss to backpropagate and detached diagnostics (python floats).

    Every diagnostic is a weighted sum over the given tokens (weights of the loss, or 1 / num_tokens
    for clip_frac and ratio_mean), so the diagnostics of micro-batches and DP ranks add up.
    """

    loss: torch.Tensor
    metrics: dict[str, float]


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    response_lengths: torch.Tensor | None = None,
    loss: LossKind = "ppo_clip",
    num_tokens: float | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "low_var_kl",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    correction: torch.Tensor | None = None,
) -> LossOutput:
    """A policy-gradient surrogate (`surrogates`), optional KL to the reference and entropy bonus.

    loss = sum_t w_t [c_t l_t + kl_coef KL_t - entropy_coef H_t], with l_t the surrogate `loss` picks
    (``ppo_clip``: -min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t)) and c_t the detached
    off-policy correction (`correction`; 1 without it), which reweights the surrogate only.

    The weights w carry the aggregation (`token_weights`), so the caller picks token-mean or a
    sequence mean, over a micro-batch, a mini-batch or all DP ranks, by the normalizer alone.

    Args:
        logp: [R] current log-probs of the sampled response tokens (requires grad).
        old_logp: [R] log-probs at sampling time.
        advantages: [R] advantage of each token (a response's advantage repeated over its tokens).
        weights: [R] aggregation weights (`token_weights`).
        response_lengths: [B] tokens of each response (default: one response of R tokens); GSPO's
            sequence ratio averages over them.
        loss: the surrogate (`surrogates.SURROGATES`).
        num_tokens: valid tokens the diagnostics clip_frac and ratio_mean are averaged over
            (default R, this call's tokens; the global mini-batch's under data parallelism).
        ref_logp: [R] reference log-probs; needed when kl_coef > 0.
        entropy: [R] policy entropy; needed when entropy_coef > 0.
        correction: [R] off-policy correction c_t of the surrogate (`algo.correction`), detached
            here; None = 1. It does not touch the KL and entropy terms nor the ratio diagnostics.

    Returns:
        LossOutput with metrics pg_loss, clip_frac, ratio_mean, ratio_max, kl and entropy (when given).
    """
    if loss not in SURROGATES:
        raise ValueError(f"loss ({loss!r}) must be one of {', '.join(SURROGATES)}")
    weights = weights.to(logp.dtype)
    share = 1.0 / max(num_tokens if num_tokens is not None else logp.numel(), 1.0)
    if response_lengths is None:
        response_lengths = torch.tensor([logp.numel()])
    surrogate = SURROGATES[loss](logp, old_logp, advantages, response_lengths, clip_low, clip_high)
    pg_weights = weights if correction is None else weights * correction.detach().to(weights)  # [R]
    pg_loss = (surrogate.per_token * pg_weights).sum()
    total = pg_loss
    metrics: dict[str, float] = {"pg_loss": float(pg_loss.detach())}
    with torch.no_grad():
        metrics["clip_frac"] = float(surrogate.clipped.to(logp.dtype).sum() * share)
        metrics["ratio_mean"] = float(surrogate.ratio.sum() * share)
        metrics["ratio_max"] = float(surrogate.ratio.max()) if surrogate.ratio.numel() else 1.0
    if ref_logp is not None:
        kl_loss = (kl_penalty(logp, ref_logp, kl_kind) * weights).sum()
        if kl_coef > 0:
            total = total + kl_coef * kl_loss
        metrics["kl"] = float(kl_loss.detach())
    elif kl_coef > 0:
        raise ValueError("policy_loss: kl_coef > 0 needs ref_logp")
    if entropy is not None:
        entropy_sum = (entropy * weights).sum()
        if entropy_coef > 0:
            total = total - entropy_coef * entropy_sum
        metrics["entropy"] = float(entropy_sum.detach())
    elif entropy_coef > 0:
        raise ValueError("policy_loss: entropy_coef > 0 needs entropy")
    return LossOutput(loss=total, metrics=metrics)
