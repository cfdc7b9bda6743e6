"""DP balance: every row once, groups intact, equal counts, and the better of KK / LPT."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrepot.batching import (
    InvalidArgumentError,
    InvalidLengthError,
    balance_across_ranks,
    greedy_lpt,
    imbalance,
    karmarkar_karp,
)


def _sums(parts: list[list[int]], weights: list[int]) -> list[int]:
    return [sum(weights[i] for i in part) for part in parts]


@settings(max_examples=150, deadline=None)
@given(
    groups=st.lists(st.lists(st.integers(0, 500), min_size=3, max_size=3), max_size=60),
    group_size=st.sampled_from([1, 3]),
    num_ranks=st.integers(1, 9),
    equal_count=st.booleans(),
)
def test_rank_plan_properties(
    groups: list[list[int]], group_size: int, num_ranks: int, equal_count: bool
) -> None:
    lengths = [x for g in groups for x in g]
    plan = balance_across_ranks(lengths, num_ranks, group_size=group_size, equal_count=equal_count)
    assert len(plan.ranks) == num_ranks
    assert sorted(i for rank in plan.ranks for i in rank) == list(range(len(lengths)))
    assert plan.token_counts == _sums(plan.ranks, lengths)
    owner = {i: r for r, rank in enumerate(plan.ranks) for i in rank}
    for start in range(0, len(lengths), group_size):  # group mode never splits a group
        assert len({owner[i] for i in range(start, start + group_size)}) == 1
    if equal_count:
        counts = [len(rank) // group_size for rank in plan.ranks]
        assert max(counts) - min(counts) <= 1
    weights = [sum(lengths[s : s + group_size]) for s in range(0, len(lengths), group_size)]
    best = min(
        max(_sums(karmarkar_karp(weights, num_ranks, equal_count), weights), default=0),
        max(_sums(greedy_lpt(weights, num_ranks, equal_count), weights), default=0),
    )
    assert max(plan.token_counts) == best
    assert plan.imbalance == pytest.approx(imbalance(plan.token_counts))


@settings(max_examples=100, deadline=None)
@given(weights=st.lists(st.integers(0, 10**6), max_size=200), num_parts=st.integers(1, 70))
def test_karmarkar_karp_is_a_partition(weights: list[int], num_parts: int) -> None:
    parts = karmarkar_karp(weights, num_parts)
    assert len(parts) == num_parts
    assert sorted(i for p in parts for i in p) == list(range(len(weights)))
    assert all(p == sorted(p) for p in parts)


def test_karmarkar_karp_beats_lpt_on_the_textbook_case() -> None:
    weights = [8, 7, 6, 5, 4]
    assert sorted(_sums(karmarkar_karp(weights, 2), weights)) == [14, 16]
    assert sorted(_sums(greedy_lpt(weights, 2), weights)) == [13, 17]
    plan = balance_across_ranks(weights, 2)
    assert plan.method == "karmarkar_karp"
    assert plan.imbalance == pytest.approx(16 / 15 - 1)


def test_imbalance_is_max_over_mean_minus_one() -> None:
    assert imbalance([10, 20, 30]) == pytest.approx(0.5)
    assert imbalance([0, 0]) == 0.0
    assert balance_across_ranks([], 4).ranks == [[], [], [], []]


def test_balance_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="5 rows do not split into groups of group_size=2"):
        balance_across_ranks([1, 2, 3, 4, 5], 2, group_size=2)
    with pytest.raises(InvalidArgumentError, match="num_ranks must be an int >= 1"):
        balance_across_ranks([1], 0)
    with pytest.raises(InvalidLengthError, match="negative"):
        balance_across_ranks([1, -1], 2)
    with pytest.raises(InvalidArgumentError, match="num_parts"):
        karmarkar_karp([1], 0)


def _classic_kk_max(weights: list[int], k: int, equal_size: bool) -> int:
    """Reference: the classic set-per-partition k-way KK (dense k-vectors), largest part only."""
    import heapq

    class State:
        def __init__(self, items: list[tuple[int, int]]) -> None:
            self.sums = sorted([w for _, w in items] + [0] * (k - len(items)), reverse=True)
            self.sizes = [1] * len(items) + [0] * (k - len(items))

        def __lt__(self, other: State) -> bool:
            spread, other_spread = self.sums[0] - self.sums[-1], other.sums[0] - other.sums[-1]
            return spread > other_spread if spread != other_spread else self.sums[0] > other.sums[0]

    ordered = sorted((w, i) for i, w in enumerate(weights))
    if equal_size:
        states = [State([(i, w) for w, i in ordered[s : s + k]]) for s in range(0, len(ordered), k)]
    else:
        states = [State([(i, w)]) for w, i in ordered]
    heapq.heapify(states)
    while len(states) > 1:
        a, b = heapq.heappop(states), heapq.heappop(states)
        a.sums = sorted((x + y for x, y in zip(a.sums, reversed(b.sums), strict=True)), reverse=True)
        heapq.heappush(states, a)
    return states[0].sums[0] if states else 0


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.integers(0, 50), max_size=60),  # small values: many ties
    num_parts=st.integers(1, 10),
    equal_count=st.booleans(),
)
def test_karmarkar_karp_matches_classic_set_based_version(
    weights: list[int], num_parts: int, equal_count: bool
) -> None:
    if equal_count:
        weights = weights[: len(weights) - len(weights) % num_parts]
    ours = max(_sums(karmarkar_karp(weights, num_parts, equal_count), weights), default=0)
    assert ours == _classic_kk_max(weights, num_parts, equal_count)
