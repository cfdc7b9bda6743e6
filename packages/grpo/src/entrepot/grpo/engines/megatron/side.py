"""The megatron actor rank's training side: its chunks, resharded every rollout into whole weights."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from entrepot.grpo.engines.manager import build_manager

if TYPE_CHECKING:
    from entrepot.grpo.config import GRPOConfig
    from entrepot.grpo.engines.specs import RolloutEngineSpec, TrainSide

__all__ = ["build_megatron_side"]


def build_megatron_side(
    config: GRPOConfig, model: torch.nn.Module, own_reference: torch.nn.Module | None, pad_token_id: int,
    run_dir: str | Path | None, rollout: RolloutEngineSpec, lanes: int,
) -> TrainSide:  # fmt: skip
    """megatron-core chunks of this rank, resharded every rollout into whole weights for the engine."""
    from entrepot.grpo.engines.megatron import MegatronTrainer
    from entrepot.resharding import ParallelLayout, Resharder

    trainer = MegatronTrainer(config, model, own_reference)
    # Whole weights on every rank: a tensor-parallel vLLM keeps its slice of each through its own
    # checkpoint loader (on CPU it repacks linear weights for its kernels, so shards cannot be copied in).
    resharder = Resharder(
        trainer.adaptor, trainer.train_engine.layout, ParallelLayout(tp=1),
        bucket_bytes=config.engine.reshard_bucket_mb * 2**20, verify=config.engine.reshard_verify,
        device=config.engine.device,
    )  # fmt: skip
    model.requires_grad_(False).eval()  # the HF copy only generates (non-GPT-2 architectures)
    engine, _ = rollout.build(config, model, run_dir, False, lanes)
    params = [p for chunk in trainer.chunks for p in chunk.parameters()]
    manager = build_manager(config.engine, trainer.train_engine, engine, resharder, params,
                            trainer.torch_optimizer)  # fmt: skip
    return trainer, engine, manager
