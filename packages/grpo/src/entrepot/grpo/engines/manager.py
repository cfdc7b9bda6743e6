"""The `ShardingManager` of an actor rank: the training side, the rollout engine and the offload flags."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from entrepot.grpo.config import EngineConfig
    from entrepot.grpo.engines.base import RolloutEngine
    from entrepot.resharding import OptimizerState, ShardingManager

__all__ = ["build_manager"]


def build_manager(
    engine_config: EngineConfig, train_engine: Any, engine: RolloutEngine, resharder: Any,
    params: Sequence[torch.Tensor], optimizer: OptimizerState,
) -> ShardingManager:  # fmt: skip
    """The ShardingManager joining `train_engine` and `engine`, offloading what `engine.offload_*` asks."""
    from entrepot.resharding import Offloader, ShardingManager

    flags = engine_config
    return ShardingManager(
        train_engine, engine, resharder, Offloader(params, optimizer) if flags.offload_any else None,
        offload_train_params=flags.offload_params, offload_grads=flags.offload_grads,
        offload_optimizer=flags.offload_optimizer,
    )  # fmt: skip
