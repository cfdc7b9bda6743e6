"""Tiny GGUF files written by the tests (no downloads): an HF Llama / Qwen2 / Qwen3 model and a byte-level
BPE tokenizer in llama.cpp's layout, float32 tensors, as llama.cpp's convert_hf_to_gguf.py lays them
out (Llama's q/k rows permuted for its rotary layout; Qwen's not)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TEXTS = ["what is 12 plus 30", "the answer is 42", "tom has 3 apples and buys 4 more", "how many now"]


def bpe_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained on `TEXTS`, specials `<pad>` 0 and `<eos>` 1, a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(TEXTS, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_model(architecture: str, vocab_size: int, *, tied: bool = True) -> Any:
    """A random tiny causal LM of `architecture` (llama, qwen2, qwen3), eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        architecture, vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms away from 1 and biases away from 0, so a lost tensor shows
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    return model


def _permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's rotary layout of a q/k projection (transformers' GGUF reader undoes it)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(model: Any, tokenizer: Any, path: Path) -> Path:
    """`model` and `tokenizer` as a float32 GGUF file at `path`."""
    import gguf

    config = model.config
    arch = config.model_type
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if arch == "llama":
        writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    vocab = tokenizer.backend_tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    tokens += [f"[PAD{i}]" for i in range(config.vocab_size - len(tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch.startswith("qwen") else "default")  # the families' own splits
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in ("<pad>", "<eos>") else 1 for t in tokens])
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)
    writer.add_chat_template(tokenizer.chat_template)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.detach().float()
        if arch == "llama" and name.endswith("q_proj.weight"):
            data = _permute(data, config.num_attention_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            data = _permute(data, config.num_key_value_heads)
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, name
        writer.add_tensor(mapped, data.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
