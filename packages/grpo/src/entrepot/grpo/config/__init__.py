"""Typed GRPO configuration: kw_only dataclasses, validated on construction, loaded from YAML.

`GRPOConfig()` is the embedded default: reverse an 8-digit string with a ~100k-parameter GPT-2-style
decoder on CPU. A YAML file maps onto the same tree; dotted overrides (`algorithm.kl_coef=0.01`)
apply on top. Unknown keys, wrong types and impossible combinations raise `GRPOConfigError`
naming the dotted key, the value and what is allowed. Every field carries a help text in
`dataclasses.fields(section)[i].metadata["help"]`.

This module imports no torch so that the CLI's `--help` stays fast.
"""

from __future__ import annotations

from entrepot.grpo.config.loading import config_from_dict, config_to_dict, dump_yaml, load_config
from entrepot.grpo.config.sections import (
    AlgorithmConfig,
    BatchingConfig,
    CheckpointConfig,
    DataConfig,
    DockConfig,
    EngineConfig,
    EvalConfig,
    GRPOConfig,
    LoggingConfig,
    ModelConfig,
    PassBatchingConfig,
    ResourcesConfig,
    RewardConfig,
    RolloutConfig,
    ThreadsConfig,
)

__all__ = [
    "AlgorithmConfig",
    "BatchingConfig",
    "CheckpointConfig",
    "DataConfig",
    "DockConfig",
    "EngineConfig",
    "EvalConfig",
    "GRPOConfig",
    "LoggingConfig",
    "ModelConfig",
    "PassBatchingConfig",
    "ResourcesConfig",
    "RewardConfig",
    "RolloutConfig",
    "ThreadsConfig",
    "config_from_dict",
    "config_to_dict",
    "dump_yaml",
    "load_config",
]
