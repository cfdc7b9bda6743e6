"""HF GPT-2's forward over one packed row, written out on the module's own weights (private).

The log-prob and update passes run small batches of short rows, split over threads
(`entrepot.grpo.embedded.lanes`). There the HF module's per-call Python (kwargs, output classes, the
attention-interface dispatch) holds the GIL while the other lane waits (`benchmarks/bench_packing.py`
prints this forward's actor step against HF's, on one and two lanes). Same modules, same maths
(tested equal to the HF path in log-probs and gradients); models it does not cover exactly
(`supports`) keep the HF forward.

Legend: M tokens in the packed row, R kept positions, E hidden size, H heads, D = E / H, I the MLP's
inner size (n_inner, 4E by default), V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from entrepot.grpo.embedded import checkpointing
from entrepot.grpo.embedded.gpt2_model import hf_architecture

__all__ = ["packed_hidden", "packed_logits", "supports"]

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # q, k, v [M, H, D] -> [M, H, D]

_GELU_APPROXIMATION = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


def supports(model: torch.nn.Module) -> bool:
    """Whether `model` is an HF GPT-2 LM this forward reproduces exactly.

    Dropout that would apply (a non-zero probability while training) and the config switches that
    change the attention's maths keep the HF forward.
    """
    if hf_architecture(model) != "GPT2LMHeadModel":
        return False
    config: Any = model.config
    dropout = max(config.embd_pdrop, config.resid_pdrop, config.attn_pdrop)
    return (
        config.activation_function in _GELU_APPROXIMATION
        and config.scale_attn_weights
        and not config.scale_attn_by_inverse_layer_idx
        and not config.reorder_and_upcast_attn
        and not (model.training and dropout > 0)
    )


def packed_logits(
    model: torch.nn.Module, ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor, attend: Attend
) -> torch.Tensor:
    """Logits [R, V] at positions `keep` of the packed row `ids` [M] (positions [M]).

    `attend` is the packed attention over the row (varlen causal or shared-prefix), softmax scale
    1 / sqrt(D) as GPT-2's.
    """
    lm: Any = model  # an HF GPT2LMHeadModel (`supports`)
    logits: torch.Tensor = lm.lm_head(packed_hidden(model, ids, position_ids, keep, attend))  # [R, V]
    return logits


def packed_hidden(
    model: torch.nn.Module, ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor, attend: Attend
) -> torch.Tensor:
    """Final hidden states [R, E] (after ln_f) at positions `keep`: `packed_logits` without the LM head.

    Each block runs under `torch.utils.checkpoint` when the model's activation checkpointing is on
    (`entrepot.grpo.embedded.checkpointing`).
    """
    lm: Any = model  # an HF GPT2LMHeadModel (`supports`)
    transformer, config = lm.transformer, lm.config
    heads = config.n_head
    approximate = _GELU_APPROXIMATION[config.activation_function]
    hidden = transformer.wte(ids) + transformer.wpe(position_ids)  # [M, E]
    for block in transformer.h:
        hidden = checkpointing.run_layer(model, _block, block, hidden, attend, heads, approximate)
    normed: torch.Tensor = transformer.ln_f(hidden[keep])  # [R, E]
    return normed


def _block(block: Any, hidden: torch.Tensor, attend: Attend, heads: int, approximate: str) -> torch.Tensor:
    """One GPT-2 block on the packed row: hidden [M, E] -> [M, E]."""
    attn, mlp = block.attn, block.mlp
    head_dim = hidden.shape[-1] // heads
    qkv = torch.addmm(attn.c_attn.bias, block.ln_1(hidden), attn.c_attn.weight)  # [M, 3E]
    q, k, v = qkv.view(-1, 3, heads, head_dim).unbind(1)  # each [M, H, D]
    mixed = attend(q, k, v).reshape(-1, heads * head_dim)  # [M, E]
    hidden = hidden + torch.addmm(attn.c_proj.bias, mixed, attn.c_proj.weight)
    inner = torch.addmm(mlp.c_fc.bias, block.ln_2(hidden), mlp.c_fc.weight)  # [M, I]
    inner = F.gelu(inner, approximate=approximate)
    return hidden + torch.addmm(mlp.c_proj.bias, inner, mlp.c_proj.weight)
