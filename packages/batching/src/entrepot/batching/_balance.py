"""DP balance: spread sequences (or whole prompt groups) over data-parallel ranks by token count.

Sorted greedy (LPT, the heap partitioner of verl / MindSpeed-RL: one sort, then one ``heapreplace``
on plain ints per item, ``_partition.lpt``) runs first, then exchanges between ranks (``_refine``)
lower its heaviest ranks towards the lower bound max(ceil(total / k), heaviest group), below which
no plan can go. A plan within ``tolerance`` of the bound (default
0.01%) is returned at once; otherwise Karmarkar-Karp runs too and the plan with the lighter
heaviest rank wins (a tie keeps the LPT-based one). The tolerance is there because the last few
tokens cost the most: at 1,024 sequences over 32 ranks, LPT ends 16 tokens (0.05%) over the bound
and closing that takes 33 exchanges, twice the LPT pass's time, for no measurable step time.
Cost: O(N log N); the exchanges cost at most N / 2 + 64 probes, usually a few per rank. When LPT
is within the tolerance (most batches of a few thousand sequences), nothing else runs: no
positions, no copies, just each rank's indices sorted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from entrepot.batching._errors import InvalidArgumentError
from entrepot.batching._lengths import LengthsLike, as_length_list, gc_paused, refuse_negative
from entrepot.batching._partition import _karmarkar_karp, lpt, part_sums
from entrepot.batching._refine import refine_to_target

__all__ = ["RankPlan", "balance_across_ranks", "imbalance"]

Method = Literal["greedy_lpt", "greedy_lpt_swaps", "karmarkar_karp"]


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
        method: the plan kept: ``"greedy_lpt"`` (LPT's as is), ``"greedy_lpt_swaps"`` (LPT then
            exchanges between ranks) or ``"karmarkar_karp"``.
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
    lengths: LengthsLike,
    num_ranks: int,
    group_size: int = 1,
    equal_count: bool = False,
    tolerance: float = 1e-4,
) -> RankPlan:
    """Assign N rows to ``num_ranks`` ranks so their token totals are as even as possible.

    Args:
        lengths: N token counts.
        num_ranks: data-parallel size.
        group_size: rows ``[g * group_size, (g + 1) * group_size)`` form one prompt group (the
            ``n_samples_per_prompt`` responses of a prompt) and always go to the same rank.
        equal_count: every rank gets the same number of groups (floor or ceil of groups / ranks).
        tolerance: the search stops once the heaviest rank is within ``bound * (1 + tolerance)``
            tokens, ``bound`` being the lower bound (rounded down to whole tokens); 0 searches on
            to the bound.

    Returns:
        A plan whose heaviest rank is no heavier than greedy LPT's, and either within the tolerance
        of the bound or no heavier than Karmarkar-Karp's.
    """
    _check_int("num_ranks", num_ranks, 1)
    _check_int("group_size", group_size, 1)
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0 <= tolerance < 1:
        raise InvalidArgumentError(f"tolerance must be a number in [0, 1), got {tolerance!r}")
    sizes = as_length_list(lengths, check_sign=group_size > 1)  # one row per group: LPT's sort finds it
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
        method, groups, token_counts = _balance_groups(weights, num_ranks, equal_count, tolerance)
    if group_size == 1:
        ranks = groups
    else:
        ranks = [[g * group_size + r for g in part for r in range(group_size)] for part in groups]
    return RankPlan(ranks=ranks, token_counts=token_counts, method=method)


def lower_bound(total: int, heaviest: int, num_ranks: int) -> int:
    """No plan's heaviest rank is lighter: the mean rank total rounded up, or the heaviest group."""
    return max(-(-total // num_ranks), heaviest)


def _balance_groups(
    weights: list[int], num_ranks: int, equal_count: bool, tolerance: float
) -> tuple[Method, list[list[int]], list[int]]:
    """(method, group indices per rank, tokens per rank): LPT + swaps, Karmarkar-Karp if that falls short."""
    order, parts, loads = lpt(weights, num_ranks, equal_count)
    if order and weights[order[-1]] < 0:  # the lightest: negative lengths are refused
        refuse_negative(weights)
    bound = lower_bound(sum(loads), weights[order[0]] if order else 0, num_ranks)
    target = bound + int(bound * tolerance)
    method: Method = "greedy_lpt"
    if max(loads) > target:  # LPT is not close enough: exchanges, then maybe Karmarkar-Karp
        for part in parts:  # LPT placed them heaviest first; the exchanges want them lightest first
            part.reverse()
        if refine_to_target(weights, parts, loads, target, not equal_count):
            method = "greedy_lpt_swaps"
        if max(loads) > target:  # not within the tolerance of optimal: Karmarkar-Karp may do better
            kk_groups = _karmarkar_karp(weights, num_ranks, equal_count)
            kk_loads = part_sums(kk_groups, weights)
            if max(kk_loads) < max(loads):
                return "karmarkar_karp", kk_groups, kk_loads
    for part in parts:
        part.sort()
    return method, parts, loads
