"""The two specs a get takes past its common arguments: how it samples rows, how it pads them.

    dock.get("actor_train", cols, 224, groups=True, sampler=Sampler(kind="balanced", num_ranks=4))
    dock.get("ref", ["tokens"], 32, padding=Padding(value=-1, multiple=4))

Most gets want neither (FIFO rows, zero padding to the longest row), so they are grouped here
instead of being four more keyword arguments of every get, on every client.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Literal

from entrepot.dock._errors import InvalidArgumentError

SamplerKind = Literal["fifo", "random", "balanced"]
SAMPLER_KINDS = ("fifo", "random", "balanced")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class Sampler:
    """Which ready rows a get takes, and in what order.

    Attributes:
        kind: "fifo" (lowest rows first), "random" (seeded per consumer; its position is saved by
            `state_dict`), or "balanced" (FIFO rows reordered so that `batch.split(num_ranks)` gives
            the DP ranks near-equal tokens; needs `min_count == count`).
        num_ranks: DP ranks the balanced sampler splits for; a get's `count` must be a multiple of
            `num_ranks` x the group size.
    """

    kind: SamplerKind = "fifo"
    num_ranks: int = 1

    def __post_init__(self) -> None:
        if self.kind not in SAMPLER_KINDS:
            raise InvalidArgumentError(
                f"sampler kind must be one of {SAMPLER_KINDS}, got {self.kind!r}", "sampler"
            )
        if not _is_int(self.num_ranks) or self.num_ranks < 1:
            raise InvalidArgumentError(
                f"sampler num_ranks must be an int >= 1, got {self.num_ranks!r}", "sampler"
            )


@dataclass(frozen=True, kw_only=True)
class Padding:
    """How the padded layout fills its rows (the packed layout has no padding and ignores it).

    Attributes:
        value: fill value past each row's valid elements (a get checks that each padded column's
        dtype holds it exactly, e.g. no NaN or 1e30 in an int64 column).
        multiple: padded widths are rounded up to a multiple of this (e.g. TP x CP size).
    """

    value: float = 0
    multiple: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, numbers.Real):
            raise InvalidArgumentError(f"padding value must be a number, got {self.value!r}", "padding")
        if not _is_int(self.multiple) or self.multiple < 1:
            raise InvalidArgumentError(
                f"padding multiple must be an int >= 1, got {self.multiple!r}", "padding"
            )


FIFO = Sampler()
"""The default sampler: lowest rows first."""

ZERO_PADDING = Padding()
"""The default padding: zeros, to the longest row."""
