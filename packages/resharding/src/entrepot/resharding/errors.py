"""Exceptions of entrepot.resharding: one base, ``ReshardError``, and specific subclasses.

Every message names the offending value and what was allowed.
"""

from __future__ import annotations

from entrepot.resharding import _install

__all__ = [
    "BufferStateError",
    "ChecksumMismatchError",
    "EngineError",
    "LayoutError",
    "MissingExtraError",
    "ModeTransitionError",
    "OffloadStateError",
    "ReshardError",
    "ShapeMismatchError",
    "UnknownArchitectureError",
    "UnknownWeightError",
    "UnsupportedModelError",
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
        assert extra in _install.EXTRAS, f"{extra!r} is not one of {_install.EXTRAS}"
        super().__init__(f"{module} is not installed; install it with {_install.pip_install(extra)}")
        self.module = module
        self.extra = extra


class LayoutError(ReshardError, ValueError):
    """A parallel layout that is invalid or does not fit the world size / model."""


class BufferStateError(ReshardError):
    """A buffer operation called in the wrong state (destroyed, offloaded)."""


class UnknownWeightError(ReshardError, KeyError):
    """A weight name that the buffer or adaptor does not know."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class ShapeMismatchError(ReshardError, ValueError):
    """A tensor whose shape or dtype does not match what its slot or layout expects."""


class UnknownArchitectureError(ReshardError, KeyError):
    """No weight adaptor is registered for the requested architecture."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnsupportedModelError(ReshardError, ValueError):
    """A model config value an engine's recipe cannot build (a RoPE scaling type, an activation, a bias).

    The message names the config key, its value and what is allowed.
    """


class ChecksumMismatchError(ReshardError):
    """Checksum verification found resharded weights that differ from their source."""
