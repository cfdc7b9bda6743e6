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
O(m_b log k). Item lists of paired parts are joined small-to-large (O(N log N) C-level moves).
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Callable, Sequence

from entrepot.batching._errors import InvalidArgumentError
from entrepot.batching._lengths import LengthsLike, as_length_list, gc_paused

__all__ = ["greedy_lpt", "karmarkar_karp", "lpt", "part_sums", "sorted_lpt"]

# Above this many new parts a merge re-sorts the whole state instead of inserting one by one.
_INSERT_LIMIT = 2


def part_sums(parts: Sequence[Sequence[int]], weights: Sequence[int]) -> list[int]:
    """Total weight of each part."""
    return [sum(weights[i] for i in part) for part in parts]


Part = tuple[int, int, list[int]]  # (token total, unique id for ties, item indices)


def _join(first: list[int], second: list[int]) -> list[int]:
    """Union of two parts' item lists: the shorter is appended to the longer (small-to-large)."""
    if len(first) < len(second):
        first, second = second, first
    first.extend(second)
    return first


def _combine(big: list[Part], small: list[Part], num_parts: int, next_id: int) -> int:
    """Merge ``small`` into ``big`` in place with the Karmarkar-Karp pairing; returns the next free id.

    ``big`` has at least as many parts as ``small``; both are sorted ascending.
    """
    num_small = len(small)
    zeros = min(num_small, num_parts - len(big))
    reused = num_small - zeros  # big's smallest real parts that receive one of small's parts
    largest_first = small[::-1]
    added = largest_first[:zeros]  # paired with big's empty parts: kept as they are
    for (weight_a, _, items_a), (weight_b, _, items_b) in zip(
        big[:reused], largest_first[zeros:], strict=True
    ):
        added.append((weight_a + weight_b, next_id, _join(items_a, items_b)))
        next_id += 1
    del big[:reused]
    if len(added) <= _INSERT_LIMIT:
        for entry in added:
            insort(big, entry)
    else:  # timsort merges the sorted remainder with the new parts in C
        big.extend(added)
        big.sort()
    return next_id


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
    # Two queues of states, popped by largest spread: single items (a singleton's spread is its
    # weight, so descending order is their pop order) and merged states in a heap.
    singles = sorted(range(len(values)), key=values.__getitem__, reverse=True)
    # (-spread, -largest part, parts ascending); like the classic version, ties in spread go to
    # the state with the larger largest part, and a merged state before a single item.
    heap: list[tuple[int, int, list[Part]]] = []
    if equal_count:
        for start in range(0, len(singles), num_parts):
            parts = sorted((values[i], i, [i]) for i in singles[start : start + num_parts])
            heap.append((parts[0][0] - parts[-1][0], -parts[-1][0], parts))
        singles = []
        heapq.heapify(heap)
    next_single, num_singles = 0, len(singles)
    next_id = len(values)  # ids below are the items' own; also the heap's tie-breaker

    def single_next() -> bool:
        """Whether the next state to pop is a single item (merged states win ties)."""
        return next_single < num_singles and (not heap or values[singles[next_single]] > -heap[0][0])

    for _ in range(num_singles + len(heap) - 1):
        # Hot loop, run N - 1 times: single items stay bare indices until they join a state.
        if single_next():
            single = singles[next_single]
            next_single += 1
            if single_next():  # two single items: a state with one part each
                big = [(values[single], single, [single])]
                single = singles[next_single]
                next_single += 1
            else:
                big = heapq.heappop(heap)[2]
        else:
            big = heapq.heappop(heap)[2]
            if single_next():
                single = singles[next_single]
                next_single += 1
            else:
                small = heapq.heappop(heap)[2]
                if len(big) < len(small):
                    big, small = small, big
                next_id = _combine(big, small, num_parts, next_id)
                single = -1
        if single >= 0:
            weight = values[single]
            if len(big) < num_parts:  # the item takes an empty part
                insort(big, (weight, single, [single]))
            else:  # the item joins the lightest part
                low_weight, _, items = big.pop(0)
                items.append(single)
                insort(big, (low_weight + weight, next_id, items))
                next_id += 1
        low = big[0][0] if len(big) == num_parts else 0
        heapq.heappush(heap, (low - big[-1][0], -big[-1][0], big))
    if single_next():  # one item in all
        single = singles[next_single]
        final = [(values[single], single, [single])]
    else:
        final = heap[0][2]
    if len(values) > num_items:  # drop equal_count's zero-weight padding items
        final = [(weight, uid, [i for i in items if i < num_items]) for weight, uid, items in final]
    result = [sorted(items) for _, _, items in final]
    result += [[] for _ in range(num_parts - len(result))]
    return result


