"""The model-parallel world of a megatron actor rank: torch.distributed and megatron-core's parallel state.

Called once per rank before `MegatronTrainer` is built (the rendezvous address comes from the
worker group, or a free local port for a single-process world).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from entrepot.grpo.algo.update import process_group_backend
from entrepot.grpo.config import TrainParallelConfig
from entrepot.grpo.engines.rendezvous import free_local_port, join_world

__all__ = ["init_model_parallel"]


def init_model_parallel(
    train: TrainParallelConfig, device_name: str, seed: int, rank: int, world_size: int, dist_init: str
) -> None:
    """torch.distributed (gloo on CPU; NCCL for GPU tensors) and megatron-core's parallel state at the
    `train` layout, on `device_name` (`engine.device`), model-parallel RNG seeded by `seed`."""
    from entrepot.resharding.engines.megatron import require_megatron
    from entrepot.resharding.engines.megatron_cpu import enable_cpu_mode

    require_megatron()
    device = torch.device(device_name)
    enable_cpu_mode(device)
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
    if not dist.is_initialized():
        init = dist_init or f"tcp://127.0.0.1:{free_local_port()}"
        backend = process_group_backend(device)
        join_world(backend, init, rank, world_size)
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    vpp = train.virtual_pipeline if (train.virtual_pipeline or 1) > 1 else None
    mpu.destroy_model_parallel()
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=train.tensor,
        pipeline_model_parallel_size=train.pipeline,
        virtual_pipeline_model_parallel_size=vpp,
    )
    model_parallel_cuda_manual_seed(seed)
