"""Typed GRPO configuration: kw_only dataclasses, validated on construction, loaded from YAML.

`GRPOConfig()` is the embedded default: reverse an 8-digit string with a ~100k-parameter GPT-2-style
decoder on CPU. A YAML file maps onto the same tree; dotted overrides (`algorithm.kl_coef=0.01`)
apply on top. Unknown keys, wrong types and impossible combinations raise `GRPOConfigError`
naming the dotted key, the value and what is allowed. Every field carries a help text in
`dataclasses.fields(section)[i].metadata["help"]`.

One module per concern: the sections next to what they configure (`model`, `rollout`, `reward`,
`algorithm` with its `correction`, `engine`, `batching`, `resources`, `run`), the checks across
sections in `checks`, the root in `root`, YAML in `loading`. No config reads the environment or
the machine (`entrepot.grpo.run.deployment` does), nor the synthetic tasks' token lengths
(`entrepot.grpo.data.checks`, run by `entrepot.grpo.run.preflight` before anything starts).

This module imports no torch so that the CLI's `--help` stays fast.
"""

from __future__ import annotations

from entrepot.grpo.config.algorithm import AlgorithmConfig
from entrepot.grpo.config.audit import AuditConfig
from entrepot.grpo.config.batching import BatchingConfig, PassBatchingConfig
from entrepot.grpo.config.correction import CorrectionConfig
from entrepot.grpo.config.distill import DistillConfig
from entrepot.grpo.config.engine import EngineConfig, InferParallelConfig, ParallelConfig, TrainParallelConfig
from entrepot.grpo.config.loading import config_from_dict, config_to_dict, dump_yaml, load_config
from entrepot.grpo.config.lora import LoraConfig
from entrepot.grpo.config.model import DataConfig, ModelConfig
from entrepot.grpo.config.multiturn import MultiTurnConfig
from entrepot.grpo.config.resources import DockConfig, ResourcesConfig, ThreadsConfig
from entrepot.grpo.config.reward import CodeRewardConfig, JudgeConfig, RewardConfig
from entrepot.grpo.config.rollout import RolloutConfig
from entrepot.grpo.config.root import GRPOConfig
from entrepot.grpo.config.run import CheckpointConfig, EvalConfig, LoggingConfig
from entrepot.grpo.config.trainer import TrainerConfig
from entrepot.grpo.config.word_problems import WordProblemsConfig

__all__ = [
    "AlgorithmConfig",
    "AuditConfig",
    "BatchingConfig",
    "CheckpointConfig",
    "CodeRewardConfig",
    "CorrectionConfig",
    "DataConfig",
    "DistillConfig",
    "DockConfig",
    "EngineConfig",
    "EvalConfig",
    "GRPOConfig",
    "InferParallelConfig",
    "JudgeConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "ParallelConfig",
    "PassBatchingConfig",
    "ResourcesConfig",
    "RewardConfig",
    "RolloutConfig",
    "ThreadsConfig",
    "TrainParallelConfig",
    "TrainerConfig",
    "WordProblemsConfig",
    "config_from_dict",
    "config_to_dict",
    "dump_yaml",
    "load_config",
]
