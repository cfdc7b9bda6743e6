"""Loss scaling for gradient accumulation over micro-batches.

Each micro-batch computes its loss as a local mean; scaling it by the factor below makes the sum of
the scaled micro-batch gradients equal the gradient of the whole batch's loss:

- ``"sample_mean"``: batch loss = mean over samples of each sample's loss; a micro-batch of m of
  the N samples is scaled by m / N.
- ``"token_mean"``: batch loss = sum of token losses / all loss tokens; a micro-batch holding t of
  the batch's loss tokens is scaled by t / total.

Pass ``denominator`` when the mean runs over more than this rank's rows (e.g. all DP ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from entrepot.batching._errors import InvalidArgumentError, LengthMismatchError
from entrepot.batching._lengths import LengthsLike, as_length_list

__all__ = ["loss_scale_factors"]

LossMode = Literal["sample_mean", "token_mean"]


def loss_scale_factors(
    micro_batches: Sequence[Sequence[int]],
    mode: LossMode = "token_mean",
    num_loss_tokens: LengthsLike | None = None,
    denominator: int | None = None,
) -> list[float]:
    """Factor to multiply each micro-batch's local-mean loss by before ``backward``.

    Args:
        micro_batches: row indices per micro-batch (``MicroBatchPlan.micro_batches``).
        mode: ``"sample_mean"`` or ``"token_mean"`` (see the module docstring).
        num_loss_tokens: loss tokens per row (e.g. response-mask sums); needed for token_mean.
        denominator: total samples (sample_mean) or loss tokens (token_mean) the batch loss is
            averaged over; defaults to this batch's own total.

    Returns:
        One float per micro-batch; empty micro-batches get 0.0.
    """
    if mode == "sample_mean":
        counts = [len(part) for part in micro_batches]
    elif mode == "token_mean":
        if num_loss_tokens is None:
            raise InvalidArgumentError("mode='token_mean' needs num_loss_tokens (loss tokens per row)")
        tokens = as_length_list(num_loss_tokens, "num_loss_tokens")
        for part in micro_batches:
            for index in part:
                if not 0 <= index < len(tokens):
                    raise LengthMismatchError(
                        f"row {index} is out of range for {len(tokens)} num_loss_tokens"
                    )
        counts = [sum(tokens[index] for index in part) for part in micro_batches]
    else:
        raise InvalidArgumentError(f"mode must be 'sample_mean' or 'token_mean', got {mode!r}")
    total = sum(counts) if denominator is None else denominator
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise InvalidArgumentError(f"denominator must be an int >= 0, got {denominator!r}")
    if total == 0:
        return [0.0 for _ in counts]
    return [count / total for count in counts]
