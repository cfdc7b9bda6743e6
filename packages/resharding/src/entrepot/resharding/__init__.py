"""entrepot.resharding — see the package README for what it provides."""

from entrepot.resharding._version import __version__
from entrepot.resharding.buffers import MemoryBuffer, ModelWeightBuffer
from entrepot.resharding.errors import (
    BufferStateError,
    ChecksumMismatchError,
    EngineError,
    LayoutError,
    MissingExtraError,
    ModeTransitionError,
    OffloadStateError,
    ReshardError,
    ShapeMismatchError,
    UnknownArchitectureError,
    UnknownWeightError,
)
from entrepot.resharding.layout import ParallelLayout, RankCoords
from entrepot.resharding.offload import Component, Offloader

__all__ = [
    "BufferStateError",
    "ChecksumMismatchError",
    "Component",
    "EngineError",
    "LayoutError",
    "MemoryBuffer",
    "MissingExtraError",
    "ModeTransitionError",
    "ModelWeightBuffer",
    "OffloadStateError",
    "Offloader",
    "ParallelLayout",
    "RankCoords",
    "ReshardError",
    "ShapeMismatchError",
    "UnknownArchitectureError",
    "UnknownWeightError",
    "__version__",
]
