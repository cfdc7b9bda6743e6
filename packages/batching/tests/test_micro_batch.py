"""Strict-budget micro-batching: coverage, the cap, restore order, bounds and errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from entrepot.batching import (
    InvalidArgumentError,
    InvalidLengthError,
    LengthMismatchError,
    SequenceTooLongError,
    best_fit_decreasing,
    karmarkar_karp,
    plan_micro_batches,
)


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[int], int, int | None]:
    budget = draw(st.integers(1, 300))
    lengths = draw(st.lists(st.integers(0, budget), max_size=120))
    count_cap = draw(st.none() | st.integers(1, 12))
    return lengths, budget, count_cap


@settings(max_examples=150, deadline=None)
@given(batches())
def test_plan_covers_every_index_once_and_never_exceeds_caps(
    batch: tuple[list[int], int, int | None],
) -> None:
    lengths, budget, count_cap = batch
    plan = plan_micro_batches(lengths, budget, max_micro_batch_size=count_cap)
    flat = sorted(index for part in plan.micro_batches for index in part)
    assert flat == list(range(len(lengths)))
    for part, tokens in zip(plan.micro_batches, plan.token_counts, strict=True):
        assert tokens == sum(lengths[i] for i in part) <= budget
        assert count_cap is None or len(part) <= count_cap
    assert plan.lower_bound <= plan.num_micro_batches
    if lengths:
        assert plan.num_micro_batches <= len(best_fit_decreasing(lengths, budget, count_cap))
    # restore_order is the inverse of the micro-batch order.
    values = torch.arange(len(lengths))
    restored = plan.restore(plan.split(values)) if lengths else values
    assert torch.equal(restored, values)
    order = torch.tensor([i for part in plan.micro_batches for i in part], dtype=torch.int64)
    if lengths:
        assert torch.equal(order[plan.restore_order], values)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=60), st.none() | st.integers(60, 80))
def test_a_batch_within_one_budget_is_one_micro_batch_of_every_row_in_order(
    lengths: list[int], count_cap: int | None
) -> None:
    """The shortcut for a batch that fits at once gives the plan the search gives it."""
    from entrepot.batching._micro_batch import _search

    budget = max(sum(lengths), 1)
    plan = plan_micro_batches(lengths, budget, count_cap)
    assert plan.micro_batches == [list(range(len(lengths)))]
    assert plan.micro_batches == _search(lengths, 1, budget, count_cap)


def test_reaches_lower_bound_on_many_short_sequences() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = (torch.randint(16, 2048, (1000,), generator=gen)).tolist()
    plan = plan_micro_batches(lengths, 8192)
    assert plan.num_micro_batches == plan.lower_bound == -(-sum(lengths) // 8192)
    assert plan.imbalance < 0.02


def test_strict_where_classic_count_overshoots() -> None:
    lengths = [5, 5, 5, 5, 4]  # ceil(24 / 8) = 3 micro-batches would need 5 + 5 together
    classic = karmarkar_karp(lengths, 3)
    assert max(sum(lengths[i] for i in part) for part in classic) > 8
    plan = plan_micro_batches(lengths, 8)
    assert plan.lower_bound == 3
    assert plan.num_micro_batches == 5  # every 5 needs its own micro-batch, and 5 + 4 > 8
    assert max(plan.token_counts) <= 8


def test_max_micro_batch_size_limits_counts() -> None:
    plan = plan_micro_batches([1] * 10, 100, max_micro_batch_size=3)
    assert plan.num_micro_batches == 4 == plan.lower_bound
    assert max(len(p) for p in plan.micro_batches) <= 3
    assert sum(len(p) for p in plan.micro_batches) == 10


def test_split_and_restore_tensor_rows() -> None:
    lengths = [7, 1, 4, 4, 2, 6]
    plan = plan_micro_batches(lengths, 8)
    batch = torch.tensor(lengths).unsqueeze(1) * torch.ones(1, 3)
    parts = plan.split(batch)
    assert [p[:, 0].sum().item() for p in parts] == plan.token_counts
    assert torch.equal(plan.restore([p * 2 for p in parts]), batch * 2)


def test_empty_batch_gives_empty_plan() -> None:
    plan = plan_micro_batches([], 10)
    assert plan.micro_batches == [] and plan.lower_bound == 0 and plan.imbalance == 0.0
    assert plan.restore_order.numel() == 0


def test_errors() -> None:
    with pytest.raises(
        SequenceTooLongError, match="sequence 2 has 11 tokens, more than max_token_len=10"
    ) as info:
        plan_micro_batches(torch.tensor([3, 4, 11]), 10)
    assert (info.value.index, info.value.length, info.value.budget) == (2, 11, 10)
    with pytest.raises(InvalidLengthError, match=r"lengths\[1\] = -2"):
        plan_micro_batches([3, -2], 10)
    with pytest.raises(InvalidArgumentError, match="max_token_len must be an int >= 1"):
        plan_micro_batches([3], 0)
    with pytest.raises(InvalidArgumentError, match="max_micro_batch_size"):
        plan_micro_batches([3], 10, max_micro_batch_size=0)
    plan = plan_micro_batches([3, 4], 10)
    with pytest.raises(LengthMismatchError, match="batch has 3 rows"):
        plan.split(torch.zeros(3))


def test_splitting_to_an_agreed_count_keeps_every_index_and_the_cap() -> None:
    from entrepot.batching._micro_batch import _at_least

    parts = _at_least([[0, 1, 2, 3], [4], [5, 6]], 6)
    assert len(parts) == 6
    assert sorted(i for p in parts for i in p) == list(range(7))
    assert sum(1 for p in parts if not p) == 0
    assert _at_least([[0], [1]], 4) == [[0], [1], [], []]  # fewer sequences than micro-batches
