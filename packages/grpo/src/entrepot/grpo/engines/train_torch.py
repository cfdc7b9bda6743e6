"""The torch training engine (`engine.train: torch`): an HF module, data parallel, on one device per rank.

`TorchTrainer` and `entrepot.grpo.engines.megatron.MegatronTrainer` are the two `Trainer`s an actor rank
holds; the worker calls the same methods on either (log-probs, update, state for checkpoints).
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import torch

from entrepot.grpo.algo.optim import AdamW, LRSchedule
from entrepot.grpo.algo.sequences import ResponseBatch
from entrepot.grpo.algo.update import DataParallel, UpdateInputs, compute_logprobs, ppo_update
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.engines.frozen import FrozenOnDemand

__all__ = ["TorchTrainer", "Trainer"]


class Trainer(Protocol):
    """What the actor worker needs of a training engine."""

    is_last_stage: bool  # this rank computes the log-probs (the last pipeline stage)
    tp_rank: int
    frozen_reference: FrozenOnDemand  # the reference's parameters (none without one), offloaded or not

    def logprobs(self, batch: ResponseBatch, pass_name: str, *, reference: bool) -> torch.Tensor | None:
        """Log-probs [R] of the response tokens (None on ranks that do not compute them)."""
        ...

    def update(self, inputs: UpdateInputs) -> dict[str, float]:
        """The PPO-clip update of one step; mean diagnostics."""
        ...

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's trainable parameters by name."""
        ...

    def named_reference(self) -> dict[str, torch.Tensor]:
        """This rank's reference parameters by name (empty without a reference)."""
        ...

    @property
    def torch_optimizer(self) -> AdamW | torch.optim.Optimizer:
        """The optimizer holding the moments (checkpoints save its state)."""
        ...

    @property
    def scheduler(self) -> LRSchedule | torch.optim.lr_scheduler.LRScheduler:
        """The LR schedule."""
        ...

    def after_restore(self) -> None:
        """Re-derive state that follows from the parameters after a checkpoint is loaded."""
        ...

    def reference_resident(self) -> contextlib.AbstractContextManager[None]:
        """The reference's parameters on the device inside the block (checkpoints read and write them)."""
        ...


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
    """

    is_last_stage = True
    tp_rank = 0

    def __init__(
        self,
        config: GRPOConfig,
        model: torch.nn.Module,
        reference: torch.nn.Module | None,
        optimizer: AdamW,
        scheduler: LRSchedule,
        pad_token_id: int,
    ) -> None:
        self.config, self.model, self.reference = config, model, reference
        self.optimizer, self._scheduler, self.pad_token_id = optimizer, scheduler, pad_token_id
        self.dp: DataParallel | None = None  # set by the worker once torch.distributed is up
        self.lanes = config.compute_lanes()  # threads per micro-batch (entrepot.grpo.embedded.lanes)
        reference_params = [] if reference is None else list(reference.parameters())
        self.frozen_reference = FrozenOnDemand(reference_params, offload=config.engine.reference_offloaded)

    def logprobs(self, batch: ResponseBatch, pass_name: str, *, reference: bool) -> torch.Tensor:
        model = self.reference if reference else self.model
        if model is None:
            raise RuntimeError("reference log-probs asked for but this rank holds no reference")
        with self.reference_resident() if reference else contextlib.nullcontext():
            return compute_logprobs(model, batch, self.config.batching, pass_name,
                                    pad_token_id=self.pad_token_id, lanes=self.lanes)  # fmt: skip

    def update(self, inputs: UpdateInputs) -> dict[str, float]:
        cfg = self.config
        return ppo_update(self.model, self.optimizer, self._scheduler, inputs, cfg.algorithm, cfg.batching,
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

    def after_restore(self) -> None:
        """Nothing derived: HF ties weights by sharing one tensor."""