def greedy_lpt(weights: LengthsLike, num_parts: int, equal_count: bool = False) -> list[list[int]]:
    """Sorted greedy (longest processing time first): each item, largest first, to the lightest part.

    Args:
        weights: N non-negative ints (list or 1-D integer tensor).
        num_parts: k >= 1.
        equal_count: parts get floor(N/k) or ceil(N/k) items; the lightest part that may take one
            more item gets it (ties to the lower part). For N divisible by k that is the count
            guard of verl / MindSpeed-RL's heapq partitioner (which breaks ties by count first).

    Returns:
        k lists of item indices, each ascending.
    """
    values = as_length_list(weights, "weights")
    with gc_paused():
        _, parts, _ = lpt(values, _check_parts(num_parts), equal_count)
    for part in parts:
        part.sort()
    return parts


def lpt(
    weights: Sequence[int], num_parts: int, equal_count: bool = False
) -> tuple[list[int], list[list[int]], list[int]]:
    """Sorted greedy (LPT) in one pass over the items: ``(order, parts, loads)``.

    ``order`` lists the items heaviest first (ties by ascending index), ``parts[r]`` part r's items
    in that order (not sorted by index: callers that keep the plan sort it, callers that refine it
    need it in this order), ``loads[r]`` part r's total. Cost: one sort, then per item one
    ``heapreplace`` on plain ints and one append.
    """
    order = sorted(range(len(weights)), key=weights.__getitem__, reverse=True)
    if equal_count:
        parts, loads = _lpt_equal_counts(weights, order, num_parts)
    else:
        parts, loads = _lpt_free(weights, order, num_parts)
    return order, parts, loads


def _lpt_free(weights: Sequence[int], order: list[int], num_parts: int) -> tuple[list[list[int]], list[int]]:
    """LPT without count caps over ``order``: (items per part, loads)."""
    heap = list(range(num_parts))  # already a heap: every load is 0
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    _place(weights, order, heap, [part.append for part in parts])
    return parts, _loads(heap, num_parts)


def _place(
    weights: Sequence[int], items: list[int], heap: list[int], appends: list[Callable[[int], None]]
) -> None:
    """Each of ``items``, in turn, to the lightest part, unchecked: LPT's hot loop.

    The heap holds one int per part, ``load * k + part`` (ties go to the lower part, as with
    ``(load, part)`` tuples, and the ints stay small), so each item costs one ``heapreplace`` and
    one append: no tuples.
    """
    num_parts = len(appends)
    replace = heapq.heapreplace
    for index in items:
        # heap[0] is read before heapreplace pops it: the popped part gets load + weight back.
        appends[replace(heap, heap[0] + weights[index] * num_parts) % num_parts](index)


def _loads(heap: list[int], num_parts: int) -> list[int]:
    """Per-part loads from the ``load * k + part`` heap entries."""
    loads = [0] * num_parts
    for entry in heap:
        loads[entry % num_parts] = entry // num_parts
    return loads


# The equal-count LPT places items in unchecked runs while every part has room for at least this
# many more (and at least k: each run costs O(k) to size); below that, one by one with the check.
_MIN_RUN = 16


def _lpt_equal_counts(
    weights: Sequence[int], order: list[int], num_parts: int
) -> tuple[list[list[int]], list[int]]:
    """LPT over ``order`` where parts get floor(N/k) or ceil(N/k) items: (items per part, loads).

    The lightest part that may take one more item gets it (ties to the lower part). A part with
    ``room`` items to go below floor(N/k) cannot fill up within the next ``room`` items, so while
    every part has room, runs of that many items go through ``_place`` unchecked.
    """
    base, extra = divmod(len(order), num_parts)
    heap = list(range(num_parts))
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    appends = [part.append for part in parts]
    start, min_run = 0, max(_MIN_RUN, num_parts)
    while (room := base - max(map(len, parts))) >= min_run:
        _place(weights, order[start : start + room], heap, appends)
        start += room
    loads = [0] * num_parts
    full_slots = extra  # parts that may still reach base + 1 items
    replace, pop = heapq.heapreplace, heapq.heappop
    for index in order[start:]:
        entry = heap[0]
        part = entry % num_parts
        while len(parts[part]) >= base:  # rare: at most twice per part
            if len(parts[part]) == base and full_slots:  # it may take one more
                full_slots -= 1
                break
            loads[part] = pop(heap) // num_parts  # full: it leaves the heap
            entry = heap[0]
            part = entry % num_parts
        appends[part](index)
        replace(heap, entry + weights[index] * num_parts)
    for entry in heap:
        loads[entry % num_parts] = entry // num_parts
    return parts, loads


def sorted_lpt(
    weights: Sequence[int], num_parts: int
) -> tuple[list[int], list[int], list[list[int]], list[int]]:
    """Unconstrained LPT with items addressed by position in a weight-ascending order.

    Returns ``(order, ordered, parts, loads)``: ``order`` lists the items by ascending weight (ties
    by descending index: LPT walks it backwards), ``ordered`` their weights; ``parts[r]`` holds the
    positions in ``order`` of part r's items, ascending; ``loads[r]`` is part r's total.
    """
    descending, parts, loads = lpt(weights, num_parts)
    order = descending[::-1]
    position = [0] * len(order)
    for place, index in enumerate(order):
        position[index] = place
    positions = [[position[index] for index in reversed(part)] for part in parts]
    return order, [weights[i] for i in order], positions, loads


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
