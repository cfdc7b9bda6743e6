"""What the megatron-core ``GPTModel`` recipe (``megatron_model``) can build from an HF config.

Pure functions of the HF config (no megatron import), so a run's configuration check refuses a
model before anything starts, and the builder reads the same answers:

- ``megatron_architecture``: the HF class a config builds (``architectures[0]``, or its
  ``model_type`` when a saved config names none), one of ``MEGATRON_ARCHITECTURES``;
- ``rope_arguments``: ``GPTModel``'s rotary arguments for the config's RoPE. megatron-core 0.16 serves
  the plain rotation, linear position interpolation (``seq_len_interpolation_factor``) and Llama 3's
  frequency scaling with its released constants (low / high frequency factors 1 / 4 over 8192
  positions; only the factor is an argument); other ``rope_type`` values (yarn, dynamic, longrope)
  are refused rather than silently rotated the default way;
- ``check_megatron_support``: everything above plus the layer features the recipe has no switch for
  (an activation other than SiLU, Llama's attention / MLP biases, sliding-window attention).
"""

from __future__ import annotations

import math
from typing import Any

from entrepot.resharding.errors import UnknownArchitectureError, UnsupportedModelError

__all__ = [
    "MEGATRON_ARCHITECTURES",
    "ROPE_TYPES",
    "check_megatron_support",
    "megatron_architecture",
    "rope_arguments",
]

MEGATRON_ARCHITECTURES = ("GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

_BY_MODEL_TYPE = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM"}  # fmt: skip

ROPE_TYPES = ("default", "linear", "llama3")
"""``rope_parameters.rope_type`` values megatron-core's ``RotaryEmbedding`` reproduces."""

LLAMA3_CONSTANTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""megatron-core's fixed Llama 3 scaling constants (``RotaryEmbedding._apply_scaling``'s defaults)."""


def megatron_architecture(hf_config: Any) -> str:
    """The HF architecture `hf_config` builds, if megatron-core has a recipe for it.

    Raises:
        UnknownArchitectureError: no recipe (the message lists the known architectures).
    """
    names = list(getattr(hf_config, "architectures", None) or [])
    model_type = getattr(hf_config, "model_type", "")
    name = names[0] if names else _BY_MODEL_TYPE.get(model_type, model_type)
    if name not in MEGATRON_ARCHITECTURES:
        raise UnknownArchitectureError(
            f"architecture {name!r} has no megatron-core GPTModel recipe; "
            f"known: {', '.join(MEGATRON_ARCHITECTURES)}"
        )
    return name


def _rope(hf_config: Any) -> dict[str, Any]:
    """The config's RoPE parameters (transformers 5's ``rope_parameters``; older ``rope_scaling``)."""
    rope = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    rope.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    rope["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
    return rope


def rope_arguments(hf_config: Any) -> dict[str, Any]:
    """``GPTModel``'s rotary keyword arguments for `hf_config` (a RoPE architecture).

    Returns:
        ``rotary_base`` and, for a scaled RoPE, ``seq_len_interpolation_factor`` (linear) or
        ``rope_scaling`` + ``rope_scaling_factor`` (llama3).

    Raises:
        UnsupportedModelError: a ``rope_type`` megatron-core does not serve, Llama 3 constants other
            than megatron's, a partial rotation; the message names the key and what is allowed.
    """
    rope = _rope(hf_config)
    kind = rope["rope_type"]
    if kind not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope_parameters.rope_type ({kind!r}) is not served by megatron-core; "
            f"allowed: {', '.join(ROPE_TYPES)}"
        )
    partial = rope.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedModelError(
            f"rope_parameters.partial_rotary_factor ({partial!r}): the megatron recipe rotates "
            "whole heads (1.0)"
        )
    theta = float(rope["rope_theta"])
    # megatron types the base as an int; a fractional one is passed as it is (the formula takes floats)
    arguments: dict[str, Any] = {"rotary_base": int(theta) if theta.is_integer() else theta}
    if kind == "linear":
        arguments["seq_len_interpolation_factor"] = float(rope["factor"])
    elif kind == "llama3":
        for key, fixed in LLAMA3_CONSTANTS.items():
            if not math.isclose(float(rope.get(key, fixed)), fixed):
                raise UnsupportedModelError(
                    f"rope_parameters.{key} ({rope[key]!r}) with rope_type 'llama3': megatron-core fixes it "
                    f"at {fixed:g} (only the factor is configurable)"
                )
        arguments |= {"rope_scaling": True, "rope_scaling_factor": float(rope["factor"])}
    return arguments


def _refuse(key: str, value: Any, allowed: str) -> None:
    raise UnsupportedModelError(f"{key} ({value!r}) is not built by the megatron recipe; allowed: {allowed}")


def check_megatron_support(hf_config: Any) -> str:
    """Refuse what the megatron recipe cannot build from `hf_config`; returns the architecture.

    Raises:
        UnknownArchitectureError: no recipe for the architecture.
        UnsupportedModelError: a config value the recipe has no switch for, naming the key and
            what is allowed (RoPE: see `rope_arguments`).
    """
    arch = megatron_architecture(hf_config)
    if arch == "GPT2LMHeadModel":  # its activations are checked by the adaptor's `gpt2_activation`
        return arch
    act = getattr(hf_config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        _refuse("hidden_act", act, "'silu' (SwiGLU)")
    if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") and getattr(hf_config, "attention_bias", False):
        _refuse("attention_bias", True, "false (Qwen2ForCausalLM has the q/k/v bias megatron builds)")
    if getattr(hf_config, "mlp_bias", False):
        _refuse("mlp_bias", True, "false")
    windows = [t for t in getattr(hf_config, "layer_types", None) or [] if t != "full_attention"]
    if getattr(hf_config, "use_sliding_window", False) or windows:
        _refuse("use_sliding_window", True, "false (every layer full attention)")
    rope_arguments(hf_config)
    return arch
