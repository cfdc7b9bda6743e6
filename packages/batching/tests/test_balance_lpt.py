"""The LPT core of DP balance: the plain heapq LPT's plan, with and without equal counts."""

from __future__ import annotations

import heapq
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrepot.batching import balance_across_ranks, greedy_lpt
from entrepot.batching._partition import _lpt, lpt


def _heapq_lpt(weights: list[int], num_parts: int, equal_count: bool) -> list[list[int]]:
    """Plain heapq LPT: longest first (ties by index) to the lightest part (ties to the lower id).

    With ``equal_count``, parts popped while unable to take one more item (floor(N/k) items once
    N mod k parts hold ceil(N/k), or ceil(N/k) items) leave the heap.
    """
    base, extra = divmod(len(weights), num_parts)
    heap = [(0, part) for part in range(num_parts)]
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    for index in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, part = heapq.heappop(heap)
        while equal_count and len(parts[part]) >= base and not (len(parts[part]) == base and extra):
            load, part = heapq.heappop(heap)
        if equal_count and len(parts[part]) == base:
            extra -= 1
        parts[part].append(index)
        heapq.heappush(heap, (load + weights[index], part))
    return [sorted(part) for part in parts]


def _sums(parts: list[list[int]], weights: list[int]) -> list[int]:
    return [sum(weights[i] for i in part) for part in parts]


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.integers(0, 60), max_size=120),  # small values: many ties
    num_parts=st.integers(1, 12),
    equal_count=st.booleans(),
)
def test_lpt_is_the_plain_heapq_lpt(weights: list[int], num_parts: int, equal_count: bool) -> None:
    order, parts, loads = lpt(weights, num_parts, equal_count)
    assert order == sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    assert all(part == sorted(part, key=order.index) for part in parts)  # in placement order
    plan = [sorted(part) for part in parts]
    assert plan == _heapq_lpt(weights, num_parts, equal_count) == greedy_lpt(weights, num_parts, equal_count)
    assert loads == _sums(plan, weights)


@pytest.mark.parametrize("equal_count", [False, True])
@pytest.mark.parametrize(("num", "num_parts"), [(2048, 8), (2000, 8), (4096, 32), (1000, 32), (300, 7)])
def test_lpt_matches_heapq_lpt_on_long_batches(num: int, num_parts: int, equal_count: bool) -> None:
    """Long enough for the unchecked runs of the equal-count LPT (room >= 16 items per part)."""
    rng = random.Random(num * num_parts)
    weights = [min(4096, 16 + int(rng.lognormvariate(6.5, 1.0))) for _ in range(num)]
    _, parts, loads = lpt(weights, num_parts, equal_count)
    plan = [sorted(part) for part in parts]
    assert plan == _heapq_lpt(weights, num_parts, equal_count)
    assert loads == _sums(plan, weights)
    if equal_count:
        assert plan == _lpt(weights, num_parts, equal_count=True)  # the capped LPT's count rule


@settings(max_examples=100, deadline=None)
@given(num=st.integers(0, 300), num_parts=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_equal_count_gives_floor_or_ceil_counts(num: int, num_parts: int, seed: int) -> None:
    rng = random.Random(seed)
    weights = [rng.randint(0, 5000) for _ in range(num)]
    counts = sorted(len(part) for part in lpt(weights, num_parts, equal_count=True)[1])
    base, extra = divmod(num, num_parts)
    assert counts == [base] * (num_parts - extra) + [base + 1] * extra
    plan = balance_across_ranks(weights, num_parts, equal_count=True)
    assert sorted(map(len, plan.ranks)) == counts


def test_equal_count_totals_match_the_count_guarded_heap_of_upstream() -> None:
    """verl / MindSpeed-RL's heap of (load, count, rank), a rank retired at N / k items: same totals."""
    rng = random.Random(3)
    weights = [rng.randint(1, 10**9) for _ in range(512)]  # distinct loads: tie rules cannot differ
    heap = [(0, 0, rank) for rank in range(8)]
    totals = [0] * 8
    for index in sorted(range(512), key=weights.__getitem__, reverse=True):
        load, count, rank = heap[0]
        totals[rank] = load + weights[index]
        if count + 1 < 512 // 8:
            heapq.heapreplace(heap, (load + weights[index], count + 1, rank))
        else:
            heapq.heappop(heap)
    assert lpt(weights, 8, equal_count=True)[2] == totals


def test_lpt_within_the_tolerance_is_returned_sorted() -> None:
    rng = random.Random(5)
    weights = [rng.randint(1, 4096) for _ in range(4096)]
    plan = balance_across_ranks(weights, 8, tolerance=0.5)
    assert plan.method == "greedy_lpt"
    assert plan.ranks == greedy_lpt(weights, 8)
    assert plan.token_counts == lpt(weights, 8)[2]
