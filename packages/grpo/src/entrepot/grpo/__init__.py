"""entrepot.grpo — the GRPO trainer: config, workers on Ray, rule rewards, losses, fit loop.

Heavy modules (torch, ray, transformers) load on first use of `train` / `evaluate` so that
`import entrepot.grpo` and the CLI's `--help` stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from entrepot.grpo._version import __version__
from entrepot.grpo.config import GRPOConfig, config_to_dict, dump_yaml, load_config
from entrepot.grpo.errors import GRPOConfigError, GRPOError

if TYPE_CHECKING:
    from entrepot.grpo.api import TrainResult, evaluate, train

__all__ = [
    "GRPOConfig",
    "GRPOConfigError",
    "GRPOError",
    "TrainResult",
    "__version__",
    "config_to_dict",
    "dump_yaml",
    "evaluate",
    "load_config",
    "train",
]

_LAZY = {"train", "evaluate", "TrainResult"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from entrepot.grpo import api

        return getattr(api, name)
    raise AttributeError(f"module 'entrepot.grpo' has no attribute {name!r}")
