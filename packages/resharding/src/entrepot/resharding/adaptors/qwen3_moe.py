"""``Qwen3MoeForCausalLM``: Qwen3 attention with routed experts (no shared experts).

Experts are Megatron ``SequentialMLP`` weights in training (one ``linear_fc1`` / ``linear_fc2``
per expert, global expert index in the name) and vLLM ``FusedMoE`` stacks in inference
(``w13_weight`` [E_local, 2 * I / etp, H], ``w2_weight`` [E_local, H, I / etp]).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from entrepot.resharding.adaptors._rules import Rule, rename
from entrepot.resharding.adaptors.base import WeightAdaptor
from entrepot.resharding.adaptors.layouts import (
    fuse_gate_up,
    split_gate_up,
    stack_experts,
    unstack_experts,
)
from entrepot.resharding.adaptors.llama import (
    HF_LAYER,
    LLAMA_TP_SPECS,
    TRAIN_LAYER,
    attention_rules,
    dense_mlp_rules,
    embedding_rules,
    norm_rules,
)

__all__ = ["Qwen3MoeAdaptor", "routed_expert_rules"]

EXPERT_TP_SPECS: dict[str, tuple[int | None, int]] = {
    TRAIN_LAYER + "mlp.router.weight": (None, 1),
    TRAIN_LAYER + "mlp.experts.local_experts.{e}.linear_fc1.weight": (0, 2),
    TRAIN_LAYER + "mlp.experts.local_experts.{e}.linear_fc2.weight": (1, 1),
}


def _fuse(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor]:
    return (fuse_gate_up(gate, up),)


def _unstack_fused(
    gate_up: torch.Tensor, down: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return unstack_experts(gate_up), unstack_experts(down)


def _stack(fc1: Sequence[torch.Tensor], fc2: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return stack_experts(fc1), stack_experts(fc2)


def routed_expert_rules() -> tuple[list[Rule], list[Rule]]:
    """(hf <-> train, train -> infer) rules for routed experts and their router."""
    hf_experts = HF_LAYER + "mlp.experts."
    train_experts = TRAIN_LAYER + "mlp.experts.local_experts.{e}."
    fc1, fc2 = train_experts + "linear_fc1.weight", train_experts + "linear_fc2.weight"
    hf = [
        rename(HF_LAYER + "mlp.gate.weight", TRAIN_LAYER + "mlp.router.weight"),
        # Checkpoint layout: one gate/up/down per expert.
        Rule(
            (hf_experts + "{e}.gate_proj.weight", hf_experts + "{e}.up_proj.weight"),
            (fc1,),
            _fuse,
            split_gate_up,
        ),
        rename(hf_experts + "{e}.down_proj.weight", fc2),
        # transformers 5 in-memory layout: [E, 2I, H] and [E, H, I] stacks (read only).
        Rule((hf_experts + "gate_up_proj", hf_experts + "down_proj"), (fc1, fc2), _unstack_fused),
    ]
    infer = [
        rename(TRAIN_LAYER + "mlp.router.weight", HF_LAYER + "mlp.gate.weight"),
        Rule((fc1, fc2), (hf_experts + "w13_weight", hf_experts + "w2_weight"), _stack, _unstack_fused),
    ]
    return hf, infer


class Qwen3MoeAdaptor(WeightAdaptor):
    """Qwen3-MoE: GQA with q/k norms; sparse layers with routed experts, optional dense layers."""

    architectures = ("Qwen3MoeForCausalLM",)

    def _parts(self) -> list[tuple[list[Rule], list[Rule]]]:
        d = self.dims
        return [
            embedding_rules(d.tie_word_embeddings),
            attention_rules(d.head_dim, d.heads_per_group),
            norm_rules(),
            dense_mlp_rules(HF_LAYER + "mlp.", TRAIN_LAYER + "mlp.", HF_LAYER + "mlp."),
            routed_expert_rules(),
        ]

    def hf_rules(self) -> list[Rule]:
        return [rule for hf, _ in self._parts() for rule in hf]

    def infer_rules(self) -> list[Rule]:
        return [rule for _, infer in self._parts() for rule in infer]

    def tp_specs(self) -> dict[str, tuple[int | None, int]]:
        return {**LLAMA_TP_SPECS, **EXPERT_TP_SPECS}
