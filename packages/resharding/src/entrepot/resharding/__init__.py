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
from entrepot.resharding.manager import MODES, LocalResharder, ShardingManager, TransitionRecord
from entrepot.resharding.offload import Component, Offloader
from entrepot.resharding.protocols import INFERENCE_TAGS, InferenceEngine, TrainingEngine, WeightResharder

__all__ = [
    "INFERENCE_TAGS",
    "MODES",
    "BufferStateError",
    "ChecksumMismatchError",
    "Component",
    "EngineError",
    "InferenceEngine",
    "LayoutError",
    "LocalResharder",
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
    "ShardingManager",
    "TrainingEngine",
    "TransitionRecord",
    "UnknownArchitectureError",
    "UnknownWeightError",
    "WeightResharder",
    "__version__",
]
