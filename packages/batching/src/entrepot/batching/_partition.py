"""Number partitioning into k parts: k-way Karmarkar-Karp and sorted greedy (LPT).

Both return exactly ``num_parts`` lists of item indices (some may be empty) and work in
O(N log N) Python-level steps for N items (plus C-level list moves of at most k entries).

Karmarkar-Karp (largest differencing) keeps a heap of partial solutions ("states"), each a
partition of some items into at most k parts. It repeatedly combines the two states of largest
spread (max part - min part) by pairing the largest part of one with the smallest of the other.
The classic implementation stores k sets per state, so every combination costs O(k) and the whole
run O(N k log k). Here a state stores only its non-empty parts, sorted, and the smaller state is
merged into the larger one: pairing the larger state's m_b smallest parts (its empty parts first)
with the smaller state's m_b parts in reverse order is exactly the classic pairing, and costs
O(m_b log k). Part membership is a merge tree (node -> two children), flattened once at the end.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Sequence

from entrepot.batching._errors import InvalidArgumentError
from entrepot.batching._lengths import LengthsLike, as_length_list, gc_paused

__all__ = ["greedy_lpt", "karmarkar_karp", "part_sums"]

# Above this many new parts a merge re-sorts the whole state instead of inserting one by one.
_INSERT_LIMIT = 16


def part_sums(parts: Sequence[Sequence[int]], weights: Sequence[int]) -> list[int]:
    """Total weight of each part."""
    return [sum(weights[i] for i in part) for part in parts]


class _Forest:
    """Merge tree of parts: leaves are item indices, internal nodes join two parts."""

    def __init__(self, num_leaves: int) -> None:
        self.num_leaves = num_leaves
        self.children: list[tuple[int, int]] = []

    def join(self, a: int, b: int) -> int:
        self.children.append((a, b))
        return self.num_leaves + len(self.children) - 1

    def leaves(self, node: int, keep_below: int) -> list[int]:
        """Item indices under ``node`` that are < ``keep_below`` (drops padding items), ascending."""
        out: list[int] = []
        stack = [node]
        while stack:
            current = stack.pop()
            if current < self.num_leaves:
                if current < keep_below:
                    out.append(current)
            else:
                stack.extend(self.children[current - self.num_leaves])
        out.sort()
        return out


def _spread(parts: list[tuple[int, int]], num_parts: int) -> int:
    low = parts[0][0] if len(parts) == num_parts else 0
    return parts[-1][0] - low


def _combine(
    big: list[tuple[int, int]], small: list[tuple[int, int]], num_parts: int, forest: _Forest
) -> None:
    """Merge ``small`` into ``big`` in place with the Karmarkar-Karp pairing (big has >= parts)."""
    num_small = len(small)
    zeros = min(num_small, num_parts - len(big))
    reused = num_small - zeros  # big's smallest real parts that receive one of small's parts
    largest_first = small[::-1]
    added = largest_first[:zeros]  # paired with big's empty parts: kept as they are
    for (weight_a, node_a), (weight_b, node_b) in zip(big[:reused], largest_first[zeros:], strict=True):
        added.append((weight_a + weight_b, forest.join(node_a, node_b)))
    del big[:reused]
    if len(added) <= _INSERT_LIMIT:
        for entry in added:
            insort(big, entry)
    else:
        big.extend(added)
        big.sort()


def karmarkar_karp(weights: LengthsLike, num_parts: int, equal_count: bool = False) -> list[list[int]]:
    """k-way largest differencing partition of ``weights`` into ``num_parts`` parts.

    Args:
        weights: N non-negative ints (list or 1-D integer tensor).
        num_parts: k >= 1.
        equal_count: parts get floor(N/k) or ceil(N/k) items (zero-weight padding items are
            added up to a multiple of k and dropped from the result).

    Returns:
        k lists of item indices, each ascending; parts with no items are empty lists.
    """
    values = as_length_list(weights, "weights")
    with gc_paused():
        return _karmarkar_karp(values, _check_parts(num_parts), equal_count)


def _check_parts(num_parts: int) -> int:
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or num_parts < 1:
        raise InvalidArgumentError(f"num_parts must be an int >= 1, got {num_parts!r}")
    return num_parts


def _karmarkar_karp(weights: Sequence[int], num_parts: int, equal_count: bool) -> list[list[int]]:
    num_items = len(weights)
    if num_parts == 1 or num_items == 0:
        return [list(range(num_items))] + [[] for _ in range(num_parts - 1)]
    values = list(weights)
    if equal_count:
        values += [0] * (-num_items % num_parts)
    forest = _Forest(len(values))
    heap: list[tuple[int, int, list[tuple[int, int]]]] = []
    if equal_count:
        order = sorted(range(len(values)), key=values.__getitem__, reverse=True)
        for start in range(0, len(order), num_parts):
            parts = sorted((values[i], i) for i in order[start : start + num_parts])
            heap.append((-_spread(parts, num_parts), start, parts))
    else:
        heap = [(-weight, index, [(weight, index)]) for index, weight in enumerate(values)]
    heapq.heapify(heap)
    while len(heap) > 1:
        _, tie_a, parts_a = heapq.heappop(heap)
        _, tie_b, parts_b = heapq.heappop(heap)
        if len(parts_a) < len(parts_b):
            parts_a, parts_b = parts_b, parts_a
        _combine(parts_a, parts_b, num_parts, forest)
        heapq.heappush(heap, (-_spread(parts_a, num_parts), min(tie_a, tie_b), parts_a))
    final = heap[0][2]
    result = [forest.leaves(node, num_items) for _, node in final]
    result += [[] for _ in range(num_parts - len(result))]
    return result


def greedy_lpt(weights: LengthsLike, num_parts: int, equal_count: bool = False) -> list[list[int]]:
    """Sorted greedy (longest processing time first): each item, largest first, to the lightest part.

    Args:
        weights: N non-negative ints (list or 1-D integer tensor).
        num_parts: k >= 1.
        equal_count: parts get floor(N/k) or ceil(N/k) items.

    Returns:
        k lists of item indices, each ascending.
    """
    values = as_length_list(weights, "weights")
    with gc_paused():
        return _greedy_lpt(values, _check_parts(num_parts), equal_count)


def _greedy_lpt(weights: Sequence[int], num_parts: int, equal_count: bool) -> list[list[int]]:
    parts = _lpt(weights, num_parts, equal_count=equal_count)
    assert parts is not None  # without a token cap every item fits somewhere
    return parts


def _lpt(
    weights: Sequence[int],
    num_parts: int,
    *,
    equal_count: bool = False,
    cap: int | None = None,
    count_cap: int | None = None,
) -> list[list[int]] | None:
    """LPT with optional token cap and item-count cap; None when an item fits in no part.

    The lightest open part is the only candidate: if the item overflows it, it overflows all.
    """
    num_items = len(weights)
    order = sorted(range(num_items), key=weights.__getitem__, reverse=True)
    base, extra = divmod(num_items, num_parts)
    if equal_count:
        # ``extra`` parts may hold base + 1 items, the others base items.
        count_cap = base + 1 if extra else base
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    heap = [(0, part) for part in range(num_parts)]  # (load, part id)
    full_slots = extra  # equal_count: how many parts may still reach base + 1
    for index in order:
        weight = weights[index]
        while heap:
            load, part = heapq.heappop(heap)
            size = len(parts[part])
            if count_cap is not None and size >= count_cap:
                continue
            if equal_count and size == base and full_slots == 0:
                continue
            break
        else:
            return None
        if cap is not None and load + weight > cap:
            return None
        parts[part].append(index)
        if equal_count and len(parts[part]) == base + 1:
            full_slots -= 1
        heapq.heappush(heap, (load + weight, part))
    for part_items in parts:
        part_items.sort()
    return parts
