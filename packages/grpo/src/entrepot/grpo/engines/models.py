"""The training-side policy model: an HF-transformers causal LM, built from a config or loaded locally.

The embedded default is a GPT-2-style decoder (learned absolute positions, LayerNorm, GELU MLP) of
about 100k parameters built from `ModelConfig`, held as `entrepot.grpo.embedded.gpt2_model.EmbeddedGPT2`
(HF's config fields and parameters, without importing transformers, which lengthens
start-up); a tiny rotary-only Qwen2 config did not learn the reverse task in the prototype, learned
positions did. `model.architecture=qwen2` builds a Qwen2
(the GPU example's 0.5B-class shape, or tiny ones in tests). Dropout is zero so that the PPO ratio
of an unchanged policy is exactly 1.

Its per-token log-probs (packed or padded) are computed in `entrepot.grpo.algo.sequences`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from entrepot.grpo.errors import DataError

if TYPE_CHECKING:
    from entrepot.grpo.config import ModelConfig

__all__ = [
    "build_hf_config",
    "build_model",
    "load_model_config",
    "load_pretrained",
    "load_tokenizer",
    "model_config",
    "read_tokenizer",
]


def build_hf_config(config: ModelConfig, vocab_size: int, *, pad_token_id: int, eos_token_id: int) -> Any:
    """HF's config of the decoder `config` describes (`model_config`, as transformers' own class)."""
    from entrepot.grpo.embedded.gpt2_model import as_hf_config

    ours = model_config(config, vocab_size, pad_token_id=pad_token_id, eos_token_id=eos_token_id)
    return as_hf_config(ours)


def model_config(config: ModelConfig, vocab_size: int, *, pad_token_id: int, eos_token_id: int) -> Any:
    """The config of the decoder `config` describes (tied input/output embeddings, no dropout).

    GPT-2: an `EmbeddedGPT2Config` (GPT2Config's fields without importing transformers); Qwen2: HF's.
    """
    if config.architecture == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size or 4 * config.hidden_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.kv_heads,
            max_position_embeddings=config.max_positions,
            initializer_range=config.init_std,
            attention_dropout=0.0,
            bos_token_id=eos_token_id,
            eos_token_id=eos_token_id,
            # no pad_token_id: Qwen2 would make it the embedding's padding_idx (a row that never
            # learns), which megatron's embedding and GPT-2 do not have; generation is told the pad id
            tie_word_embeddings=True,
        )
    from entrepot.grpo.embedded.gpt2_model import EmbeddedGPT2Config

    return EmbeddedGPT2Config(
        vocab_size=vocab_size,
        n_positions=config.max_positions,
        n_embd=config.hidden_size,
        n_layer=config.num_layers,
        n_head=config.num_heads,
        n_inner=config.intermediate_size,
        initializer_range=config.init_std,
        # the exact (erf) GELU: on CPU torch's tanh GELU costs 4x its time, and GPT-2's "gelu_new" five
        # elementwise ops more; the tanh GELU forward and backward were 23% of a default step
        activation_function="gelu",
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def build_model(
    config: ModelConfig, vocab_size: int, *, pad_token_id: int, eos_token_id: int
) -> torch.nn.Module:
    """A randomly initialised causal LM: an `EmbeddedGPT2` (HF's weights for the seed) or HF's Qwen2."""
    hf_config = model_config(config, vocab_size, pad_token_id=pad_token_id, eos_token_id=eos_token_id)
    if config.architecture == "gpt2":
        from entrepot.grpo.embedded.gpt2_model import EmbeddedGPT2

        return EmbeddedGPT2(hf_config)
    from transformers import AutoModelForCausalLM

    # sdpa gains nothing at the default size; eager is deterministic
    return AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager")


def _model_directory(path: str | Path, key: str = "model.path") -> Path:
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise DataError(f"{key} ({str(directory)!r}) must be a local HF model directory with config.json")
    return directory


def _load_failed(directory: Path, what: str, exc: Exception, key: str = "model.path") -> DataError:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return DataError(f"{key} ({str(directory)!r}): its {what} does not load: {reason}")


def load_model_config(path: str | Path, key: str = "model.path") -> Any:
    """The HF config of a local model directory; a `DataError` naming `key` when it will not load."""
    from transformers import AutoConfig

    directory = _model_directory(path, key)
    try:
        return AutoConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise _load_failed(directory, "config.json", exc, key) from None


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a local model directory (pad = EOS when it has none); a `DataError` if it fails."""
    directory = _model_directory(path)
    return read_tokenizer(directory, lambda what: DataError(f"model.path ({str(directory)!r}): {what}"))


def read_tokenizer(directory: Path, error: Callable[[str], Exception]) -> Any:
    """The tokenizer files of `directory` (pad = EOS when it has none); raises `error(what went wrong)`.

    Shared by the policy's and the reward models' directories, whose errors name their own keys.
    """
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise error(f"its tokenizer does not load: {reason}") from None
    if len(tokenizer) < 2:  # transformers builds an empty tokenizer for a directory without its files
        raise error("its tokenizer is empty (no tokenizer files such as tokenizer.json or vocab.json in the "
                    "directory)")  # fmt: skip
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_pretrained(
    path: str | Path, *, with_tokenizer: bool = True, key: str = "model.path"
) -> tuple[torch.nn.Module, Any]:
    """Load a causal LM and its tokenizer (None unless `with_tokenizer`) from a local HF model directory.

    Never from the hub; `key` is the config key errors name.
    """
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(path) if with_tokenizer else None
    model = AutoModelForCausalLM.from_pretrained(_model_directory(path, key), local_files_only=True,
                                                 dtype=torch.float32)  # fmt: skip
    return model, tokenizer
