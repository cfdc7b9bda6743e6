"""DP balance: every row once, groups intact, equal counts, no worse than LPT / KK, optimal at the bound."""

from __future__ import annotations

import heapq
import random

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
from entrepot.batching._balance import lower_bound
from entrepot.batching._partition import sorted_lpt
from entrepot.batching._refine import refine_to_target


def _sums(parts: list[list[int]], weights: list[int]) -> list[int]:
    return [sum(weights[i] for i in part) for part in parts]


def _bound(weights: list[int], num_ranks: int) -> int:
    return lower_bound(sum(weights), max(weights, default=0), num_ranks)


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
    lpt = max(_sums(greedy_lpt(weights, num_ranks, equal_count), weights), default=0)
    kk = max(_sums(karmarkar_karp(weights, num_ranks, equal_count), weights), default=0)
    bound, heaviest = _bound(weights, num_ranks), max(plan.token_counts, default=0)
    assert bound <= heaviest <= lpt
    assert heaviest <= kk or heaviest <= bound * (1 + 1e-4)  # the default tolerance
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
    plan = balance_across_ranks(weights, 2)  # swaps take LPT's plan to the bound, past KK's
    assert plan.method == "greedy_lpt_swaps"
    assert plan.token_counts == [15, 15]
    assert plan.imbalance == 0.0


def test_karmarkar_karp_runs_when_swaps_fall_short_of_the_bound() -> None:
    weights = [9, 3, 23, 2, 28, 27, 21, 10, 15, 17, 3, 11]  # bound 43; LPT 47, swaps stop above 43
    assert max(_sums(greedy_lpt(weights, 4), weights)) == 47
    plan = balance_across_ranks(weights, 4)
    assert plan.method == "karmarkar_karp"
    assert max(plan.token_counts) == 43 == _bound(weights, 4)


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


def _reference_heap_lpt(weights: list[int], num_parts: int) -> list[list[int]]:
    """Textbook LPT: largest first (ties by index), each to the lightest part (ties to the lowest id)."""
    heap = [(0, part) for part in range(num_parts)]
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    for index in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, part = heapq.heappop(heap)
        parts[part].append(index)
        heapq.heappush(heap, (load + weights[index], part))
    return [sorted(part) for part in parts]


def _long_tailed(rng: random.Random, num: int) -> list[int]:
    """GRPO-like response lengths: log-normal, clipped at 4,096 tokens."""
    return [min(4096, 16 + int(rng.lognormvariate(6.5, 1.0))) for _ in range(num)]


@settings(max_examples=150, deadline=None)
@given(weights=st.lists(st.integers(0, 60), max_size=80), num_parts=st.integers(1, 12))
def test_sorted_lpt_is_the_heap_partitioners_plan(weights: list[int], num_parts: int) -> None:
    order, ordered, parts, loads = sorted_lpt(weights, num_parts)
    assert ordered == [weights[i] for i in order] == sorted(weights)
    assert all(part == sorted(part) for part in parts)
    plan = [sorted(order[p] for p in part) for part in parts]
    assert plan == _reference_heap_lpt(weights, num_parts) == greedy_lpt(weights, num_parts)
    assert loads == _sums(plan, weights)


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.integers(0, 5000), max_size=120),
    num_ranks=st.integers(1, 40),
    equal_count=st.booleans(),
)
def test_balance_is_a_partition_no_heavier_than_the_heap_partitioner(
    weights: list[int], num_ranks: int, equal_count: bool
) -> None:
    plan = balance_across_ranks(weights, num_ranks, equal_count=equal_count)
    assert sorted(i for rank in plan.ranks for i in rank) == list(range(len(weights)))
    assert all(rank == sorted(rank) for rank in plan.ranks)
    assert plan.token_counts == _sums(plan.ranks, weights)
    heap_max = max(_sums(_reference_heap_lpt(weights, num_ranks), weights))
    if not equal_count:
        assert max(plan.token_counts) <= heap_max
    else:
        counts = [len(rank) for rank in plan.ranks]
        assert max(counts) - min(counts) <= 1
        assert max(plan.token_counts) <= max(_sums(greedy_lpt(weights, num_ranks, True), weights))


