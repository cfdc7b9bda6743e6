"""entrepot.resharding — see the package README for what it provides."""

from entrepot.resharding._checksum import checksum, checksums
from entrepot.resharding._version import __version__
from entrepot.resharding.adaptors import (
    ParamSpec,
    WeightAdaptor,
    adaptor_for_config,
    get_adaptor,
    known_architectures,
    register_adaptor,
)
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
    UnsupportedModelError,
)
from entrepot.resharding.layout import ParallelLayout, RankCoords
from entrepot.resharding.manager import MODES, LocalResharder, ShardingManager, TransitionRecord
from entrepot.resharding.offload import Component, Offloader, OptimizerState
from entrepot.resharding.protocols import INFERENCE_TAGS, InferenceEngine, TrainingEngine, WeightResharder
from entrepot.resharding.resharder import Resharder, ReshardStats

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
    "OptimizerState",
    "ParallelLayout",
    "ParamSpec",
    "RankCoords",
    "ReshardError",
    "ReshardStats",
    "Resharder",
    "ShapeMismatchError",
    "ShardingManager",
    "TrainingEngine",
    "TransitionRecord",
    "UnknownArchitectureError",
    "UnknownWeightError",
    "UnsupportedModelError",
    "WeightAdaptor",
    "WeightResharder",
    "__version__",
    "adaptor_for_config",
    "checksum",
    "checksums",
    "get_adaptor",
    "known_architectures",
    "register_adaptor",
]
