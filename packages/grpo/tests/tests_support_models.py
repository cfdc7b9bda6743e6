"""Tiny local HF model directories written by the tests themselves (no downloads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

WORDS = ["user", ":", "what", "is", "1", "2", "3", "?"]


def word_tokenizer() -> Any:
    """A word-level tokenizer over `WORDS` (plus <pad> 0, <eos> 1, <unk> 2) with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.chat_template = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    return tok


def tiny_model_dir(path: Path, architecture: str = "gpt2") -> Path:
    """A tiny causal LM plus a word-level tokenizer with a chat template, saved under `path`."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    tok = word_tokenizer()
    tok.save_pretrained(path)
    if architecture == "gpt2":
        model = GPT2LMHeadModel(
            GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=16, n_layer=1, n_head=2)
        )
    else:
        config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                             pad_token_id=0, eos_token_id=1, bos_token_id=1)  # fmt: skip
        model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    return path


def byte_tokenizer() -> Any:
    """A byte-level Qwen2 tokenizer without merges (one token per byte, <pad> 0, <eos> 1).

    transformers loads any qwen2 directory's tokenizer as a Qwen2Tokenizer (byte-level BPE), which
    turns the word-level tokenizer's texts into no tokens at all.
    """
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<pad>": 0, "<eos>": 1, **{symbol: i + 2 for i, symbol in enumerate(byte_symbols)}}
    return Qwen2Tokenizer(vocab=vocab, merges=[], pad_token="<pad>", eos_token="<eos>", unk_token=None)


def tiny_reward_model_dir(path: Path, kind: str = "classifier", architecture: str = "gpt2") -> Path:
    """A tiny reward model and its tokenizer, saved under `path`.

    kind="classifier": a `*ForSequenceClassification` with one label: gpt2 (32 positions, the word-level
    tokenizer) or qwen2 (64 positions, `byte_tokenizer`).
    kind="value_head": `tiny_model_dir`'s causal LM (gpt2 or llama) whose safetensors also hold TRL's
    `v_head.summary.weight` [1, 16] and `v_head.summary.bias` [1].
    """
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import (
        GPT2Config,
        GPT2ForSequenceClassification,
        Qwen2Config,
        Qwen2ForSequenceClassification,
    )

    if kind == "value_head" and architecture in ("gpt2", "llama"):
        tiny_model_dir(path, architecture)
        weights = load_file(path / "model.safetensors")
        generator = torch.Generator().manual_seed(0)
        weights["v_head.summary.weight"] = torch.randn(1, 16, generator=generator)
        weights["v_head.summary.bias"] = torch.randn(1, generator=generator)
        save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
        return path
    ids = {"num_labels": 1, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1}
    model: Any
    if kind == "classifier" and architecture == "gpt2":
        tok = word_tokenizer()
        model = GPT2ForSequenceClassification(
            GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=16, n_layer=1, n_head=2, **ids)
        )
    elif kind == "classifier" and architecture == "qwen2":
        tok = byte_tokenizer()
        config = Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                             **ids)  # fmt: skip
        model = Qwen2ForSequenceClassification(config)
    else:
        raise ValueError(
            f"no tiny reward model of kind {kind!r} and architecture {architecture!r}; known: "
            "classifier with gpt2 or qwen2, value_head with gpt2 or llama"
        )
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return path


def built_default_dir(path: Path, seed: int) -> Path:
    """The embedded default's decoder with other random weights, saved as an HF directory (no tokenizer)."""
    import torch

    from entrepot.grpo import load_config
    from entrepot.grpo.data.sources import build_task
    from entrepot.grpo.engines.models import build_model

    config = load_config(None, [])
    tok = build_task(config).tokenizer
    torch.manual_seed(seed)
    model = build_model(
        config.model, tok.vocab_size, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    model.save_pretrained(path)
    return path


CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen-style ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message."""


def chatml_tokenizer(chat_template: str | None = CHATML_TEMPLATE) -> Any:
    """`byte_tokenizer` plus the special tokens ``<|im_start|>`` and ``<|im_end|>`` (the EOS token),
    with `chat_template` (None: no chat template)."""
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = chat_template
    return tok


def tiny_judge_dir(path: Path) -> Path:
    """A tiny random Qwen2 causal LM with `chatml_tokenizer` (byte-level BPE, a chat template), saved
    under `path`: a judge that reads any text and answers with random bytes."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = chatml_tokenizer()
    config = Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         pad_token_id=0, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                         tie_word_embeddings=True)  # fmt: skip
    tok.save_pretrained(path)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path
