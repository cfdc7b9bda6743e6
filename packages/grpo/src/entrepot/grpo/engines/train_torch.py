"""The torch training engine (`engine.train: torch`): an HF module, data parallel, on one device per rank.

`TorchTrainer` and `entrepot.grpo.engines.megatron.MegatronTrainer` are the two `TrainEngine`s an
actor rank holds (`engines.base`); the worker calls the same methods on either (log-probs, update,
state for checkpoints). `build_torch_side` is this engine's entry in `engines.registry`.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from entrepot.grpo.algo.optim import AdamW, LRSchedule, build_optimizer, total_optimizer_steps
from entrepot.grpo.algo.sequences import ResponseBatch
from entrepot.grpo.algo.update import DataParallel, UpdateInputs, compute_logprobs, ppo_update
from entrepot.grpo.config import AlgorithmConfig, BatchingConfig, GRPOConfig
from entrepot.grpo.embedded import checkpointing
from entrepot.grpo.engines.frozen import FrozenOnDemand
from entrepot.grpo.engines.manager import build_manager
from entrepot.grpo.engines.shared_weights import POLICY_TARGET, PolicyParameters, SameLayout

if TYPE_CHECKING:
    from entrepot.grpo.engines.specs import RolloutEngineSpec, TrainSide

__all__ = ["TorchTrainer", "build_torch_side"]


class TorchTrainer:
    """An HF causal LM, its frozen reference, AdamW and the LR schedule.

    Args:
        config: the run's config.
        model: the training module (on its device).
        reference: the frozen reference (a copy of the initial model, or `model.ref_model_load_path`),
            or None (kl_coef = 0, or a separate reference worker); offloaded outside its stage when
            `engine.reference_offloaded`.
        optimizer, scheduler: from `entrepot.grpo.algo.optim.build_optimizer`.
        pad_token_id: fill of padded grids.
        lanes: threads per micro-batch (`embedded.lanes.compute_lanes`).
    """

    is_last_stage = True
    tp_rank = 0

    def __init__(
        self,
        algorithm: AlgorithmConfig,
        batching: BatchingConfig,
        model: torch.nn.Module,
        reference: torch.nn.Module | None,
        optimizer: AdamW,
        scheduler: LRSchedule,
        pad_token_id: int,
        *,
        lanes: int = 1,
        offload_reference: bool = False,
    ) -> None:
        self.algorithm, self.batching = algorithm, batching
        self.model, self.reference = model, reference
        self.optimizer, self._scheduler, self.pad_token_id = optimizer, scheduler, pad_token_id
        self.dp: DataParallel | None = None  # `join_data_parallel` once torch.distributed is up
        self.lanes = lanes  # threads per micro-batch (entrepot.grpo.embedded.lanes)
        reference_params = [] if reference is None else list(reference.parameters())
        self.frozen_reference = FrozenOnDemand(reference_params, offload=offload_reference)

    def logprobs(
        self, batch: ResponseBatch, pass_name: str, *, reference: bool, temperature: float = 1.0
    ) -> torch.Tensor:
        model = self.reference if reference else self.model
        if model is None:
            raise RuntimeError("reference log-probs asked for but this rank holds no reference")
        with self.reference_resident() if reference else contextlib.nullcontext():
            return compute_logprobs(model, batch, self.batching, pass_name, pad_token_id=self.pad_token_id,
                                    lanes=self.lanes, temperature=temperature)  # fmt: skip

    def update(self, inputs: UpdateInputs) -> dict[str, float]:
        return ppo_update(self.model, self.optimizer, self._scheduler, inputs, self.algorithm, self.batching,
                          dp=self.dp, pad_token_id=self.pad_token_id, lanes=self.lanes)  # fmt: skip

    def named_parameters(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters())

    def named_reference(self) -> dict[str, torch.Tensor]:
        return {} if self.reference is None else dict(self.reference.named_parameters())

    @property
    def torch_optimizer(self) -> AdamW:
        return self.optimizer

    @property
    def scheduler(self) -> LRSchedule:
        return self._scheduler

    def reference_resident(self) -> contextlib.AbstractContextManager[None]:
        """The reference on the device inside the block; back in host memory after (offload_reference)."""
        return self.frozen_reference.resident()

    def join_data_parallel(self) -> None:
        """Sum gradients over the default process group's ranks (the engine's `start` made it)."""
        self.dp = DataParallel()

    def after_restore(self) -> None:
        """Nothing derived: HF ties weights by sharing one tensor."""

    def save_adapter(self, directory: str | Path) -> bool:
        """Write the LoRA adapter (peft's directory) when the policy has one; whether it did."""
        from entrepot.grpo.engines.lora import is_lora, save_adapter

        if not is_lora(self.model):
            return False
        save_adapter(self.model, directory)
        return True


def build_torch_side(
    config: GRPOConfig, model: torch.nn.Module, own_reference: torch.nn.Module | None, pad_token_id: int,
    run_dir: str | Path | None, rollout: RolloutEngineSpec, lanes: int,
) -> TrainSide:  # fmt: skip
    """The HF module trained in this process, and its rollout engine joined by a local layout conversion
    (or none: an engine that reads the module's parameters, `engines.shared_weights`)."""
    from entrepot.grpo.embedded.gpt2_model import hf_architecture
    from entrepot.resharding import LocalResharder
    from entrepot.resharding.adaptors import get_adaptor
    from entrepot.resharding.engines.torch import TorchTrainingEngine

    model.to(config.engine.device)
    reference = None
    if config.algorithm.kl_coef > 0 and config.resources.colocate:
        reference = own_reference if own_reference is not None else copy.deepcopy(model)
        dtype = getattr(torch, config.model.reference_dtype)  # float32 | bfloat16 (validated)
        reference = reference.to(config.engine.device, dtype=dtype).requires_grad_(False).eval()
    adaptor = get_adaptor(hf_architecture(model), model.config)
    engine, target = rollout.build(config, model, run_dir, True, lanes)
    trained, train_engine = model, TorchTrainingEngine(model, adaptor)
    if config.model.lora.enabled:  # adapters on a frozen copy; the rollout gets merged weights
        from entrepot.grpo.engines.lora import LoraTrainingEngine, apply_lora

        trained = apply_lora(model, config.model.lora)
        train_engine = LoraTrainingEngine(trained, adaptor)
    if config.engine.activation_checkpointing:  # the trained module only: the reference runs no_grad
        checkpointing.enable(trained)
    total_steps = total_optimizer_steps(config.max_steps, config.algorithm, config.rollout)
    optimizer, scheduler = build_optimizer(trained, config.algorithm, total_steps)
    trainer = TorchTrainer(
        config.algorithm, config.batching, trained, reference, optimizer, scheduler, pad_token_id,
        lanes=lanes, offload_reference=config.engine.reference_offloaded,
    )  # fmt: skip
    shared = target == POLICY_TARGET  # the engine reads `model`'s parameters: hand them over as they are
    weights_from = PolicyParameters(model) if shared else train_engine
    resharder = SameLayout() if shared else LocalResharder(adaptor, target)
    manager = build_manager(config.engine, weights_from, engine, resharder, list(trained.parameters()),
                            optimizer)  # fmt: skip
    return trainer, engine, manager
