"""DP balance: spread sequences (or whole prompt groups) over data-parallel ranks by token count.

Both Karmarkar-Karp and sorted greedy (LPT) run on every call and the plan with the lighter
heaviest rank wins (ties go to Karmarkar-Karp). Cost: O(N log N).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from entrepot.batching._errors import InvalidArgumentError
from entrepot.batching._lengths import LengthsLike, as_length_list, gc_paused
from entrepot.batching._partition import _greedy_lpt, _karmarkar_karp, part_sums

__all__ = ["RankPlan", "balance_across_ranks", "imbalance"]

Method = Literal["karmarkar_karp", "greedy_lpt"]


def imbalance(totals: list[int]) -> float:
    """max / mean - 1 of per-part totals (0.0 when there are no tokens)."""
    total = sum(totals)
    if total == 0:
        return 0.0
    return max(totals) * len(totals) / total - 1.0


@dataclass(frozen=True)
class RankPlan:
    """Which rows each data-parallel rank takes.

    Attributes:
        ranks: row indices per rank, ascending inside each rank.
        token_counts: tokens per rank.
        method: the partitioner whose result was kept.
    """

    ranks: list[list[int]]
    token_counts: list[int]
    method: Method

    @property
    def imbalance(self) -> float:
        """max / mean - 1 of the per-rank token totals."""
        return imbalance(self.token_counts)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")


def balance_across_ranks(
    lengths: LengthsLike, num_ranks: int, group_size: int = 1, equal_count: bool = False
) -> RankPlan:
    """Assign N rows to ``num_ranks`` ranks so their token totals are as even as possible.

    Args:
        lengths: N token counts.
        num_ranks: data-parallel size.
        group_size: rows ``[g * group_size, (g + 1) * group_size)`` form one prompt group (the
            ``n_samples_per_prompt`` responses of a prompt) and always go to the same rank.
        equal_count: every rank gets the same number of groups (floor or ceil of groups / ranks).

    Returns:
        The plan with the lower heaviest rank of Karmarkar-Karp and greedy LPT.
    """
    _check_int("num_ranks", num_ranks, 1)
    _check_int("group_size", group_size, 1)
    sizes = as_length_list(lengths)
    if len(sizes) % group_size:
        raise InvalidArgumentError(
            f"{len(sizes)} rows do not split into groups of group_size={group_size}; "
            f"the row count must be a multiple of group_size"
        )
    if group_size == 1:
        weights = sizes
    else:
        weights = [sum(sizes[start : start + group_size]) for start in range(0, len(sizes), group_size)]
    with gc_paused():
        candidates: list[tuple[Method, list[list[int]]]] = [
            ("karmarkar_karp", _karmarkar_karp(weights, num_ranks, equal_count)),
            ("greedy_lpt", _greedy_lpt(weights, num_ranks, equal_count)),
        ]
    method, groups = min(candidates, key=lambda item: max(part_sums(item[1], weights)))
    if group_size == 1:
        ranks = groups
    else:
        ranks = [[g * group_size + r for g in part for r in range(group_size)] for part in groups]
    return RankPlan(ranks=ranks, token_counts=part_sums(groups, weights), method=method)
