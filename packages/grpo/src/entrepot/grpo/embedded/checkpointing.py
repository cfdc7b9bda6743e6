"""Activation checkpointing of a training forward, layer by layer (`engine.activation_checkpointing`).

A layer run under `torch.utils.checkpoint` (non-reentrant) keeps only its input for the backward
pass and recomputes its activations there: the forward of the update holds one hidden state
[M, E] per layer instead of every attention and MLP intermediate. The written-out forwards
(`gpt2_forward`, `llama_forward`) call `run_layer` per block; HF modules get each decoder layer's
`forward` wrapped by `enable` (the embedded GPT-2's: those of its HF view). Both checkpoint only
where it pays: with autograd recording (log-prob passes run under no_grad) and, for HF layers,
without a KV cache (generation, which a recompute would extend twice). HF's own
`gradient_checkpointing_enable` is not used: it acts only in training mode, and the policy computes
in eval mode (no dropout).

Legend: M tokens of the packed row, E hidden size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["enable", "enabled", "run_layer"]

_FLAG = "_entrepot_activation_checkpointing"


def enabled(model: torch.nn.Module) -> bool:
    """Whether `enable` was called on `model`."""
    return bool(model.__dict__.get(_FLAG, False))


def run_layer(model: torch.nn.Module, layer: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    """`layer(*args)`, checkpointed when `model`'s checkpointing is on and autograd is recording."""
    if enabled(model) and torch.is_grad_enabled():
        out: torch.Tensor = checkpoint(layer, *args, use_reentrant=False)
        return out
    return layer(*args)


def enable(model: torch.nn.Module) -> int:
    """Turn on checkpointing for `model`: its written-out forward, and each HF decoder layer it holds.

    Returns:
        how many HF decoder layers were wrapped (0 for a model served only by a written-out forward).
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    from entrepot.grpo.embedded.gpt2_model import EmbeddedGPT2

    model.__dict__[_FLAG] = True
    # the embedded GPT-2's HF forward (padded passes) runs the blocks of its HF view
    hf_module = model.hf_view() if isinstance(model, EmbeddedGPT2) else model
    wrapped = 0
    for module in hf_module.modules():
        if isinstance(module, GradientCheckpointingLayer) and "forward" not in module.__dict__:
            config = next((m.config for m in module.modules() if hasattr(m, "config")), None)
            module.forward = functools.partial(_checkpointed, module.forward, config)
            wrapped += 1
    return wrapped


_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")  # HF's names across layers


def _checkpointed(forward: Callable[..., Any], config: Any, *args: Any, **kwargs: Any) -> Any:
    """An HF layer's forward under `checkpoint` while training without a cache, as it is otherwise.

    The recompute runs in the backward pass and reads the attention choice from the shared config:
    the caller keeps it as it was (`algo.update` runs the backward inside `packed_attention`); a
    recompute that would attend otherwise raises rather than give other gradients.
    """
    if not torch.is_grad_enabled() or any(kwargs.get(name) is not None for name in _CACHE_KWARGS):
        return forward(*args, **kwargs)
    attention = getattr(config, "_attn_implementation", None)

    def recomputable(*args: Any, **kwargs: Any) -> Any:
        now = getattr(config, "_attn_implementation", None)
        if now != attention:
            raise RuntimeError(
                f"activation checkpointing: the backward pass recomputes a layer with attention {now!r}, "
                f"its forward ran with {attention!r}; run the backward inside the same attention switch"
            )
        return forward(*args, **kwargs)

    return checkpoint(recomputable, *args, use_reentrant=False, **kwargs)
