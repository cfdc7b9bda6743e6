"""Exceptions of entrepot.resharding: one base, ``ReshardError``, and specific subclasses.

Every message names the offending value and what was allowed.
"""

from __future__ import annotations

__all__ = [
    "EngineError",
    "MissingExtraError",
    "ModeTransitionError",
    "OffloadStateError",
    "ReshardError",
]


class ReshardError(Exception):
    """Base class of every error raised by entrepot.resharding."""


class OffloadStateError(ReshardError):
    """An offload/onload call that does not fit the component's current state."""


class ModeTransitionError(ReshardError):
    """A ShardingManager transition requested from a mode that does not allow it."""


class EngineError(ReshardError):
    """An engine adapter got weights or settings it cannot take (unknown name, bad shape)."""


class MissingExtraError(ReshardError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"{module} is not installed; install it with `pip install entrepot-resharding[{extra}]`"
        )
        self.module = module
        self.extra = extra
