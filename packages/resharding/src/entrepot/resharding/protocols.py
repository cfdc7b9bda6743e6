"""The small protocols through which engines plug into a ``ShardingManager``.

A training engine exposes its parameters in the *training layout* (megatron-core GPTModel
names, this rank's TP/PP/EP shard) plus its ``ParallelLayout``; an inference engine takes
weights in the *inference layout* (vLLM-style fused names, this rank's shard) and can
release and re-acquire its memory in stages. A resharder turns one into the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch

from entrepot.resharding.layout import ParallelLayout

__all__ = ["INFERENCE_TAGS", "InferenceEngine", "TrainingEngine", "WeightResharder"]

# What an inference engine can onload separately: weights first, then the KV cache (vLLM's
# wake_up tags), so the weights can be written before the cache takes the rest of the memory.
INFERENCE_TAGS: tuple[str, ...] = ("weights", "kv_cache")


@runtime_checkable
class TrainingEngine(Protocol):
    """A training engine: this rank's parameters in training layout and its parallel layout."""

    @property
    def layout(self) -> ParallelLayout:
        """The training parallel layout (TP, PP, EP, VPP)."""
        ...

    @property
    def device(self) -> torch.device:
        """The device the training parameters live on (where memory is measured)."""
        ...

    def named_train_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's parameters keyed by training-layout (megatron-core) names."""
        ...


@runtime_checkable
class InferenceEngine(Protocol):
    """An inference engine that takes inference-layout weights and can free its memory."""

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy this rank's inference-layout weights into the engine, in place."""
        ...

    def offload(self) -> None:
        """Release the engine's device memory: weights and KV cache."""
        ...

    def onload(self, tags: Sequence[str] = INFERENCE_TAGS) -> None:
        """Re-acquire the memory for ``tags`` (a subset of ``INFERENCE_TAGS``)."""
        ...

    def resident_bytes(self) -> int:
        """Device bytes the engine holds now (weights + KV cache), for memory records."""
        ...


@runtime_checkable
class WeightResharder(Protocol):
    """Turns this rank's training-layout parameters into this rank's inference shard.

    ``entrepot.resharding.Resharder`` implements it with collectives; ``LocalResharder``
    does it without communication when every layout is TP=PP=EP=1.
    """

    def reshard(self, local_train_params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Return this rank's inference-layout weights."""
        ...

    def destroy_buffers(self) -> None:
        """Free the memory behind the last ``reshard`` result (the engine has copied it)."""
        ...
