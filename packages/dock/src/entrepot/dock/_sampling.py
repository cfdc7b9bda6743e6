"""DP-aware sampling helpers: token-balanced batch order and per-rank index ranges."""

from __future__ import annotations

import torch

from entrepot.dock._errors import InvalidArgumentError


def balanced_order(tokens: torch.Tensor, num_ranks: int, group_size: int = 1) -> torch.Tensor:
    """A permutation of B rows so that `num_ranks` equal consecutive chunks carry near-equal tokens.

    Groups of `group_size` adjacent rows stay together (whole prompt groups on one rank).

    Args:
        tokens: int64 [B] tokens per row; B divisible by num_ranks * group_size.
        num_ranks: number of DP ranks.
        group_size: rows per indivisible group.

    Returns:
        int64 [B] permutation: rank r's rows are order[r * B / num_ranks : (r + 1) * B / num_ranks].
    """
    from entrepot.batching import balance_across_ranks

    if num_ranks == 1:
        return torch.arange(tokens.numel())
    plan = balance_across_ranks(tokens, num_ranks, group_size=group_size, equal_count=True)
    return torch.tensor([row for rank in plan.ranks for row in rank], dtype=torch.int64)


def dp_range_indexes(
    num_rows: int, count: int, dp_size: int, dp_rank: int, start: int = 0
) -> list[list[int]]:
    """The row chunks a DP rank reads in guarantee-order mode (`get(indexes=chunk)` for each chunk).

    Rows [start, start + num_rows) are split into `dp_size` contiguous blocks, one per rank; each
    block is cut into chunks of `count` rows.

    Args:
        num_rows: rows of the global batch (e.g. global_batch_size * n_samples_per_prompt).
        count: rows per get.
        dp_size: number of DP ranks.
        dp_rank: this rank, in [0, dp_size).
        start: first row of the global batch.

    Returns:
        dp_rank's chunks, in order.
    """
    if dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise InvalidArgumentError(f"dp_rank must be in [0, dp_size={dp_size}), got {dp_rank}")
    if count < 1 or num_rows % (dp_size * count):
        raise InvalidArgumentError(
            f"num_rows ({num_rows}) must be a multiple of dp_size ({dp_size}) x count ({count})"
        )
    block = num_rows // dp_size
    first = start + dp_rank * block
    return [list(range(lo, lo + count)) for lo in range(first, first + block, count)]
