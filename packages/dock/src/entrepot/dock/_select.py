"""Row selection over ready/consumed bitmaps, chunk by chunk so a FIFO get stops early.

A FIFO get scans from the consumer's watermark (its first row that may be unconsumed) in chunks
that start at `FIRST_CHUNK` rows and double, and stops once it has enough rows, so its cost follows
where the ready rows are, not the dock's capacity (a scan that must cover everything takes
O(log capacity) steps); every step is a vectorised bitmap operation, never a Python loop over rows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

FIRST_CHUNK = 1 << 12
CHUNK = 1 << 16  # watermark advance step

# (lo, hi) -> bool [hi - lo]: which rows in [lo, hi) this get may take.
AvailableFn = Callable[[int, int], torch.Tensor]


def _chunk_units(available: torch.Tensor, group_size: int) -> torch.Tensor:
    """Start rows of the available units (single rows, or whole groups of `group_size` rows)."""
    if group_size == 1:
        return available.nonzero().squeeze(1)
    return available.view(-1, group_size).all(1).nonzero().squeeze(1) * group_size


def scan(
    available: AvailableFn,
    start: int,
    capacity: int,
    group_size: int,
    stop_after: int | None,
) -> torch.Tensor:
    """Start rows of available units from `start` on, stopping once `stop_after` units are found.

    Args:
        available: the availability mask of a row range.
        start: first row to look at (rounded down to a group boundary).
        capacity: number of rows.
        group_size: rows per unit (1, or n_samples_per_prompt in group mode).
        stop_after: stop once this many units are found (None: scan everything, for random sampling).

    Returns:
        int64 [U] unit start rows in increasing order.
    """
    step = max(1, FIRST_CHUNK // group_size) * group_size
    if stop_after is None:
        step = capacity  # everything is needed anyway: one pass
    lo = (start // group_size) * group_size
    found: list[torch.Tensor] = []
    num_found = 0
    while lo < capacity:
        hi = min(capacity, lo + step)
        units = _chunk_units(available(lo, hi), group_size) + lo
        found.append(units)
        num_found += units.numel()
        if stop_after is not None and num_found >= stop_after:
            break
        lo = hi
        step *= 2
    if not found:
        return torch.empty(0, dtype=torch.int64)
    return torch.cat(found)


def expand_units(unit_starts: torch.Tensor, group_size: int) -> torch.Tensor:
    """Rows of the units: [U] start rows -> [U * group_size] rows, group members adjacent."""
    if group_size == 1:
        return unit_starts
    return (unit_starts[:, None] + torch.arange(group_size)).reshape(-1)


def advance_watermark(consumed: torch.Tensor, watermark: int) -> int:
    """First row at or after `watermark` that is not consumed (len(consumed) if none).

    Looks in windows that start small and double, so the usual case (the next free row is near)
    costs a few hundred elements whatever the capacity.
    """
    capacity = consumed.numel()
    step = 256
    while watermark < capacity:
        hi = min(capacity, watermark + step)
        free = (~consumed[watermark:hi]).nonzero()
        if free.numel():
            return watermark + int(free[0, 0])
        watermark = hi
        step = min(2 * step, CHUNK)
    return capacity
