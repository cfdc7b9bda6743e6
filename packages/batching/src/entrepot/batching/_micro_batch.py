"""Dynamic batch size: split a batch into micro-batches under a STRICT token budget.

Every micro-batch holds at most ``max_token_len`` tokens (never more: an overshoot is an OOM) and,
optionally, at most ``max_micro_batch_size`` sequences. Among plans that respect both caps we look
for the fewest micro-batches k (reported against the lower bound ceil(total / budget)), then the
most even token totals at that k:

1. best-fit decreasing (BFD) gives a feasible k_bfd (a tight packing, not a balanced one);
2. from the Martello-Toth lower bound upwards (galloping, then bisection, below k_bfd) we look
   for the smallest k at which LPT with the caps places every sequence;
3. at that k, LPT and Karmarkar-Karp compete: the feasible one with the smaller largest
   micro-batch wins (BFD's plan if neither is feasible).

Each try is O(N log N); the search makes O(log(k_bfd - lower bound)) tries.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from entrepot.batching._errors import InvalidArgumentError, LengthMismatchError, SequenceTooLongError
from entrepot.batching._lengths import LengthsLike, as_length_list, gc_paused
from entrepot.batching._partition import _karmarkar_karp, _lpt, part_sums

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["MicroBatchPlan", "plan_micro_batches"]


@dataclass(frozen=True)
class MicroBatchPlan:
    """Micro-batches of one batch and how to put their outputs back in order.

    Attributes:
        micro_batches: sequence indices per micro-batch (ascending inside each; heaviest first).
        token_counts: tokens per micro-batch, each <= ``max_token_len``.
        restore_order: int64 [N]: ``torch.cat(outputs_in_micro_batch_order)[restore_order]`` is in
            the original order.
        lower_bound: max(ceil(total / max_token_len), ceil(N / max_micro_batch_size)).
        max_token_len: the budget the plan was made for.
        num_sequences: N, the number of sequences planned.
    """

    micro_batches: list[list[int]]
    token_counts: list[int]
    restore_order: Tensor
    lower_bound: int
    max_token_len: int
    num_sequences: int

    @property
    def num_micro_batches(self) -> int:
        """k."""
        return len(self.micro_batches)

    @property
    def imbalance(self) -> float:
        """max / mean - 1 of the token totals (0.0 for an empty plan)."""
        total = sum(self.token_counts)
        if total == 0:
            return 0.0
        return max(self.token_counts) * len(self.token_counts) / total - 1.0

    def split(self, batch: Tensor) -> list[Tensor]:
        """Rows of ``batch`` [N, ...] for each micro-batch (``index_select`` copies)."""
        if batch.shape[0] != self.num_sequences:
            raise LengthMismatchError(
                f"batch has {batch.shape[0]} rows, the plan covers {self.num_sequences}"
            )
        return [
            batch.index_select(0, torch.tensor(indices, dtype=torch.int64, device=batch.device))
            for indices in self.micro_batches
        ]

    def restore(self, outputs: Sequence[Tensor]) -> Tensor:
        """Concatenate per-micro-batch outputs [n_j, ...] and return them in the original order [N, ...]."""
        if len(outputs) != self.num_micro_batches:
            raise LengthMismatchError(f"{len(outputs)} outputs for {self.num_micro_batches} micro-batches")
        joined = torch.cat(list(outputs))
        if joined.shape[0] != self.num_sequences:
            raise LengthMismatchError(
                f"outputs have {joined.shape[0]} rows, the plan covers {self.num_sequences}"
            )
        return joined.index_select(0, self.restore_order.to(joined.device))


def _check_budget(max_token_len: int, max_micro_batch_size: int | None) -> None:
    if isinstance(max_token_len, bool) or not isinstance(max_token_len, int) or max_token_len < 1:
        raise InvalidArgumentError(f"max_token_len must be an int >= 1, got {max_token_len!r}")
    if max_micro_batch_size is not None and (
        isinstance(max_micro_batch_size, bool)
        or not isinstance(max_micro_batch_size, int)
        or max_micro_batch_size < 1
    ):
        raise InvalidArgumentError(
            f"max_micro_batch_size must be None or an int >= 1, got {max_micro_batch_size!r}"
        )


def best_fit_decreasing(lengths: Sequence[int], cap: int, count_cap: int | None = None) -> list[list[int]]:
    """Tight packing: each sequence, longest first, into the fullest micro-batch it still fits.

    A sorted list of (load, bin) answers "fullest bin with load <= cap - length" by bisection;
    bins that reach ``count_cap`` leave the list.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    bins: list[list[int]] = []
    open_bins: list[tuple[int, int]] = []  # (load, bin id), ascending
    for index in order:
        length = lengths[index]
        position = bisect_right(open_bins, (cap - length, len(lengths))) - 1
        if position >= 0:
            load, bin_id = open_bins.pop(position)
        else:
            load, bin_id = 0, len(bins)
            bins.append([])
        bins[bin_id].append(index)
        if count_cap is None or len(bins[bin_id]) < count_cap:
            insort(open_bins, (load + length, bin_id))
    for items in bins:
        items.sort()
    return bins


