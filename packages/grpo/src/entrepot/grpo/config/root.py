"""`GRPOConfig`: the whole run, one field per section, validated on construction.

`GRPOConfig()` is the embedded default: reverse an 8-digit string with a ~100k-parameter GPT-2-style
decoder on CPU. Each section checks its own fields; `__post_init__` runs the checks across sections
(`entrepot.grpo.config.checks`). What depends on this machine or the environment (whether the run
uses Ray, threads per micro-batch) is decided in `entrepot.grpo.run.deployment`; what depends on the
synthetic tasks' token lengths is checked by `entrepot.grpo.data.checks` before a run starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath

from entrepot.grpo.config import checks
from entrepot.grpo.config.algorithm import AlgorithmConfig
from entrepot.grpo.config.audit import AuditConfig
from entrepot.grpo.config.batching import BatchingConfig
from entrepot.grpo.config.engine import EngineConfig, ParallelConfig
from entrepot.grpo.config.fields import check, doc
from entrepot.grpo.config.model import DataConfig, ModelConfig
from entrepot.grpo.config.multiturn import MultiTurnConfig
from entrepot.grpo.config.resources import DockConfig, ResourcesConfig, ThreadsConfig
from entrepot.grpo.config.reward import RewardConfig
from entrepot.grpo.config.rollout import RolloutConfig
from entrepot.grpo.config.run import CheckpointConfig, EvalConfig, LoggingConfig
from entrepot.grpo.config.trainer import TrainerConfig

__all__ = ["GRPOConfig"]


@dataclass(kw_only=True)
class GRPOConfig:
    """The whole run. `GRPOConfig()` is the embedded default (reverse 8 digits on CPU)."""

    name: str | None = field(
        default=None,
        metadata=doc(
            "Run name (prefix of the run directory the CLI creates); null = grpo-<model.path's folder>-"
            "<data.train_path's stem or data.task>, e.g. grpo-reverse, grpo-smollm2-train."
        ),
    )
    seed: int = field(default=0, metadata=doc("Seed of model init, data order and sampling."))
    max_steps: int = field(default=300, metadata=doc("GRPO steps to run."))
    model: ModelConfig = field(default_factory=ModelConfig, metadata=doc("Policy model."))
    data: DataConfig = field(default_factory=DataConfig, metadata=doc("Prompts and answers."))
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata=doc("Sampling."))
    algorithm: AlgorithmConfig = field(
        default_factory=AlgorithmConfig, metadata=doc("Objective and optimiser.")
    )
    reward: RewardConfig = field(default_factory=RewardConfig, metadata=doc("Rule verifiers."))
    engine: EngineConfig = field(default_factory=EngineConfig, metadata=doc("Engines and device."))
    parallel: ParallelConfig = field(default_factory=ParallelConfig, metadata=doc("TP / PP layouts."))
    batching: BatchingConfig = field(default_factory=BatchingConfig, metadata=doc("Micro-batching."))
    resources: ResourcesConfig = field(default_factory=ResourcesConfig, metadata=doc("Workers."))
    dock: DockConfig = field(default_factory=DockConfig, metadata=doc("The experience dock on Ray."))
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig, metadata=doc("Checkpoints."))
    eval: EvalConfig = field(default_factory=EvalConfig, metadata=doc("Evaluation."))
    audit: AuditConfig = field(default_factory=AuditConfig, metadata=doc("Reward-hacking audit."))
    logging: LoggingConfig = field(default_factory=LoggingConfig, metadata=doc("Metrics output."))
    threads: ThreadsConfig = field(default_factory=ThreadsConfig, metadata=doc("Threads per process."))
    trainer: TrainerConfig = field(
        default_factory=TrainerConfig, metadata=doc("Synchronous or asynchronous training.")
    )

    multiturn: MultiTurnConfig = field(
        default_factory=MultiTurnConfig, metadata=doc("Multi-turn rollouts with an environment.")
    )

    def __post_init__(self) -> None:
        check(self.max_steps >= 1, "max_steps", self.max_steps, ">= 1")
        if self.name is not None:
            check(bool(self.name) and "/" not in self.name, "name", self.name, "a non-empty name without '/'")
        checks.check_reference(self.model, self.algorithm)
        checks.check_model_source(self.model, self.data)
        checks.check_task_reward(self.data, self.reward)
        checks.check_batches(self.rollout, self.algorithm)
        checks.check_workers(self.rollout, self.resources, self.dock)
        checks.check_colocation(self.resources, self.engine)
        checks.check_parallel(self.parallel, self.engine, self.resources)
        checks.check_layout_fits_model(self.parallel.train, self.model)
        checks.check_rollout_engine(self.engine, self.model)
        checks.check_partial_rollout(self.rollout, self.algorithm, self.parallel, self.trainer)
        checks.check_truncation_mask(self.rollout, self.algorithm)
        checks.check_lora(self.model, self.engine)
        checks.check_memory_savers(self.model, self.engine)
        checks.check_rollout_dtype(self.engine, self.rollout, self.algorithm, self.trainer)
        checks.check_async(self.trainer, self.resources, self.parallel, self.rollout, self.algorithm,
                           self.reward, self.model)  # fmt: skip
        checks.check_judge(self.reward, self.model, self.algorithm)
        checks.check_multiturn(self.multiturn, self.rollout, self.algorithm, self.parallel, self.data,
                               self.reward)  # fmt: skip
        checks.check_distill(self.algorithm, self.engine, self.trainer, self.rollout, self.parallel)

    @property
    def run_name(self) -> str:
        """`name`, or one taken from the model and the data: a jsonl run on a local model is not
        called after the default task (`grpo-smollm2-train`, not `grpo-reverse`)."""
        if self.name is not None:
            return self.name
        parts = ["grpo"]
        if self.model.path is not None:
            parts.append(PurePath(self.model.path).name)
        parts.append(PurePath(self.data.train_path).stem if self.data.train_path else self.data.task)
        return "-".join(part for part in parts if part)
