"""What tests and tools read of an actor rank without changing it: memory, weights, gradients, runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from entrepot.grpo.engines.base import TrainEngine
    from entrepot.grpo.engines.policy import Policy
    from entrepot.grpo.workers._model_rewards import ModelRewards

__all__ = ["ActorInspection"]


class ActorInspection:
    """The actor's read-only inspection methods (a mixin of `ActorWorker`)."""

    policy: Policy
    trainer: TrainEngine
    model_rewards: ModelRewards | None

    def frozen_device_bytes(self) -> dict[str, int]:
        """Bytes the reference and the reward models hold on the device now (0 when offloaded)."""
        rewards = self.model_rewards.device_bytes() if self.model_rewards is not None else 0
        return {"reference": self.trainer.frozen_reference.device_bytes(), "reward_models": rewards}

    def parameters_digest(self) -> dict[str, torch.Tensor]:
        """A copy of this rank's trainable parameters (tests compare runs bit for bit)."""
        return {n: p.detach().cpu().clone() for n, p in self.trainer.named_parameters().items()}

    def gradients_digest(self) -> dict[str, torch.Tensor]:
        """A copy of every gradient of the last optimiser step (after clipping; torch engine)."""
        params = self.trainer.named_parameters().items()
        return {n: p.grad.detach().clone() for n, p in params if p.grad is not None}

    def runtime_info(self) -> dict[str, Any]:
        """Thread settings, the rollout engine and the Ray node (None without Ray) as this process sees
        them: tests check the Ray workers."""
        import os
        import sys

        ray = sys.modules.get("ray")  # loaded in a Ray worker; never imported here for this
        on_ray = ray is not None and ray.is_initialized()
        node_id = ray.get_runtime_context().get_node_id() if ray is not None and on_ray else None
        return {
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "torch_threads": torch.get_num_threads(),
            "pid": os.getpid(),
            "node_id": node_id,
            "rollout_tensor_parallel": self.policy.engine.tensor_parallel,
        }
