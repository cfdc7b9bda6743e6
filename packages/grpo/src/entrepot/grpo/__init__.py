"""entrepot.grpo — the GRPO trainer: config, workers on Ray, rule rewards, losses, fit loop.

Heavy modules (torch, ray, transformers) load on first use of `train` / `evaluate` / `estimate_memory`
so that `import entrepot.grpo` and the CLI's `--help` stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from entrepot.grpo._version import __version__
from entrepot.grpo.config import GRPOConfig, config_to_dict, dump_yaml, load_config
from entrepot.grpo.errors import GRPOConfigError, GRPOError

if TYPE_CHECKING:
    from entrepot.grpo.api import TrainResult, evaluate, train
    from entrepot.grpo.run.memory import MemoryEstimate, estimate_memory

__all__ = [
    "GRPOConfig",
    "GRPOConfigError",
    "GRPOError",
    "MemoryEstimate",
    "TrainResult",
    "__version__",
    "config_to_dict",
    "dump_yaml",
    "estimate_memory",
    "evaluate",
    "load_config",
    "train",
]

# name -> the module that defines it, imported on first use (torch, ray, transformers load there)
_LAZY = {
    "train": "api",
    "evaluate": "api",
    "TrainResult": "api",
    "estimate_memory": "run.memory",
    "MemoryEstimate": "run.memory",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"entrepot.grpo.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'entrepot.grpo' has no attribute {name!r}")
