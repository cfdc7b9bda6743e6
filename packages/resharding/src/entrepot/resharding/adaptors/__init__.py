"""Weight adaptors: a registry of per-architecture name maps between HF, training and inference layouts.

``get_adaptor("Qwen2ForCausalLM", hf_config)`` returns a ``WeightAdaptor`` for that model;
``register_adaptor`` adds one for a new architecture (duplicates are refused).
"""

from __future__ import annotations

from typing import Any

from entrepot.resharding.adaptors.base import ModelDims, ParamSpec, WeightAdaptor
from entrepot.resharding.adaptors.deepseek import DeepseekAdaptor
from entrepot.resharding.adaptors.gpt2 import GPT2Adaptor
from entrepot.resharding.adaptors.llama import LlamaAdaptor
from entrepot.resharding.adaptors.qwen3_moe import Qwen3MoeAdaptor
from entrepot.resharding.errors import UnknownArchitectureError

__all__ = [
    "DeepseekAdaptor",
    "GPT2Adaptor",
    "LlamaAdaptor",
    "ModelDims",
    "ParamSpec",
    "Qwen3MoeAdaptor",
    "WeightAdaptor",
    "adaptor_for_config",
    "get_adaptor",
    "known_architectures",
    "register_adaptor",
]

_REGISTRY: dict[str, type[WeightAdaptor]] = {}


def register_adaptor(adaptor: type[WeightAdaptor], architectures: tuple[str, ...] | None = None) -> None:
    """Register ``adaptor`` for ``architectures`` (default: ``adaptor.architectures``).

    Raises:
        ValueError: an architecture already has an adaptor.
    """
    names = adaptor.architectures if architectures is None else architectures
    if not names:
        raise ValueError(f"{adaptor.__name__} names no architectures")
    taken = [name for name in names if name in _REGISTRY]
    if taken:
        raise ValueError(
            f"architectures {taken} already have adaptors: {[_REGISTRY[n].__name__ for n in taken]}"
        )
    for name in names:
        _REGISTRY[name] = adaptor


def known_architectures() -> list[str]:
    """Every registered architecture name, sorted."""
    return sorted(_REGISTRY)


def get_adaptor(architecture: str, config: Any) -> WeightAdaptor:
    """The adaptor for an HF architecture name (e.g. ``"Qwen2ForCausalLM"``), built for ``config``.

    Raises:
        UnknownArchitectureError: no adaptor is registered for ``architecture``.
    """
    try:
        adaptor = _REGISTRY[architecture]
    except KeyError:
        raise UnknownArchitectureError(
            f"no weight adaptor for architecture {architecture!r}; known: {', '.join(known_architectures())}"
        ) from None
    return adaptor(config)


def adaptor_for_config(config: Any) -> WeightAdaptor:
    """``get_adaptor(config.architectures[0], config)`` for an HF config that names its class."""
    architectures = getattr(config, "architectures", None) or []
    if not architectures:
        raise UnknownArchitectureError(
            f"config names no architectures; pass one of {', '.join(known_architectures())} to get_adaptor"
        )
    return get_adaptor(architectures[0], config)


for _adaptor in (LlamaAdaptor, Qwen3MoeAdaptor, DeepseekAdaptor, GPT2Adaptor):
    register_adaptor(_adaptor)
