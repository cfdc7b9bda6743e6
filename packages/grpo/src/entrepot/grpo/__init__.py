"""entrepot.grpo — the GRPO trainer: config, workers on Ray, rule rewards, losses, fit loop."""

from __future__ import annotations

from entrepot.grpo._version import __version__
from entrepot.grpo.config import GRPOConfig, config_to_dict, dump_yaml, load_config
from entrepot.grpo.errors import GRPOConfigError, GRPOError

__all__ = [
    "GRPOConfig",
    "GRPOConfigError",
    "GRPOError",
    "__version__",
    "config_to_dict",
    "dump_yaml",
    "load_config",
]
