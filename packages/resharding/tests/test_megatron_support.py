"""What the megatron recipe builds from an HF config, and what it refuses (pure; no megatron-core)."""

from __future__ import annotations

from typing import Any

import pytest

from entrepot.resharding import UnknownArchitectureError, UnsupportedModelError
from entrepot.resharding.engines.megatron_support import check_megatron_support, rope_arguments

transformers = pytest.importorskip("transformers")

LLAMA3 = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=8192)  # fmt: skip


def _llama(**kwargs: Any) -> Any:
    kwargs.setdefault("max_position_embeddings", 16384)
    return transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, **kwargs)


@pytest.mark.parametrize(
    ("rope", "expected"),
    [
        (dict(rope_type="default", rope_theta=100000.0), {"rotary_base": 100000}),
        (dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
         {"rotary_base": 10000, "seq_len_interpolation_factor": 4.0}),
        (LLAMA3, {"rotary_base": 500000, "rope_scaling": True, "rope_scaling_factor": 32.0}),
    ],
    ids=["default", "linear", "llama3"],
)  # fmt: skip
def test_rope_arguments_map_each_served_scaling(rope: dict[str, Any], expected: dict[str, Any]) -> None:
    config = _llama(rope_parameters=rope)
    assert rope_arguments(config) == expected
    assert check_megatron_support(config) == "LlamaForCausalLM"


def test_a_saved_config_without_architectures_is_read_by_its_model_type() -> None:
    config = _llama()
    config.architectures = None  # as in a directory saved from a GGUF load
    assert check_megatron_support(config) == "LlamaForCausalLM"
    qwen3 = transformers.Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    assert check_megatron_support(qwen3) == "Qwen3ForCausalLM"


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (lambda: _llama(rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=4.0,
                                             original_max_position_embeddings=2048)),
         r"rope_parameters\.rope_type \('yarn'\).*allowed: default, linear, llama3"),
        (lambda: _llama(rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)),
         r"rope_type \('dynamic'\)"),
        (lambda: _llama(rope_parameters=dict(LLAMA3, high_freq_factor=2.0)),
         r"rope_parameters\.high_freq_factor \(2\.0\).*fixes it at 4"),
        (lambda: _llama(rope_parameters=dict(LLAMA3, original_max_position_embeddings=4096)),
         r"rope_parameters\.original_max_position_embeddings \(4096\).*8192"),
        (lambda: _llama(hidden_act="gelu"), r"hidden_act \('gelu'\).*'silu'"),
        (lambda: _llama(attention_bias=True), r"attention_bias \(True\).*false"),
        (lambda: _llama(mlp_bias=True), r"mlp_bias \(True\)"),
        (lambda: transformers.Qwen2Config(hidden_size=64, num_attention_heads=4, use_sliding_window=True,
                                          sliding_window=8, max_window_layers=0),
         r"use_sliding_window \(True\)"),
    ],
    ids=["yarn", "dynamic", "llama3-constants", "llama3-context", "activation", "attention-bias", "mlp-bias",
         "sliding-window"],
)  # fmt: skip
def test_what_the_recipe_cannot_build_is_refused_naming_the_key(config: Any, match: str) -> None:
    with pytest.raises(UnsupportedModelError, match=match):
        check_megatron_support(config())


def test_an_architecture_without_a_recipe_lists_the_known_ones() -> None:
    config = transformers.MistralConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(UnknownArchitectureError, match=r"'mistral'.*GPT2LMHeadModel, LlamaForCausalLM"):
        check_megatron_support(config)
    config.architectures = ["MistralForCausalLM"]
    with pytest.raises(UnknownArchitectureError, match=r"'MistralForCausalLM' has no megatron-core"):
        check_megatron_support(config)
