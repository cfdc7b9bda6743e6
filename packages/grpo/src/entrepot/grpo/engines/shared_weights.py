"""The infer-mode switch when the rollout engine reads the policy's own parameters (no second copy).

A rollout engine that holds references to the trained module's parameters (its build answers the
target ``"policy"``, e.g. `engines.rollout_llama` in one process) needs no resharding: the
`ShardingManager` joins it to `PolicyParameters`, which names the module's parameters by their HF
names, and `SameLayout`, which passes them on as they are. Entering infer mode then converts and
copies nothing; the engine's `load_weights` sees its own tensors. The optimizer updates them in
place, so the next rollout samples from the last update's weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from entrepot.resharding.engines.torch import TorchTrainingEngine

__all__ = ["POLICY_TARGET", "PolicyParameters", "SameLayout"]

POLICY_TARGET = "policy"
"""The layout target of an engine that reads the policy module's parameters."""


class PolicyParameters(TorchTrainingEngine):
    """A single-process HF module as the manager's `TrainingEngine`, its parameters by HF name (detached
    views: no conversion to the training layout)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__(module, adaptor=None)

    def named_train_parameters(self) -> dict[str, torch.Tensor]:
        """The module's parameters by HF name (a tied head once)."""
        return {name: p.detach() for name, p in self.module.named_parameters()}


class SameLayout:
    """A `WeightResharder` whose two layouts are one: the weights pass through unchanged."""

    def reshard(self, local_train_params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(local_train_params)

    def destroy_buffers(self) -> None:
        """Nothing was made."""