def _fits(parts: list[list[int]], lengths: Sequence[int], cap: int, count_cap: int | None) -> bool:
    if count_cap is not None and any(len(part) > count_cap for part in parts):
        return False
    return max(part_sums(parts, lengths), default=0) <= cap


def _balanced(lengths: Sequence[int], k: int, cap: int, count_cap: int | None) -> list[list[int]] | None:
    """Feasible balanced plan with k micro-batches (the smaller largest one of LPT and KK), or None."""
    candidates = [
        _lpt(lengths, k, cap=cap, count_cap=count_cap),
        _karmarkar_karp(lengths, k, equal_count=False),
    ]
    feasible = [parts for parts in candidates if parts is not None and _fits(parts, lengths, cap, count_cap)]
    if not feasible:
        return None
    return min(feasible, key=lambda parts: max(part_sums(parts, lengths)))


def martello_toth_bound(lengths: Sequence[int], cap: int) -> int:
    """Martello-Toth L2 lower bound on the number of bins of size ``cap`` (>= ceil(total / cap)).

    For each threshold a <= cap / 2: items > cap - a each need their own bin, items in
    (cap / 2, cap - a] too, and items in [a, cap / 2] must fill what those leave free before
    opening more. Evaluated at every distinct length <= cap / 2 with prefix sums: O(N log N).
    """
    ordered = sorted(lengths)
    prefix = [0]
    for value in ordered:
        prefix.append(prefix[-1] + value)
    count = len(ordered)
    half = bisect_right(ordered, cap // 2)  # ordered[:half] <= cap / 2 (integer cap: <= floor)
    best = -(-prefix[-1] // cap) if count else 0
    for threshold in sorted(set(ordered[:half])) or [0]:
        j1_start = bisect_right(ordered, cap - threshold)  # J1 = ordered[j1_start:]
        j2_count, j2_sum = j1_start - half, prefix[j1_start] - prefix[half]  # J2 = (cap/2, cap - a]
        j3_start = bisect_right(ordered, threshold - 1)  # J3 = [a, cap/2]
        j3_sum = prefix[half] - prefix[j3_start]
        spill = j3_sum - (j2_count * cap - j2_sum)
        bound = (count - j1_start) + j2_count + max(0, -(-spill // cap))
        best = max(best, bound)
    return best


def _search(lengths: Sequence[int], lower: int, cap: int, count_cap: int | None) -> list[list[int]]:
    """Fewest micro-batches LPT reaches below BFD's count, balanced at that count; else BFD's plan.

    LPT alone decides feasibility while searching (it is the cheap test); at the chosen count
    Karmarkar-Karp also competes for the best balance.
    """
    tight = best_fit_decreasing(lengths, cap, count_cap)
    upper = len(tight)  # feasible via BFD

    def feasible(k: int) -> bool:
        return _lpt(lengths, k, cap=cap, count_cap=count_cap) is not None

    bad, good, step = lower - 1, upper, 1  # every k <= bad failed; good is feasible
    while bad + 1 < upper:  # gallop upwards from the lower bound
        k = min(bad + step, upper - 1)
        if feasible(k):
            good = k
            break
        bad, step = k, step * 2
    while good - bad > 1:  # bisect (bad, good)
        mid = (bad + good) // 2
        if feasible(mid):
            good = mid
        else:
            bad = mid
    return _balanced(lengths, good, cap, count_cap) or tight


def _at_least(parts: list[list[int]], k: int) -> list[list[int]]:
    """Split the largest micro-batches in two until there are k (never breaks a cap)."""
    parts = [part for part in parts if part]
    parts.sort(key=len)
    while len(parts) < k and parts and len(parts[-1]) > 1:
        biggest = parts.pop()
        half = len(biggest) // 2
        for piece in (biggest[:half], biggest[half:]):
            insort(parts, piece, key=len)
    return parts + [[] for _ in range(k - len(parts))]


def _agree(count: int, group: ProcessGroup | None) -> int:
    """The largest k over the ranks of ``group`` (one all-reduce MAX)."""
    import torch.distributed as dist

    backend = dist.get_backend(group)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    value = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return int(value.item())


def plan_micro_batches(
    lengths: LengthsLike,
    max_token_len: int,
    max_micro_batch_size: int | None = None,
    group: ProcessGroup | None = None,
) -> MicroBatchPlan:
    """Split N sequences into the fewest micro-batches of at most ``max_token_len`` tokens each.

    Args:
        lengths: N token counts (list or 1-D integer tensor).
        max_token_len: strict per-micro-batch token budget.
        max_micro_batch_size: optional cap on sequences per micro-batch.
        group: a ``torch.distributed`` process group; all its ranks get the same number of
            micro-batches (the largest any rank needs; one all-reduce MAX). Every rank must call.

    Returns:
        The plan. With ``group``, a rank that needs fewer micro-batches splits its own (never
        breaking a cap) and only adds empty ones when it has fewer sequences than micro-batches.

    Raises:
        SequenceTooLongError: a single sequence exceeds ``max_token_len``.
    """
    _check_budget(max_token_len, max_micro_batch_size)
    sizes = as_length_list(lengths)
    for index, size in enumerate(sizes):
        if size > max_token_len:
            raise SequenceTooLongError(index, size, max_token_len)
    lower = 0
    if sizes:
        lower = max(1, -(-sum(sizes) // max_token_len))
        if max_micro_batch_size is not None:
            lower = max(lower, -(-len(sizes) // max_micro_batch_size))
    with gc_paused():
        parts: list[list[int]] = []
        if lower == 1:  # everything fits in one: that plan, rows in order (what the search returns too)
            parts = [list(range(len(sizes)))]
        elif sizes:
            start = max(lower, martello_toth_bound(sizes, max_token_len))
            parts = _search(sizes, start, max_token_len, max_micro_batch_size)
        if group is not None:
            agreed = _agree(len(parts), group)
            if agreed > len(parts):
                balanced = _balanced(sizes, agreed, max_token_len, max_micro_batch_size)
                parts = balanced if balanced is not None else _at_least(parts, agreed)
        return _make_plan(parts, sizes, lower, max_token_len)


def _make_plan(parts: list[list[int]], sizes: Sequence[int], lower: int, cap: int) -> MicroBatchPlan:
    counts = part_sums(parts, sizes)
    ranked = sorted(range(len(parts)), key=lambda j: (-counts[j], parts[j][:1]))
    parts = [parts[j] for j in ranked]
    counts = [counts[j] for j in ranked]
    order = [index for part in parts for index in part]
    restore = torch.empty(len(order), dtype=torch.int64)
    restore[torch.tensor(order, dtype=torch.int64)] = torch.arange(len(order))
    return MicroBatchPlan(
        micro_batches=parts,
        token_counts=counts,
        restore_order=restore,
        lower_bound=lower,
        max_token_len=cap,
        num_sequences=len(sizes),
    )
