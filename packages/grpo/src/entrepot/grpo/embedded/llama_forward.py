"""The Llama family's forward over one packed row, written out on the module's own weights (private).

As `embedded.gpt2_forward` does for GPT-2: the log-prob and update passes of Llama / Qwen2 / Qwen3
run `embedded.llama_layers.decoder_layer` on the HF module's parameters (autograd reaches them as
it reaches HF's forward), one packed row, its attention varlen causal or shared-prefix (the `attend`
callable). Tested equal to the HF path in log-probs and gradients; models it does not reproduce
(`supports`) keep HF's forward.

`packed_hidden` gives the final-normed hidden states at the kept positions and `head_weight` the LM
head, so a caller may apply the head in chunks; `packed_logits` applies it whole.

Legend: M tokens in the packed row, R kept positions, E hidden size, V vocab.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from entrepot.grpo.embedded import checkpointing
from entrepot.grpo.embedded.llama_layers import (
    Attend,
    LlamaDims,
    decoder_layer,
    module_layers,
    rope_frequencies,
    rope_tables,
    unsupported,
)

__all__ = ["head_weight", "packed_hidden", "packed_logits", "supports"]


def supports(model: torch.nn.Module) -> bool:
    """Whether `model` is an HF Llama / Qwen2 / Qwen3 LM this forward reproduces exactly.

    Attention dropout that would apply, gradient checkpointing (HF's forward implements it) and the
    configs `llama_layers.unsupported` names keep the HF forward.
    """
    if unsupported(model) is not None:
        return False
    config: Any = model.config
    dropout = float(getattr(config, "attention_dropout", 0.0) or 0.0)
    new_name = hasattr(type(model), "is_activation_checkpointing")  # transformers 5 renamed it
    hf_checkpointing = bool(
        getattr(model, "is_activation_checkpointing" if new_name else "is_gradient_checkpointing", False)
    )
    return not (model.training and dropout > 0) and not hf_checkpointing


def head_weight(model: torch.nn.Module) -> torch.Tensor:
    """The LM head's weight [V, E] (the input embedding when tied)."""
    weight: torch.Tensor = model.lm_head.weight  # type: ignore[union-attr, assignment]
    return weight


def packed_hidden(
    model: torch.nn.Module, ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor, attend: Attend
) -> torch.Tensor:
    """Final-normed hidden states [R, E] at positions `keep` of the packed row `ids` [M] (positions [M]).

    `attend` is the packed attention over the row, softmax scale 1 / sqrt(head_dim). Each layer runs
    under `torch.utils.checkpoint` when the model's activation checkpointing is on
    (`entrepot.grpo.embedded.checkpointing`).
    """
    lm: Any = model  # an HF Llama-family causal LM (`supports`)
    dims = LlamaDims.of(model)
    inv_freq, scaling, _ = rope_frequencies(lm.config, dims.head_dim)
    hidden = lm.model.embed_tokens(ids)  # [M, E] (HF's embedding: its padding row gets no gradient)
    cos, sin = rope_tables(inv_freq, scaling, position_ids, hidden.dtype)  # [M, 1, D]
    for layer in module_layers(model):
        hidden = checkpointing.run_layer(model, decoder_layer, hidden, layer, dims, cos, sin, attend)
    return F.rms_norm(hidden[keep], (dims.hidden,), lm.model.norm.weight, dims.eps)


def packed_logits(
    model: torch.nn.Module, ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor, attend: Attend
) -> torch.Tensor:
    """Logits [R, V] at positions `keep` of the packed row (`packed_hidden` through the LM head)."""
    return F.linear(packed_hidden(model, ids, position_ids, keep, attend), head_weight(model))
