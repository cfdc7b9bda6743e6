"""``DeepseekV3ForCausalLM`` / ``DeepseekV2ForCausalLM``: multi-head latent attention (MLA) + MoE.

As in MindSpeed-RL, the two down projections that read the hidden state, ``q_a_proj``
[q_lora, H] and ``kv_a_proj_with_mqa`` [kv_lora + rope, H], are one training-side
``linear_qkv`` (replicated across TP: it is small and its outputs feed per-head up
projections); the inference layout splits it again at row ``q_lora_rank``.
"""

from __future__ import annotations

from typing import Any

import torch

from entrepot.resharding.adaptors._rules import Rule, rename
from entrepot.resharding.adaptors.base import WeightAdaptor
from entrepot.resharding.adaptors.llama import (
    HF_LAYER,
    TRAIN_LAYER,
    dense_mlp_rules,
    embedding_rules,
    norm_rules,
)
from entrepot.resharding.adaptors.qwen3_moe import EXPERT_TP_SPECS, routed_expert_rules
from entrepot.resharding.errors import ShapeMismatchError

__all__ = ["DeepseekAdaptor"]

MLA_TP_SPECS: dict[str, tuple[int | None, int]] = {
    "embedding.word_embeddings.weight": (0, 1),
    "output_layer.weight": (0, 1),
    "decoder.final_layernorm.weight": (None, 1),
    TRAIN_LAYER + "input_layernorm.weight": (None, 1),
    TRAIN_LAYER + "pre_mlp_layernorm.weight": (None, 1),
    TRAIN_LAYER + "self_attention.linear_qkv.weight": (None, 1),
    TRAIN_LAYER + "self_attention.q_layernorm.weight": (None, 1),
    TRAIN_LAYER + "self_attention.linear_qb.weight": (0, 1),
    TRAIN_LAYER + "self_attention.kv_layernorm.weight": (None, 1),
    TRAIN_LAYER + "self_attention.linear_kvb.weight": (0, 1),
    TRAIN_LAYER + "self_attention.linear_proj.weight": (1, 1),
    TRAIN_LAYER + "mlp.linear_fc1.weight": (0, 2),
    TRAIN_LAYER + "mlp.linear_fc2.weight": (1, 1),
    TRAIN_LAYER + "mlp.router.expert_bias": (None, 1),
    TRAIN_LAYER + "mlp.shared_experts.linear_fc1.weight": (0, 2),
    TRAIN_LAYER + "mlp.shared_experts.linear_fc2.weight": (1, 1),
}


def mla_rules(q_lora_rank: int) -> tuple[list[Rule], list[Rule]]:
    """(hf <-> train, train -> infer) rules for MLA attention."""
    hf_attn, tr_attn = HF_LAYER + "self_attn.", TRAIN_LAYER + "self_attention."
    q_a, kv_a, qkv = (
        hf_attn + "q_a_proj.weight",
        hf_attn + "kv_a_proj_with_mqa.weight",
        tr_attn + "linear_qkv.weight",
    )

    def merge(q: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.cat([q, kv], dim=0),)  # [q_lora + kv_lora + rope, H]

    def split(merged: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, kv = merged.split([q_lora_rank, merged.shape[0] - q_lora_rank], dim=0)
        return q, kv

    pairs = [
        ("q_a_layernorm.weight", "q_layernorm.weight"),
        ("q_b_proj.weight", "linear_qb.weight"),
        ("kv_a_layernorm.weight", "kv_layernorm.weight"),
        ("kv_b_proj.weight", "linear_kvb.weight"),
        ("o_proj.weight", "linear_proj.weight"),
    ]
    hf = [Rule((q_a, kv_a), (qkv,), merge, split)]
    hf += [rename(hf_attn + h, tr_attn + t) for h, t in pairs]
    hf.append(rename(HF_LAYER + "input_layernorm.weight", TRAIN_LAYER + "input_layernorm.weight"))
    infer = [Rule((qkv,), (q_a, kv_a), split, merge)]
    infer += [rename(tr_attn + t, hf_attn + h) for h, t in pairs]
    infer.append(rename(TRAIN_LAYER + "input_layernorm.weight", HF_LAYER + "input_layernorm.weight"))
    return hf, infer


class DeepseekAdaptor(WeightAdaptor):
    """DeepSeek-V2 / V3: MLA attention, dense first layers, routed + shared experts."""

    architectures = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")

    def __init__(self, config: Any) -> None:
        if getattr(config, "q_lora_rank", None) is None:
            raise ShapeMismatchError(
                "DeepSeek adaptor needs q_lora_rank (the q_a_proj / q_b_proj pair); got q_lora_rank=None"
            )
        super().__init__(config)

    def _parts(self) -> list[tuple[list[Rule], list[Rule]]]:
        d = self.dims
        bias_hf, bias_train = (
            HF_LAYER + "mlp.gate.e_score_correction_bias",
            TRAIN_LAYER + "mlp.router.expert_bias",
        )
        shared_hf, shared_train = HF_LAYER + "mlp.shared_experts.", TRAIN_LAYER + "mlp.shared_experts."
        return [
            embedding_rules(d.tie_word_embeddings),
            mla_rules(int(d.q_lora_rank or 0)),
            norm_rules(),
            dense_mlp_rules(HF_LAYER + "mlp.", TRAIN_LAYER + "mlp.", HF_LAYER + "mlp."),
            dense_mlp_rules(shared_hf, shared_train, shared_hf),
            routed_expert_rules(),
            ([rename(bias_hf, bias_train)], [rename(bias_train, bias_hf)]),
        ]

    def hf_rules(self) -> list[Rule]:
        return [rule for hf, _ in self._parts() for rule in hf]

    def infer_rules(self) -> list[Rule]:
        return [rule for _, infer in self._parts() for rule in infer]

    def tp_specs(self) -> dict[str, tuple[int | None, int]]:
        return {**MLA_TP_SPECS, **EXPERT_TP_SPECS}
