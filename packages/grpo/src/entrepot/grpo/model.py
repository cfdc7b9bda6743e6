"""The training-side policy: an HF-transformers causal LM and its per-token log-probs.

The embedded default is a GPT-2-style decoder (learned absolute positions, LayerNorm, GELU MLP) of
about 100k parameters built from `ModelConfig`; a tiny rotary-only Qwen2 config did not learn the
reverse task in the prototype, learned positions did. Dropout is zero so that the PPO ratio of an
unchanged policy is exactly 1.

Shape legend: B = sequences, L = padded length, V = vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from entrepot.grpo.errors import DataError

PACKED_ATTENTION = "entrepot_packed"

if TYPE_CHECKING:
    from entrepot.grpo.config import ModelConfig

__all__ = ["build_model", "load_pretrained", "packed_sequence_logprobs", "sequence_logprobs"]


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


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each next token (and the policy entropy there) under `model`.

    Args:
        input_ids: [B, L] right-padded prompt+response tokens.
        attention_mask: [B, L] 1 on real tokens.
        with_entropy: also return the entropy of the next-token distribution.

    Returns:
        logp: [B, L - 1], logp[b, t] = log p(input_ids[b, t + 1] | input_ids[b, :t + 1]).
        entropy: [B, L - 1] or None.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits[:, :-1].float()  # [B, L-1, V]
    log_probs = F.log_softmax(logits, dim=-1)  # [B, L-1, V]
    logp = log_probs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    entropy = None
    if with_entropy:
        entropy = -(log_probs.exp() * log_probs).sum(-1)  # [B, L-1]
    return logp, entropy


def _packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """An HF attention function over one packed row: causal attention inside each sequence.

    query/key/value: [1, N, T, D] (N heads, T packed tokens); kwargs carry ``cu_seq_lens_q`` and
    ``max_length_q`` from the model call. Returns [1, T, N, D] as HF's attention functions do.
    """
    from entrepot.batching import packed_causal_attention

    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # each [T, N, D]
    out = packed_causal_attention(
        q, k, v, kwargs["cu_seq_lens_q"], int(kwargs["max_length_q"]), softmax_scale=scaling
    )
    return out.unsqueeze(0), None


def packed_sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sequence_logprobs` with padding removed: the batch runs as one packed row (cu_seqlens).

    No compute is spent on pad tokens; outputs are scattered back to the padded [B, L - 1] grid
    (values past each sequence's end are arbitrary and must be masked by the caller).
    """
    from transformers import AttentionInterface

    from entrepot.batching import PackedBatch

    AttentionInterface.register(PACKED_ATTENTION, _packed_attention)
    packed = PackedBatch.from_padded(input_ids, attention_mask)
    config: Any = model.config
    previous = config._attn_implementation
    config._attn_implementation = PACKED_ATTENTION  # only for this call: the padded path stays eager
    try:
        logits = (
            model(
                input_ids=packed.input_ids,
                attention_mask=torch.ones_like(
                    packed.input_ids
                ),  # the packed kernel ignores it; HF warns without
                position_ids=packed.position_ids,
                cu_seq_lens_q=packed.cu_seqlens,
                cu_seq_lens_k=packed.cu_seqlens,
                max_length_q=packed.max_seqlen,
                max_length_k=packed.max_seqlen,
            )
            .logits[0]
            .float()
        )  # [T, V]
    finally:
        config._attn_implementation = previous
    log_probs = F.log_softmax(logits, dim=-1)  # [T, V]
    labels = packed.next_token_labels(ignore_index=0)[0]  # [T], 0 at each sequence end
    logp = packed.to_padded(log_probs.gather(-1, labels[:, None]).squeeze(-1))[:, :-1]  # [B, L-1]
    entropy = None
    if with_entropy:
        entropy = packed.to_padded(-(log_probs.exp() * log_probs).sum(-1))[:, :-1]  # [B, L-1]
    return logp, entropy
