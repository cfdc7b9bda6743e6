"""GPT-2's inference layout: the names and shapes the embedded rollout engine holds, and HF <-> it.

Inference-layout names are those of entrepot.resharding's GPT-2 adaptor (L = layer index):
``transformer.wte.weight`` [V, H] (also the tied LM head), ``transformer.wpe.weight`` [P, H],
``transformer.h.L.ln_1.{weight,bias}`` [H], ``transformer.h.L.attn.qkv_proj.{weight,bias}`` [3H, H] / [3H]
(rows [Q; K; V]), ``transformer.h.L.attn.c_proj.{weight,bias}`` [H, H] / [H], ``transformer.h.L.ln_2.*``,
``transformer.h.L.mlp.c_fc.{weight,bias}`` [4H, H] / [4H], ``transformer.h.L.mlp.c_proj.{weight,bias}``
[H, 4H] / [H], ``transformer.ln_f.{weight,bias}`` [H].
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["gpt2_hf_to_infer", "gpt2_infer_meta", "gpt2_infer_to_hf"]


def gpt2_infer_meta(
    num_layers: int, hidden: int, vocab: int, positions: int
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) of every inference-layout tensor of a GPT-2 model."""
    f32 = torch.float32
    meta: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        "transformer.wte.weight": ((vocab, hidden), f32),
        "transformer.wpe.weight": ((positions, hidden), f32),
        "transformer.ln_f.weight": ((hidden,), f32),
        "transformer.ln_f.bias": ((hidden,), f32),
    }
    for i in range(num_layers):
        p = f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            meta[p + ln + ".weight"] = ((hidden,), f32)
            meta[p + ln + ".bias"] = ((hidden,), f32)
        for name, out_dim, in_dim in (
            ("attn.qkv_proj", 3 * hidden, hidden),
            ("attn.c_proj", hidden, hidden),
            ("mlp.c_fc", 4 * hidden, hidden),
            ("mlp.c_proj", hidden, 4 * hidden),
        ):
            meta[p + name + ".weight"] = ((out_dim, in_dim), f32)
            meta[p + name + ".bias"] = ((out_dim,), f32)
    return meta


def gpt2_hf_to_infer(named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Convert HF GPT2LMHeadModel tensors to the inference layout by a direct local copy.

    A reference for tests and callers without the resharder; the workers go through
    entrepot.resharding's adaptor, whose output a test checks to be identical.
    HF's Conv1D weights are [in, out]; c_attn already fuses [Q | K | V] along out, so a transpose
    is all it takes. The tied ``lm_head.weight`` is dropped.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in named.items():
        mask_buffer = name.endswith(("attn.bias", "attn.masked_bias")) and tensor.dim() > 1
        if name == "lm_head.weight" or mask_buffer:
            continue  # tied head; causal-mask buffers of old checkpoints
        if ".attn.c_attn." in name:
            name = name.replace(".attn.c_attn.", ".attn.qkv_proj.")
        is_conv1d = name.startswith("transformer.h.") and name.endswith(".weight") and ".ln_" not in name
        out[name] = tensor.t() if is_conv1d else tensor
    return out


def gpt2_infer_to_hf(named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `gpt2_hf_to_infer`: inference-layout tensors -> HF GPT2LMHeadModel names (Conv1D)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in named.items():
        is_linear = name.startswith("transformer.h.") and name.endswith(".weight") and ".ln_" not in name
        out[name.replace(".attn.qkv_proj.", ".attn.c_attn.")] = (
            tensor.t().contiguous() if is_linear else tensor
        )
    return out
