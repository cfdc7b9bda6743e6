"""Typed errors for entrepot.batching: one base class, one subclass per kind of mistake."""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "BatchingError",
    "InvalidArgumentError",
    "InvalidLengthError",
    "LengthMismatchError",
    "SequenceTooLongError",
]


class BatchingError(ValueError):
    """Base class of every error raised by entrepot.batching (a ``ValueError``: the input was wrong)."""


class InvalidLengthError(BatchingError):
    """A length is negative, not an integer, or the lengths are not a flat list / 1-D tensor."""


class LengthMismatchError(BatchingError):
    """Lengths disagree with the data they describe (sum, count, padded width or column)."""


class InvalidArgumentError(BatchingError):
    """A parameter (budget, rank count, group size, alignment, mode) is outside what is allowed."""


class SequenceTooLongError(BatchingError):
    """One sequence alone is longer than the per-micro-batch token budget.

    Attributes:
        index: position of the sequence in the input.
        length: its number of tokens.
        budget: the ``max_token_len`` it was checked against.
    """

    def __init__(self, index: int, length: int, budget: int) -> None:
        self.index = index
        self.length = length
        self.budget = budget
        super().__init__(
            f"sequence {index} has {length} tokens, more than max_token_len={budget}; "
            f"raise max_token_len to at least {length} or truncate the sequence"
        )


class BackendUnavailableError(BatchingError):
    """An attention backend was requested that is not installed or does not fit the inputs."""
