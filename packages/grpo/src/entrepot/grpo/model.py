"""The training-side policy model: an HF-transformers causal LM, built from a config or loaded locally.

The embedded default is a GPT-2-style decoder (learned absolute positions, LayerNorm, GELU MLP) of
about 100k parameters built from `ModelConfig`; a tiny rotary-only Qwen2 config did not learn the
reverse task in the prototype, learned positions did. Dropout is zero so that the PPO ratio of an
unchanged policy is exactly 1.

Its per-token log-probs (packed or padded) are computed in `entrepot.grpo.sequences`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from entrepot.grpo.errors import DataError

if TYPE_CHECKING:
    from entrepot.grpo.config import ModelConfig

__all__ = ["build_model", "load_pretrained"]


def build_model(
    config: ModelConfig, vocab_size: int, *, pad_token_id: int, eos_token_id: int
) -> torch.nn.Module:
    """A randomly initialised GPT2LMHeadModel from `config` (tied input/output embeddings)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=config.max_positions,
        n_embd=config.hidden_size,
        n_layer=config.num_layers,
        n_head=config.num_heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        initializer_range=config.init_std,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(hf_config)
    model.config._attn_implementation = "eager"  # sdpa gains nothing at this size; eager is deterministic
    return model


def load_pretrained(path: str | Path) -> tuple[torch.nn.Module, Any]:
    """Load a causal LM and its tokenizer from a local HF model directory (never from the hub)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise DataError(
            f"model.path ({str(directory)!r}) must be a local HF model directory with config.json"
        )
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
