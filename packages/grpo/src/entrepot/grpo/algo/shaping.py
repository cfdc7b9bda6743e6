"""DAPO's length treatment: overlong reward shaping and which responses were cut at the budget.

Shapes: B responses; lengths are response tokens (stop token included when one was sampled).
"""

from __future__ import annotations

import torch

from entrepot.grpo.algo.sequences import ResponseBatch, segment_starts

__all__ = ["overlong_penalty", "truncated", "truncated_rows"]


def overlong_penalty(
    response_lengths: torch.Tensor, budget: int, buffer: int, penalty: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment [B] (<= 0), added to the reward.

    With L = `budget` (the generation budget) and C = `buffer`: 0 for |y| <= L - C, then
    -penalty x (|y| - (L - C)) / C, reaching -penalty at |y| = L. `buffer` 0 gives zeros.
    """
    if buffer <= 0:
        return torch.zeros(response_lengths.numel(), dtype=torch.float32)
    excess = (response_lengths.to(torch.float32) - (budget - buffer)).clamp(min=0.0)  # [B]
    return -penalty * excess / buffer


def truncated(
    response_lengths: torch.Tensor, last_tokens: torch.Tensor, budget: int, stop_token_ids: tuple[int, ...]
) -> torch.Tensor:
    """[B] bool: responses that reached `budget` tokens without ending on a stop token (cut, not done).

    Args:
        response_lengths: int [B].
        last_tokens: int [B] each response's last token (any value for an empty response).
        budget: the generation budget in tokens.
        stop_token_ids: the tokens that end a response (EOS).
    """
    stopped = torch.zeros(response_lengths.numel(), dtype=torch.bool)
    for token in stop_token_ids:
        stopped |= last_tokens == token
    return (response_lengths >= budget) & ~stopped


def truncated_rows(batch: ResponseBatch, budget: int, stop_token_ids: tuple[int, ...]) -> torch.Tensor:
    """`truncated` of every row of `batch` (its responses' lengths and last tokens)."""
    ends = segment_starts(batch.lengths) + batch.lengths - 1  # [B] flat index of each row's last token
    return truncated(batch.response_lengths, batch.tokens[ends.clamp(min=0)], budget, stop_token_ids)
