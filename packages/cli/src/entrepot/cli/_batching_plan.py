"""Compose entrepot.batching's DP balance and micro-batch planner for `rl batching plan`, and draw it.

The order matches the trainer: balance whole prompt groups across DP ranks first, then each rank
splits its share into micro-batches under the token budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """Planner settings from the command line."""

    budget: int
    max_micro_batch_size: int | None
    num_ranks: int
    group_size: int


@dataclass(frozen=True)
class RankPlanView:
    """One DP rank: its global sequence indices and its micro-batches (lists of global indices)."""

    indices: list[int]
    micro_batches: list[list[int]]
    lower_bound: int


@dataclass(frozen=True)
class PlanResult:
    """Everything `render_plan` shows."""

    lengths: list[int]
    request: PlanRequest
    ranks: list[RankPlanView]
    imbalance: float
    method: str


def compute_plan(lengths: Sequence[int], request: PlanRequest) -> PlanResult:
    """Balance `lengths` across ranks, then plan each rank's micro-batches (indices are global)."""
    from entrepot.batching import SequenceTooLongError, balance_across_ranks, plan_micro_batches

    lengths = list(lengths)
    rank_plan = balance_across_ranks(lengths, request.num_ranks, group_size=request.group_size)
    ranks = []
    for indices in rank_plan.ranks:
        try:
            local = plan_micro_batches(
                [lengths[i] for i in indices],
                request.budget,
                max_micro_batch_size=request.max_micro_batch_size,
            )
        except SequenceTooLongError as exc:  # name the sequence by its position in the user's list
            raise SequenceTooLongError(indices[exc.index], exc.length, exc.budget) from None
        micro = [[indices[j] for j in batch] for batch in local.micro_batches]
        ranks.append(RankPlanView(list(indices), micro, local.lower_bound))
    return PlanResult(lengths, request, ranks, float(rank_plan.imbalance), rank_plan.method)


def render_plan(result: PlanResult, show_indices: bool) -> None:
    """Print the micro-batch table and the per-rank table with token totals and imbalance."""
    from rich.console import Console
    from rich.table import Table

    lengths, budget = result.lengths, result.request.budget
    micro = Table(title=f"micro-batches (budget {budget} tokens)")
    for column in ("rank", "micro-batch", "sequences", "tokens", "fill"):
        micro.add_column(column, justify="right")
    if show_indices:
        micro.add_column("indices", overflow="fold")
    for rank, view in enumerate(result.ranks):
        for number, batch in enumerate(view.micro_batches):
            tokens = sum(lengths[i] for i in batch)
            row = [str(rank), str(number), str(len(batch)), str(tokens), f"{tokens / budget:.0%}"]
            micro.add_row(*row, *([" ".join(map(str, batch))] if show_indices else []))

    ranks = Table(title=f"DP ranks ({result.method}, imbalance max/mean - 1 = {result.imbalance:.4f})")
    for column in ("rank", "sequences", "tokens", "micro-batches", "lower bound"):
        ranks.add_column(column, justify="right")
    for rank, view in enumerate(result.ranks):
        tokens = sum(lengths[i] for i in view.indices)
        ranks.add_row(
            str(rank),
            str(len(view.indices)),
            str(tokens),
            str(len(view.micro_batches)),
            str(view.lower_bound),
        )
    console = Console()
    console.print(micro)
    console.print(ranks)
    console.print(
        f"{len(lengths)} sequences, {sum(lengths)} tokens, "
        f"{sum(len(v.micro_batches) for v in result.ranks)} micro-batches across {len(result.ranks)} ranks"
    )
