"""On-policy distillation: a dense per-token advantage from a teacher's log-probs of the rollout's tokens.

The student sampled response y; at each of its tokens the teacher says how likely it finds y_t. With
both log-probs at the rollout's temperature, log p_teacher(y_t) - log p_student(y_t) is minus the
single-sample estimate of the reverse KL KL(student || teacher) at that position: the policy-gradient
surrogate with it as the advantage lowers the reverse KL (Agarwal et al. 2024, "On-policy
distillation"; Thinking Machines 2025). Mixed with the reward's per-response advantage A_seq:

    A_t = reward_weight * A_seq + coef * (log p_teacher(y_t) - log p_student(y_t))

detached (both log-probs are computed without gradient), on model tokens only: with multi-turn the
environment's tokens get 0 (the loss skips them anyway). Simplified: no discount and no
return-to-go over later tokens (the per-token term is the immediate one, as in the cited recipe).

Shape legend: B responses, R = sum of response lengths (flat, row after row, as the dock stores them).
"""

from __future__ import annotations

import torch

__all__ = ["distill_metrics", "token_advantages"]


def token_advantages(
    sequence_advantages: torch.Tensor,
    teacher_logp: torch.Tensor,
    student_logp: torch.Tensor,
    response_lengths: torch.Tensor,
    *,
    coef: float,
    reward_weight: float,
    model_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token advantages A_t = reward_weight * A_seq + coef * (teacher_t - student_t) (module docstring).

    Args:
        sequence_advantages: [B] one advantage per response (`algorithm.advantage`).
        teacher_logp: [R] the teacher's log-prob of each sampled token.
        student_logp: [R] the student's (the sampling policy's) log-prob of the same token.
        response_lengths: int [B] tokens per response (sums to R).
        coef: weight of the reverse-KL term.
        reward_weight: weight of the per-response advantage.
        model_mask: [R] bool, the tokens the model sampled (None: all); the others get 0.

    Returns:
        [R] float32 advantages, detached.
    """
    if teacher_logp.shape != student_logp.shape or teacher_logp.dim() != 1:
        raise ValueError(
            f"teacher_logp {tuple(teacher_logp.shape)} and student_logp {tuple(student_logp.shape)} "
            "must both be [R]"
        )
    lengths = response_lengths.to(torch.int64)
    if int(lengths.sum()) != teacher_logp.numel() or lengths.numel() != sequence_advantages.numel():
        raise ValueError(
            f"response_lengths (sum {int(lengths.sum())}, {lengths.numel()} rows) must match the "
            f"{teacher_logp.numel()} tokens and {sequence_advantages.numel()} advantages"
        )
    per_response = torch.repeat_interleave(sequence_advantages.float(), lengths)  # [R]
    gap = teacher_logp.float() - student_logp.float()  # [R]
    advantages = (reward_weight * per_response + coef * gap).detach()  # [R]
    if model_mask is not None:
        advantages = torch.where(model_mask.bool(), advantages, torch.zeros_like(advantages))
    return advantages


def distill_metrics(
    teacher_logp: torch.Tensor, student_logp: torch.Tensor, model_mask: torch.Tensor | None = None
) -> dict[str, float]:
    """distill/reverse_kl: mean over model tokens of student - teacher log-prob (the sampled estimate
    of KL(student || teacher)); distill/teacher_logp_mean: the teacher's mean log-prob there."""
    keep = torch.ones_like(teacher_logp, dtype=torch.bool) if model_mask is None else model_mask.bool()
    if not bool(keep.any()):
        return {"distill/reverse_kl": 0.0, "distill/teacher_logp_mean": 0.0}
    teacher, student = teacher_logp[keep].double(), student_logp[keep].double()  # [T]
    return {
        "distill/reverse_kl": float((student - teacher).mean()),
        "distill/teacher_logp_mean": float(teacher.mean()),
    }
