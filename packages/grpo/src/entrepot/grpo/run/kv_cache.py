"""The rollout engine's largest KV cache, from the config alone (`run.memory`'s estimate of it)."""

from __future__ import annotations

from typing import Any

from entrepot.grpo.config import DataConfig, EvalConfig, MultiTurnConfig, RolloutConfig
from entrepot.grpo.data.lengths import longest_sequence
from entrepot.grpo.engines.registry import RolloutKind
from entrepot.grpo.engines.rollout_vllm import VLLM_KV_BLOCK_TOKENS, vllm_kv_cache_bytes

__all__ = ["rollout_kv_cache"]

FLOAT32_BYTES = 4


def rollout_kv_cache(
    data: DataConfig, rollout: RolloutConfig, evaluation: EvalConfig, hf_config: Any, kind: RolloutKind,
    num_ranks: int, multiturn: MultiTurnConfig, value_bytes: int = FLOAT32_BYTES,
) -> tuple[int, str]:  # fmt: skip
    """The rollout engine's largest KV cache and how it was sized; `value_bytes`: per cached value of
    the torch engines (2 with ``engine.rollout_dtype: bfloat16``)."""
    from entrepot.resharding.adaptors import ModelDims

    tokens = longest_sequence(data, rollout, multiturn)
    if kind == "vllm":
        seqs = rollout.batch_size
        return vllm_kv_cache_bytes(hf_config, tokens, seqs), (
            f"vLLM's kv_cache_memory_bytes: {seqs} sequences x {tokens} tokens in "
            f"{VLLM_KV_BLOCK_TOKENS}-token blocks"
        )
    # a rank generates its share of the step's prompt groups at once, and evaluation all its prompts
    rows = -(-rollout.prompts_per_step // num_ranks) * rollout.n_samples_per_prompt
    seqs = max(rows, evaluation.num_prompts)
    dims = ModelDims.from_config(hf_config)
    heads = dims.num_heads if kind == "gpt2" else dims.num_kv_heads  # the embedded engine caches every head
    per_token = 2 * dims.num_layers * heads * dims.head_dim * value_bytes
    engine = {"gpt2": "embedded GPT-2 engine", "llama": "Llama-family KV-cache engine"}.get(
        kind, "HF generate"
    )
    return per_token * seqs * tokens, (
        f"{engine}: {seqs} sequences x {tokens} tokens (prompt + response) x {dims.num_layers} layers "
        f"x K and V x {heads} heads x {dims.head_dim} x {value_bytes} bytes"
    )