@pytest.mark.parametrize("num_ranks", [8, 32])
@pytest.mark.parametrize("num", [1024, 4096])
def test_long_tailed_batches_reach_the_bound(num: int, num_ranks: int) -> None:
    lengths = _long_tailed(random.Random(num + num_ranks), num)
    plan = balance_across_ranks(lengths, num_ranks, tolerance=0)
    heap_max = max(_sums(_reference_heap_lpt(lengths, num_ranks), lengths))
    assert max(plan.token_counts) == _bound(lengths, num_ranks) <= heap_max
    assert plan.method in ("greedy_lpt", "greedy_lpt_swaps")  # optimal: Karmarkar-Karp was not needed
    assert sorted(i for rank in plan.ranks for i in rank) == list(range(num))


@pytest.mark.parametrize("tolerance", [1e-4, 3e-4])
def test_the_search_stops_within_the_tolerance(tolerance: float) -> None:
    lengths = _long_tailed(random.Random(7), 1024)
    bound = _bound(lengths, 32)
    heap_max = max(_sums(_reference_heap_lpt(lengths, 32), lengths))
    assert heap_max > bound * (1 + tolerance)  # LPT alone is not close enough: exchanges must run
    plan = balance_across_ranks(lengths, 32, tolerance=tolerance)
    assert bound <= max(plan.token_counts) <= bound * (1 + tolerance)
    assert plan.method == "greedy_lpt_swaps"


@pytest.mark.parametrize("tolerance", [-0.1, 1.0, "0", True])
def test_a_bad_tolerance_is_refused(tolerance: object) -> None:
    with pytest.raises(InvalidArgumentError, match="tolerance"):
        balance_across_ranks([1, 2, 3], 2, tolerance=tolerance)  # type: ignore[arg-type]


def test_lower_bound_is_the_mean_rounded_up_or_the_heaviest_group() -> None:
    assert _bound([5, 5, 5, 6], 2) == 11
    assert _bound([100, 1, 1, 1], 2) == 100
    assert _bound([], 3) == 0


@pytest.mark.parametrize(
    ("weights", "num_ranks"),
    [([5, 5, 5, 5], 2), ([100, 1, 1, 1], 2), ([9, 14, 2, 19], 4), ([7, 3, 3, 1], 2)],
)
def test_lpt_at_the_bound_is_returned_as_is(weights: list[int], num_ranks: int) -> None:
    plan = balance_across_ranks(weights, num_ranks)
    assert plan.method == "greedy_lpt"
    assert plan.ranks == greedy_lpt(weights, num_ranks)
    assert max(plan.token_counts) == _bound(weights, num_ranks)


def test_refine_swaps_keep_counts_and_moves_may_change_them() -> None:
    weights = [4, 5, 6, 7, 8]  # ascending: an item is its position
    parts, loads = [[0, 1, 4], [2, 3]], [17, 13]  # LPT's plan
    assert refine_to_target(weights, parts, loads, 15, allow_moves=False) == 1
    assert loads == [15, 15] and [len(p) for p in parts] == [3, 2]
    assert loads == [sum(weights[p] for p in part) for part in parts]
    parts, loads = [[2, 3, 4], [0, 1]], [21, 9]
    refine_to_target(weights, parts, loads, 15, allow_moves=True)
    assert loads == [sum(weights[p] for p in part) for part in parts] == [15, 15]
    assert all(part == sorted(part) for part in parts)


def test_refine_stops_when_no_exchange_helps() -> None:
    weights = [10, 10, 10]
    parts, loads = [[0, 1], [2]], [20, 10]
    assert refine_to_target(weights, parts, loads, 15, allow_moves=True) == 0
    assert parts == [[0, 1], [2]] and loads == [20, 10]


@pytest.mark.parametrize("allow_moves", [True, False])
def test_refine_exchanges_pairs_when_no_single_swap_fits(allow_moves: bool) -> None:
    weights = [11, 20, 27, 29, 34, 34, 39, 40]  # heavy 20+27+34+39, light 11+29+34+40: no swap moves 3
    parts, loads = [[1, 2, 4, 6], [0, 3, 5, 7]], [120, 114]
    assert refine_to_target(weights, parts, loads, 117, allow_moves) == 1
    assert loads == [117, 117] == [sum(weights[p] for p in part) for part in parts]
    assert [len(part) for part in parts] == [4, 4] or allow_moves
