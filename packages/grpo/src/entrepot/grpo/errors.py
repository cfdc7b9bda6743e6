"""Exception types of entrepot.grpo: one base class, one subclass per kind of mistake."""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "DataError",
    "GRPOConfigError",
    "GRPOError",
    "RewardError",
    "UnknownRewardError",
]


class GRPOError(Exception):
    """Base class of every error raised by entrepot.grpo."""


class GRPOConfigError(GRPOError, ValueError):
    """A configuration key has a wrong type, an impossible value, or does not exist.

    The message always names the dotted key, the offending value and what is allowed.
    """


class DataError(GRPOError, ValueError):
    """A prompt file or model directory is missing, malformed, or lacks a configured field."""


class RewardError(GRPOError, ValueError):
    """A reward verifier could not be registered, resolved or applied."""


class UnknownRewardError(RewardError, KeyError):
    """A reward name is not in the registry; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CheckpointError(GRPOError, RuntimeError):
    """A checkpoint directory is missing, incomplete, or does not match the configuration."""
