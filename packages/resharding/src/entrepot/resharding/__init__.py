"""entrepot.resharding — see the package README for what it provides."""

from entrepot.resharding._version import __version__
from entrepot.resharding.errors import (
    EngineError,
    MissingExtraError,
    ModeTransitionError,
    OffloadStateError,
    ReshardError,
)
from entrepot.resharding.offload import Component, Offloader

__all__ = [
    "Component",
    "EngineError",
    "MissingExtraError",
    "ModeTransitionError",
    "OffloadStateError",
    "Offloader",
    "ReshardError",
    "__version__",
]
