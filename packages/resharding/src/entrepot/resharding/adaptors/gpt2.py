"""``GPT2LMHeadModel`` (the GRPO embedded default): learned positions, LayerNorm with bias, GELU MLP.

HF GPT-2 stores ``Conv1D`` weights as ``[in, out]``; training and inference both use
``nn.Linear``'s ``[out, in]``. ``c_attn`` holds ``[Q | K | V]`` along ``out``: training
interleaves it per head (Megatron, groups = heads), inference keeps ``qkv_proj`` = ``[Q; K; V]``.
The LM head is tied to ``wte`` and exists in neither the training nor the inference layout.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from entrepot.resharding.adaptors._rules import Rule, rename
from entrepot.resharding.adaptors.base import WeightAdaptor
from entrepot.resharding.adaptors.layouts import (
    deinterleave_qkv,
    fused_qkv_to_interleaved,
    interleave_qkv,
    interleaved_qkv_to_fused,
)
from entrepot.resharding.errors import UnknownArchitectureError

__all__ = ["GPT2Adaptor", "gpt2_activation"]

HF, TR = "transformer.h.{}.", "decoder.layers.{}."


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# HF GPT2Config.activation_function -> the function: the three tanh GELUs are one formula (HF computes
# "gelu_new" and "gelu_fast" in several elementwise ops, "gelu_pytorch_tanh" in one fused kernel)
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_new": _gelu_tanh, "gelu_fast": _gelu_tanh, "gelu_pytorch_tanh": _gelu_tanh,
    "gelu": F.gelu, "relu": F.relu, "silu": F.silu, "swish": F.silu,
}  # fmt: skip


def gpt2_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MLP activation an HF GPT-2 config names (``activation_function``); unknown names are an error."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise UnknownArchitectureError(
            f"GPT-2 activation_function {name!r} is not supported; known: {', '.join(_ACTIVATIONS)}"
        ) from None


def _transposed(tensor: torch.Tensor) -> tuple[torch.Tensor]:
    return (tensor.t().contiguous(),)


def _conv1d(hf_name: str, train_name: str) -> Rule:
    """An HF ``Conv1D`` weight [in, out] <-> a Linear weight [out, in]."""
    return Rule((hf_name,), (train_name,), _transposed, _transposed)


def _drop(*tensors: torch.Tensor) -> tuple[()]:
    return ()


class GPT2Adaptor(WeightAdaptor):
    """GPT-2 (multi-head attention: one KV group per head)."""

    architectures = ("GPT2LMHeadModel",)

    def hf_rules(self) -> list[Rule]:
        head_dim = self.dims.head_dim

        def qkv_to_train(c_attn: torch.Tensor) -> tuple[torch.Tensor]:
            # weight [H, 3H] (in, out) -> rows [3H, H]; bias [3H] stays 1-D
            rows = c_attn.t() if c_attn.dim() == 2 else c_attn
            q, k, v = rows.chunk(3, dim=0)
            return (interleave_qkv(q, k, v, head_dim),)

        def qkv_to_hf(qkv: torch.Tensor) -> tuple[torch.Tensor]:
            fused = torch.cat(deinterleave_qkv(qkv, 1, head_dim), dim=0)
            return (fused.t().contiguous() if fused.dim() == 2 else fused,)

        rules = [
            rename("transformer.wte.weight", "embedding.word_embeddings.weight"),
            rename("transformer.wpe.weight", "embedding.position_embeddings.weight"),
            Rule(("lm_head.weight",), (), _drop),
            Rule(
                (HF + "attn.c_attn.weight",),
                (TR + "self_attention.linear_qkv.weight",),
                qkv_to_train,
                qkv_to_hf,
            ),
            Rule(
                (HF + "attn.c_attn.bias",), (TR + "self_attention.linear_qkv.bias",), qkv_to_train, qkv_to_hf
            ),
            _conv1d(HF + "attn.c_proj.weight", TR + "self_attention.linear_proj.weight"),
            rename(HF + "attn.c_proj.bias", TR + "self_attention.linear_proj.bias"),
            _conv1d(HF + "mlp.c_fc.weight", TR + "mlp.linear_fc1.weight"),
            rename(HF + "mlp.c_fc.bias", TR + "mlp.linear_fc1.bias"),
            _conv1d(HF + "mlp.c_proj.weight", TR + "mlp.linear_fc2.weight"),
            rename(HF + "mlp.c_proj.bias", TR + "mlp.linear_fc2.bias"),
        ]
        for kind in ("weight", "bias"):
            rules += [
                rename(f"{HF}ln_1.{kind}", f"{TR}input_layernorm.{kind}"),
                rename(f"{HF}ln_2.{kind}", f"{TR}pre_mlp_layernorm.{kind}"),
                rename(f"transformer.ln_f.{kind}", f"decoder.final_layernorm.{kind}"),
            ]
        return rules

    def infer_rules(self) -> list[Rule]:
        to_fused = partial(interleaved_qkv_to_fused, heads_per_group=1, head_dim=self.dims.head_dim)
        to_interleaved = partial(fused_qkv_to_interleaved, heads_per_group=1, head_dim=self.dims.head_dim)
        rules = [
            rename("embedding.word_embeddings.weight", "transformer.wte.weight"),
            rename("embedding.position_embeddings.weight", "transformer.wpe.weight"),
        ]
        for kind in ("weight", "bias"):
            rules += [
                Rule(
                    (f"{TR}self_attention.linear_qkv.{kind}",),
                    (f"{HF}attn.qkv_proj.{kind}",),
                    lambda t: (to_fused(t),),
                    lambda t: (to_interleaved(t),),
                ),
                rename(f"{TR}self_attention.linear_proj.{kind}", f"{HF}attn.c_proj.{kind}"),
                rename(f"{TR}mlp.linear_fc1.{kind}", f"{HF}mlp.c_fc.{kind}"),
                rename(f"{TR}mlp.linear_fc2.{kind}", f"{HF}mlp.c_proj.{kind}"),
                rename(f"{TR}input_layernorm.{kind}", f"{HF}ln_1.{kind}"),
                rename(f"{TR}pre_mlp_layernorm.{kind}", f"{HF}ln_2.{kind}"),
                rename(f"decoder.final_layernorm.{kind}", f"transformer.ln_f.{kind}"),
            ]
        return rules

    def tp_specs(self) -> dict[str, tuple[int | None, int]]:
        return {
            "embedding.word_embeddings.weight": (0, 1),
            "embedding.position_embeddings.weight": (None, 1),
            TR + "self_attention.linear_qkv.weight": (0, 1),
            TR + "self_attention.linear_qkv.bias": (0, 1),
            TR + "self_attention.linear_proj.weight": (1, 1),
            TR + "self_attention.linear_proj.bias": (None, 1),
            TR + "mlp.linear_fc1.weight": (0, 1),
            TR + "mlp.linear_fc1.bias": (0, 1),
            TR + "mlp.linear_fc2.weight": (1, 1),
            TR + "mlp.linear_fc2.bias": (None, 1),
            TR + "input_layernorm.weight": (None, 1),
            TR + "input_layernorm.bias": (None, 1),
            TR + "pre_mlp_layernorm.weight": (None, 1),
            TR + "pre_mlp_layernorm.bias": (None, 1),
            "decoder.final_layernorm.weight": (None, 1),
            "decoder.final_layernorm.bias": (None, 1),
        }
