"""Tiny local HF model directories written by the tests themselves (no downloads)."""

from __future__ import annotations

from pathlib import Path

WORDS = ["user", ":", "what", "is", "1", "2", "3", "?"]


def tiny_model_dir(path: Path, architecture: str = "gpt2") -> Path:
    """A tiny causal LM plus a word-level tokenizer with a chat template, saved under `path`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.chat_template = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    tok.save_pretrained(path)
    if architecture == "gpt2":
        model = GPT2LMHeadModel(
            GPT2Config(vocab_size=len(vocab), n_positions=32, n_embd=16, n_layer=1, n_head=2)
        )
    else:
        config = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                             pad_token_id=0, eos_token_id=1, bos_token_id=1)  # fmt: skip
        model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    return path
