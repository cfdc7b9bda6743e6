"""Exchanges between parts that bring a partition's heaviest parts down to a target load (private).

Each part keeps its items sorted by weight (ascending), so "the item of part o whose weight is
closest to x" is one C-level bisection keyed by weight. A part above the target (excess e) trades
with a part below it (slack s), lightest first:

- a fix moves a weight d in [e, s]: both parts end at or under the target;
- failing that, a fill moves the largest d <= min(s, e - 1) found (a lone item moving: the first
  >= half of that; a swap: the first >= 7/8 of it, so that the light part fills up in one swap):
  the light part fills up and the heavy part, still above, goes on to the next lightest.

One pass over the heavy part's items looks for both (each item's partner is the light part's
lightest item weighing at least its weight - s). An item may also move alone unless the item
counts must stay. In parts of at most 64 items with fewer than 4 acceptable values of d (near the
end), each d is looked up exactly with set intersections; if no one-for-one swap fits with the 8
lightest parts, exchanges of up to two items each way with the 4 lightest are looked up the same
way (among each part's 16 lightest items; pair sums are far denser than single weights), then
one-for-one swaps with the other parts.

Every exchange lowers the sum of squared loads, so the loop ends; a budget of N / 2 + 64 probes bounds
its cost (runs that reach the target use well under half of it). The caller checks whether the target
was reached.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable
from itertools import islice

__all__ = ["refine_to_target"]

# With fewer acceptable gains than this, in heavy parts of at most _EXACT_ITEMS items, each gain is
# looked up exactly instead of probing heavy's items one by one; pairs are exchanged only then.
_EXACT_GAINS = 4
_EXACT_ITEMS = 64
# Exchanges of two items are looked up among this many of each part's lightest items (O(m^2) sums),
# with at most this many of the lightest parts.
_PAIR_ITEMS = 16
_PAIR_PARTNERS = 4
# Single-item exchanges are tried with this many of the lightest parts before pairs are.
_SINGLE_PARTNERS = 8
# A swap filling at least fill_high - fill_high // _FILL_SHARE is taken without looking further.
_FILL_SHARE = 8

Exchange = tuple[tuple[int, ...], tuple[int, ...]]  # items leaving heavy, items leaving light


class _Swapper:
    """Exchange search over one partition: weights by item, and each part's items by ascending weight."""

    def __init__(self, weights: list[int], parts: list[list[int]], allow_moves: bool) -> None:
        self.weights = weights
        self.key = weights.__getitem__
        self.parts = parts
        self.allow_moves = allow_moves
        self.budget = len(weights) // 2 + 64  # probes left before giving up
        self.versions = [0] * len(parts)  # bumped by every exchange: keys the caches below
        self.sums: dict[int, tuple[int, dict[int, tuple[int, ...]]]] = {}
        self.sets: dict[int, tuple[int, set[int]]] = {}
        self.lists: dict[int, tuple[int, list[int]]] = {}

    def heaviest_at_most(self, part: list[int], value: int) -> int:
        """Index in ``part`` of its heaviest item weighing at most ``value`` (-1 if none)."""
        return bisect_right(part, value, key=self.key) - 1

    def move(self, heavy: int, low: int, high: int) -> Exchange | None:
        """One item of heavy weighing in [low, high], the heaviest such, moving alone."""
        part = self.parts[heavy]
        index = self.heaviest_at_most(part, high)
        if index >= 0 and self.weights[part[index]] >= low:
            return (part[index],), ()
        return None

    def probe(self, heavy: int, light: int, fix_low: int, fill_high: int, slack: int) -> Exchange | None:
        """One pass over heavy's items (lightest first: the densest weights) for a fix, else a fill.

        Each item's partner is light's lightest item weighing at least weight - slack: the largest
        gain <= slack that item can make. A gain >= ``fix_low`` (0: not looked for) is taken at
        once; otherwise the largest gain <= ``fill_high`` is kept, and taken at once once it
        reaches 7/8 of ``fill_high`` if no fix is looked for (half took twice the swaps when
        counts are kept: 65 instead of 33 for 2,048 bimodal lengths over 32 ranks).
        """
        weights, key, source, target = self.weights, self.key, self.parts[heavy], self.parts[light]
        size = len(target)
        good = fill_high - fill_high // _FILL_SHARE if not fix_low else fill_high + 1
        best: Exchange | None = None
        best_gain = 0
        previous = -1
        budget = self.budget
        for item in source:
            weight = weights[item]
            if weight == previous or weight <= 0:
                continue
            previous = weight
            budget -= 1
            partner = bisect_left(target, weight - slack, key=key)
            if partner < size:
                gain = weight - weights[target[partner]]
                if fix_low and gain >= fix_low:
                    self.budget = budget
                    return (item,), (target[partner],)
                if best_gain < gain <= fill_high:
                    best, best_gain = ((item,), (target[partner],)), gain
                    if gain >= good:
                        break
            if budget <= 0:
                break
        self.budget = budget
        return best

    def exact(self, heavy: int, light: int, gains: range) -> Exchange | None:
        """A one-for-one swap moving the first of ``gains`` that any such swap moves.

        One C-level set intersection per gain (heavy's weights with light's shifted by the gain):
        cheaper than probing every heavy item when only a few gains are acceptable, as near the end.
        """
        source, target = self.parts[heavy], self.parts[light]
        heavy_weights, light_weights = self.weight_set(heavy), self.weight_list(light)
        for gain in gains:
            self.budget -= 2
            if hits := heavy_weights.intersection(map(gain.__radd__, light_weights)):
                weight = min(hits)
                index, partner = (
                    self.heaviest_at_most(source, weight),
                    self.heaviest_at_most(target, weight - gain),
                )
                return (source[index],), (target[partner],)
        return None

    def weight_set(self, part: int) -> set[int]:
        """The distinct weights of ``part`` (cached until the part changes)."""
        cached = self.sets.get(part)
        if cached is None or cached[0] != self.versions[part]:
            cached = self.sets[part] = (
                self.versions[part],
                set(map(self.weights.__getitem__, self.parts[part])),
            )
        return cached[1]

    def weight_list(self, part: int) -> list[int]:
        """The weights of ``part``'s items in order (cached until the part changes)."""
        cached = self.lists.get(part)
        if cached is None or cached[0] != self.versions[part]:
            cached = self.lists[part] = (
                self.versions[part],
                list(map(self.weights.__getitem__, self.parts[part])),
            )
        return cached[1]

    def subset_sums(self, part: int) -> dict[int, tuple[int, ...]]:
        """Total weight -> items, for every pair (and, with moves, every single item) among the
        _PAIR_ITEMS lightest items of ``part`` (cached until the part changes).

        The lightest items have the densest weights, so their sums cover small gains best. Without
        moves, only pairs: a pair for a pair keeps the counts (one-for-one is searched apart).
        """
        cached = self.sums.get(part)
        if cached is not None and cached[0] == self.versions[part]:
            return cached[1]
        weights, positions = self.weights, self.parts[part][:_PAIR_ITEMS]
        self.budget -= len(positions) * len(positions) // 32 + 1
        sums: dict[int, tuple[int, ...]] = {
            weights[p] + weights[q]: (p, q) for i, p in enumerate(positions) for q in positions[i + 1 :]
        }
        if self.allow_moves:
            sums.update({weights[p]: (p,) for p in positions})
        self.sums[part] = (self.versions[part], sums)
        return sums

    def exchange(self, heavy: int, light: int, gains: range) -> Exchange | None:
        """An exchange of up to two items each way moving the first of ``gains`` any such exchange moves."""
        heavy_sums, light_sums = self.subset_sums(heavy), self.subset_sums(light)
        for gain in gains:
            self.budget -= len(heavy_sums) // 64 + 1
            if not light_sums.keys().isdisjoint(map(gain.__rsub__, heavy_sums)):
                return next(
                    (out, light_sums[total - gain])
                    for total, out in heavy_sums.items()
                    if total - gain in light_sums
                )
            if self.allow_moves and gain in heavy_sums:  # heavy's items move alone
                return heavy_sums[gain], ()
        return None

    def find(self, heavy: int, light: int, excess: int, slack: int) -> Exchange | None:
        """The exchange to make between ``heavy`` and ``light``, or None.

        One moving a weight in [excess, slack] (a fix) sets ``heavy`` at or under the target;
        failing that, a fill moves the largest weight found <= min(slack, excess - 1), which keeps
        ``light`` at or under the target and ``heavy`` above it.
        """
        fix_low = excess if excess <= slack else 0
        fill_high = min(slack, excess - 1)
        if self.allow_moves and (
            (fix_low and (found := self.move(heavy, excess, slack)))
            or (fill_high >= 1 and (found := self.move(heavy, (fill_high + 1) // 2, fill_high)))
        ):
            return found
        if len(self.parts[heavy]) <= _EXACT_ITEMS:  # few gains acceptable: look each up exactly
            if fix_low and slack - excess < _EXACT_GAINS:
                if found := self.exact(heavy, light, range(excess, slack + 1)):
                    return found
                fix_low = 0
            if not fix_low and fill_high < _EXACT_GAINS:
                return self.exact(heavy, light, range(fill_high, 0, -1))
        return self.probe(heavy, light, fix_low, fill_high, slack)

    def apply(self, heavy: int, light: int, found: Exchange) -> int:
        """Make the exchange; returns the weight that moved from ``heavy`` to ``light``."""
        weights, key, source, target = self.weights, self.key, self.parts[heavy], self.parts[light]
        self.versions[heavy] += 1
        self.versions[light] += 1
        leaving, coming = found
        moved = 0
        for item in leaving:
            weight = weights[item]
            source.remove(item)
            target.insert(bisect_right(target, weight, key=key), item)
            moved += weight
        for item in coming:
            weight = weights[item]
            target.remove(item)
            source.insert(bisect_right(source, weight, key=key), item)
            moved -= weight
        return moved


def _one_for_one(
    swapper: _Swapper, lights: Iterable[int], loads: list[int], heavy: int, target: int
) -> tuple[int, Exchange] | None:
    """(light part, exchange of single items) with the first of ``lights`` that has one, or None."""
    excess = loads[heavy] - target
    for light in lights:
        slack = target - loads[light]
        if slack <= 0 or swapper.budget <= 0:  # parts further on are no lighter
            return None
        if found := swapper.find(heavy, light, excess, slack):
            return light, found
    return None


def _two_for_two(
    swapper: _Swapper, lights: Iterable[int], loads: list[int], heavy: int, target: int
) -> tuple[int, Exchange] | None:
    """(light part, exchange of up to two items each way) fixing ``heavy`` in one go, or None."""
    excess = loads[heavy] - target
    for light in lights:
        slack = target - loads[light]
        if slack < excess or swapper.budget <= 0:
            return None
        gains = range(excess, min(slack, excess + _EXACT_GAINS - 1) + 1)
        if found := swapper.exchange(heavy, light, gains):
            return light, found
    return None


def _next_exchange(
    swapper: _Swapper, keyed: list[int], loads: list[int], heavy: int, target: int
) -> tuple[int, Exchange] | None:
    """(light part, exchange) lowering ``heavy``, lightest parts first, or None.

    Single items with the _SINGLE_PARTNERS lightest parts first; then, near the end (few gains
    acceptable, single weights rarely differing by one of them), up to two items each way with
    the _PAIR_PARTNERS lightest; then single items with the rest.
    """
    part_of = len(loads).__rmod__  # keyed entries are load * k + part
    return (
        _one_for_one(swapper, map(part_of, islice(keyed, _SINGLE_PARTNERS)), loads, heavy, target)
        or _two_for_two(swapper, map(part_of, islice(keyed, _PAIR_PARTNERS)), loads, heavy, target)
        or _one_for_one(swapper, map(part_of, islice(keyed, _SINGLE_PARTNERS, None)), loads, heavy, target)
    )


def refine_to_target(
    weights: list[int], parts: list[list[int]], loads: list[int], target: int, allow_moves: bool
) -> int:
    """Lower every part to at most ``target`` by exchanges (it may fall short); how many were made.

    Args:
        weights: item weights (an item is its index here).
        parts: item indices per part, by ascending weight; updated in place.
        loads: total per part; updated in place.
        target: the load no part should exceed (a lower bound on the best plan's heaviest part).
        allow_moves: whether an exchange may change item counts (False keeps them).
    """
    num_parts = len(loads)
    swapper = _Swapper(weights, parts, allow_moves)
    keyed = sorted(load * num_parts + part for part, load in enumerate(loads))  # lightest first
    changes = 0
    while True:
        heavy = keyed[-1] % num_parts
        excess = loads[heavy] - target
        if excess <= 0:
            return changes
        found = _next_exchange(swapper, keyed, loads, heavy, target)
        if found is None:
            return changes
        light, exchange = found
        moved = swapper.apply(heavy, light, exchange)
        keyed.pop()  # heavy's entry, the last
        keyed.remove(loads[light] * num_parts + light)
        loads[heavy] -= moved
        loads[light] += moved
        insort(keyed, loads[heavy] * num_parts + heavy)
        insort(keyed, loads[light] * num_parts + light)
        changes += 1
