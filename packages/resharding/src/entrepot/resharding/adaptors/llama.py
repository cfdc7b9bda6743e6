"""Llama-style decoders: Llama, Qwen2 (QKV bias) and Qwen3 (q/k norms) ``*ForCausalLM``.

The rules are driven by names, so optional weights (QKV bias, q/k norms, an untied
``lm_head``) convert when present and are simply absent otherwise.
"""

from __future__ import annotations

from functools import partial

import torch

from entrepot.resharding.adaptors._rules import Rule, rename
from entrepot.resharding.adaptors.base import WeightAdaptor
from entrepot.resharding.adaptors.layouts import (
    deinterleave_qkv,
    fuse_gate_up,
    fused_qkv_to_interleaved,
    interleave_qkv,
    interleaved_qkv_to_fused,
    split_gate_up,
)

__all__ = ["LlamaAdaptor", "attention_rules", "dense_mlp_rules", "embedding_rules"]

HF_LAYER = "model.layers.{}."
TRAIN_LAYER = "decoder.layers.{}."


def _drop(*tensors: torch.Tensor) -> tuple[()]:
    return ()


def embedding_rules(tied: bool) -> tuple[list[Rule], list[Rule]]:
    """(hf <-> train, train -> infer) rules for embeddings, final norm and LM head."""
    hf = [
        rename("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
        rename("model.norm.weight", "decoder.final_layernorm.weight"),
    ]
    infer = [
        rename("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
        rename("decoder.final_layernorm.weight", "model.norm.weight"),
    ]
    if tied:  # transformers lists the tied head in state_dict(); training and vLLM share the embedding
        hf.append(Rule(("lm_head.weight",), (), _drop))
    else:
        hf.append(rename("lm_head.weight", "output_layer.weight"))
        infer.append(rename("output_layer.weight", "lm_head.weight"))
    return hf, infer


def attention_rules(head_dim: int, heads_per_group: int) -> tuple[list[Rule], list[Rule]]:
    """(hf <-> train, train -> infer) rules for GQA attention with optional bias and q/k norms."""
    hf_attn, tr_attn = HF_LAYER + "self_attn.", TRAIN_LAYER + "self_attention."
    to_train = partial(interleave_qkv, head_dim=head_dim)
    from_train = partial(deinterleave_qkv, heads_per_group=heads_per_group, head_dim=head_dim)
    to_fused = partial(interleaved_qkv_to_fused, heads_per_group=heads_per_group, head_dim=head_dim)
    to_interleaved = partial(fused_qkv_to_interleaved, heads_per_group=heads_per_group, head_dim=head_dim)
    hf: list[Rule] = [rename(HF_LAYER + "input_layernorm.weight", TRAIN_LAYER + "input_layernorm.weight")]
    infer: list[Rule] = [rename(TRAIN_LAYER + "input_layernorm.weight", HF_LAYER + "input_layernorm.weight")]
    for kind in ("weight", "bias"):
        hf.append(
            Rule(
                tuple(f"{hf_attn}{p}_proj.{kind}" for p in "qkv"),
                (f"{tr_attn}linear_qkv.{kind}",),
                lambda q, k, v: (to_train(q, k, v),),
                from_train,
            )
        )
        infer.append(
            Rule(
                (f"{tr_attn}linear_qkv.{kind}",),
                (f"{hf_attn}qkv_proj.{kind}",),
                lambda t: (to_fused(t),),
                lambda t: (to_interleaved(t),),
            )
        )
    for hf_name, train_name in (
        ("o_proj.weight", "linear_proj.weight"),
        ("q_norm.weight", "q_layernorm.weight"),
        ("k_norm.weight", "k_layernorm.weight"),
    ):
        hf.append(rename(hf_attn + hf_name, tr_attn + train_name))
        infer.append(rename(tr_attn + train_name, hf_attn + hf_name))
    return hf, infer


def _fuse(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor]:
    return (fuse_gate_up(gate, up),)


def dense_mlp_rules(hf_mlp: str, train_mlp: str, infer_mlp: str) -> tuple[list[Rule], list[Rule]]:
    """(hf <-> train, train -> infer) rules for one gated MLP (gate/up fused into ``linear_fc1``)."""
    hf = [
        Rule(
            (hf_mlp + "gate_proj.weight", hf_mlp + "up_proj.weight"),
            (train_mlp + "linear_fc1.weight",),
            _fuse,
            split_gate_up,
        ),
        rename(hf_mlp + "down_proj.weight", train_mlp + "linear_fc2.weight"),
    ]
    infer = [
        rename(train_mlp + "linear_fc1.weight", infer_mlp + "gate_up_proj.weight"),
        rename(train_mlp + "linear_fc2.weight", infer_mlp + "down_proj.weight"),
    ]
    return hf, infer


def norm_rules() -> tuple[list[Rule], list[Rule]]:
    """The post-attention norm (``pre_mlp_layernorm`` in Megatron)."""
    hf_name, train_name = (
        HF_LAYER + "post_attention_layernorm.weight",
        TRAIN_LAYER + "pre_mlp_layernorm.weight",
    )
    return [rename(hf_name, train_name)], [rename(train_name, hf_name)]


# Training template -> (tp_dim, fused_chunks) for everything a Llama-style model has.
LLAMA_TP_SPECS: dict[str, tuple[int | None, int]] = {
    "embedding.word_embeddings.weight": (0, 1),
    "output_layer.weight": (0, 1),
    "decoder.final_layernorm.weight": (None, 1),
    TRAIN_LAYER + "input_layernorm.weight": (None, 1),
    TRAIN_LAYER + "self_attention.linear_qkv.weight": (0, 1),
    TRAIN_LAYER + "self_attention.linear_qkv.bias": (0, 1),
    TRAIN_LAYER + "self_attention.linear_proj.weight": (1, 1),
    TRAIN_LAYER + "self_attention.q_layernorm.weight": (None, 1),
    TRAIN_LAYER + "self_attention.k_layernorm.weight": (None, 1),
    TRAIN_LAYER + "pre_mlp_layernorm.weight": (None, 1),
    TRAIN_LAYER + "mlp.linear_fc1.weight": (0, 2),
    TRAIN_LAYER + "mlp.linear_fc2.weight": (1, 1),
}


class LlamaAdaptor(WeightAdaptor):
    """Llama / Qwen2 / Qwen3 dense decoders."""

    architectures = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

    def _parts(self) -> list[tuple[list[Rule], list[Rule]]]:
        d = self.dims
        return [
            embedding_rules(d.tie_word_embeddings),
            attention_rules(d.head_dim, d.heads_per_group),
            norm_rules(),
            dense_mlp_rules(HF_LAYER + "mlp.", TRAIN_LAYER + "mlp.", HF_LAYER + "mlp."),
        ]

    def hf_rules(self) -> list[Rule]:
        return [rule for hf, _ in self._parts() for rule in hf]

    def infer_rules(self) -> list[Rule]:
        return [rule for _, infer in self._parts() for rule in infer]

    def tp_specs(self) -> dict[str, tuple[int | None, int]]:
        return dict(LLAMA_TP_SPECS)
