"""The Llama family's decoder maths, written out once: Llama, Qwen2 (qkv bias) and Qwen3 (q/k norm).

One `decoder_layer` serves the rollout engine's KV-cache decoding (`engines.rollout_llama`) and the
packed log-prob / update passes (`embedded.llama_forward`); they differ only in the weights they hand
it (`LayerWeights`: the HF module's own parameters, or the engine's fused copy) and in `attend`.
RMSNorm, SwiGLU (HF's ``hidden_act`` on the gate), grouped-query attention, RoPE with the
inverse frequencies and attention scaling transformers' ``ROPE_INIT_FUNCTIONS`` compute from the
config (default, linear, llama3, yarn, longrope below its original length; 'dynamic' is refused:
HF's own frequencies then depend on the longest sequence seen so far), optional biases on the
attention and MLP projections, Qwen3's per-head q/k RMSNorm before RoPE.

Legend: N tokens of one call, E hidden, H query heads, K key/value heads, D head dim, I MLP inner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from entrepot.grpo.embedded.gpt2_model import hf_architecture
from entrepot.grpo.errors import GRPOConfigError

__all__ = [
    "LLAMA_ARCHITECTURES",
    "Attend",
    "LayerWeights",
    "Linear",
    "LlamaDims",
    "decoder_layer",
    "module_layers",
    "rope_frequencies",
    "rope_tables",
    "unsupported",
]

LLAMA_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

Attend = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]  # q [N,H,D], k/v [N,K,D] -> [N,H,D]
Linear = tuple[torch.Tensor, torch.Tensor | None]  # (weight [out, in], bias [out] or None)


@dataclass(frozen=True)
class LlamaDims:
    """The sizes and switches of one Llama-family model, read from its HF module."""

    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inner: int
    vocab: int
    eps: float
    tied: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    act: str

    @classmethod
    def of(cls, model: torch.nn.Module) -> LlamaDims:
        """The dims of an HF Llama / Qwen2 / Qwen3 causal LM (its first layer says which weights exist)."""
        lm: Any = model
        config, layer = lm.config, lm.model.layers[0]
        attn, mlp = layer.self_attn, layer.mlp
        return cls(
            num_layers=len(lm.model.layers),
            hidden=config.hidden_size,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads or config.num_attention_heads,
            head_dim=attn.head_dim,
            inner=mlp.gate_proj.out_features,
            vocab=lm.model.embed_tokens.num_embeddings,
            eps=float(config.rms_norm_eps),
            tied=lm.lm_head.weight is lm.model.embed_tokens.weight,
            qkv_bias=attn.q_proj.bias is not None,
            o_bias=attn.o_proj.bias is not None,
            mlp_bias=mlp.gate_proj.bias is not None,
            qk_norm=getattr(attn, "q_norm", None) is not None,
            act=config.hidden_act,
        )

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's tensors. `qkv` and `gate_up` hold one fused projection or one per part.

    Attributes:
        input_norm, post_norm: RMSNorm weights [E].
        qkv: [(W [H*D + 2*K*D, E], b)] fused rows [Q; K; V], or [(Wq, bq), (Wk, bk), (Wv, bv)].
        q_norm, k_norm: Qwen3's per-head RMSNorm weights [D] (None otherwise).
        o: the output projection (W [E, H*D], b).
        gate_up: [(W [2I, E], b)] fused rows [gate; up], or [(Wg, bg), (Wu, bu)].
        down: (W [E, I], b).
    """

    input_norm: torch.Tensor
    qkv: list[Linear]
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: Linear
    post_norm: torch.Tensor
    gate_up: list[Linear]
    down: Linear


def _linear(module: Any) -> Linear:
    return module.weight, module.bias


def module_layers(model: torch.nn.Module) -> list[LayerWeights]:
    """The layers of an HF Llama-family LM as `LayerWeights` holding its own parameters (no copy)."""
    lm: Any = model
    layers = []
    for layer in lm.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        q_norm = getattr(attn, "q_norm", None)
        k_norm = getattr(attn, "k_norm", None)
        layers.append(
            LayerWeights(
                input_norm=layer.input_layernorm.weight,
                qkv=[_linear(attn.q_proj), _linear(attn.k_proj), _linear(attn.v_proj)],
                q_norm=None if q_norm is None else q_norm.weight,
                k_norm=None if k_norm is None else k_norm.weight,
                o=_linear(attn.o_proj),
                post_norm=layer.post_attention_layernorm.weight,
                gate_up=[_linear(mlp.gate_proj), _linear(mlp.up_proj)],
                down=_linear(mlp.down_proj),
            )
        )
    return layers


def unsupported(model: torch.nn.Module) -> str | None:
    """Why this module's maths is not the one written out here (None: it is)."""
    if hf_architecture(model) not in LLAMA_ARCHITECTURES:
        return f"architecture {hf_architecture(model)} is not one of {', '.join(LLAMA_ARCHITECTURES)}"
    lm: Any = model
    if any(getattr(layer.self_attn, "sliding_window", None) for layer in lm.model.layers):
        return "sliding-window attention (config use_sliding_window / layer_types)"
    if getattr(lm.config, "pretraining_tp", 1) not in (None, 1):
        return f"pretraining_tp={lm.config.pretraining_tp}"
    rope = _rope_parameters(lm.config)
    if not isinstance(rope, dict) or ("rope_type" not in rope and "rope_theta" not in rope):
        return "rope_parameters per layer type"
    kind = _rope_type(rope)
    if kind != "default" and kind not in _rope_functions():
        return f"rope_type {kind!r}"
    if "dynamic" in kind:
        return f"rope_type {kind!r} (its frequencies depend on the longest sequence seen)"
    return None


def _rope_parameters(config: Any) -> Any:
    return getattr(config, "rope_parameters", None) or {}


def _rope_type(rope: dict[str, Any]) -> str:
    return str(rope.get("rope_type", rope.get("type", "default")))


def _rope_functions() -> dict[str, Callable[..., tuple[torch.Tensor, float]]]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS


def rope_frequencies(config: Any, head_dim: int) -> tuple[torch.Tensor, float, int | None]:
    """RoPE's inverse frequencies float32 [D / 2], its attention scaling, and the positions it covers.

    Computed as HF's rotary embedding computes them at start (`ROPE_INIT_FUNCTIONS`; the default
    formula for ``default``). longrope uses its short factor, valid up to
    ``original_max_position_embeddings`` (returned as the limit; None: no limit).

    Raises:
        GRPOConfigError: a dynamic rope_type (HF recomputes its frequencies from the longest sequence
            seen, a state this engine does not reproduce).
    """
    rope = _rope_parameters(config)
    kind = _rope_type(rope)
    if "dynamic" in kind:
        raise GRPOConfigError(
            f"model config rope_parameters.rope_type={kind!r} is not supported by the llama kv-cache "
            "engine (allowed: default, linear, llama3, yarn, longrope); use engine.rollout: vllm"
        )
    if kind == "default":
        base = float(rope["rope_theta"])
        return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)), 1.0, None
    inv_freq, scaling = _rope_functions()[kind](config, None)
    limit = rope.get("original_max_position_embeddings") if kind == "longrope" else None
    return inv_freq.float(), float(scaling), None if limit is None else int(limit)


def rope_tables(
    inv_freq: torch.Tensor, scaling: float, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [N, 1, D] at positions [N] (as HF's rotary embedding: float32, then `dtype`)."""
    freqs = positions[:, None].float() * inv_freq.to(positions.device)[None, :]  # [N, D / 2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _project(x: torch.Tensor, parts: list[Linear], sizes: list[int]) -> list[torch.Tensor]:
    """x [N, E] through a fused projection (split into `sizes`) or through one projection per part."""
    if len(parts) == 1:
        weight, bias = parts[0]
        return list(F.linear(x, weight, bias).split(sizes, dim=-1))
    return [F.linear(x, weight, bias) for weight, bias in parts]


def _act(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name == "silu":
        return F.silu
    from transformers.activations import ACT2FN

    act: Callable[[torch.Tensor], torch.Tensor] = ACT2FN[name]
    return act


def decoder_layer(
    x: torch.Tensor, w: LayerWeights, dims: LlamaDims, cos: torch.Tensor, sin: torch.Tensor,
    attend: Attend,
) -> torch.Tensor:  # fmt: skip
    """One pre-norm decoder layer over tokens x [N, E] (cos / sin [N, 1, D]) -> [N, E].

    `attend` mixes the tokens (varlen causal, shared-prefix, or the KV cache); its softmax scale is
    1 / sqrt(D).
    """
    n, d = x.shape[0], dims.head_dim
    h = F.rms_norm(x, (dims.hidden,), w.input_norm, dims.eps)
    q, k, v = _project(h, w.qkv, [dims.q_size, dims.kv_size, dims.kv_size])
    q, k, v = q.view(n, dims.heads, d), k.view(n, dims.kv_heads, d), v.view(n, dims.kv_heads, d)
    if w.q_norm is not None and w.k_norm is not None:
        q, k = F.rms_norm(q, (d,), w.q_norm, dims.eps), F.rms_norm(k, (d,), w.k_norm, dims.eps)
    mixed = attend(_rotate(q, cos, sin), _rotate(k, cos, sin), v).reshape(n, dims.q_size)  # [N, H * D]
    x = x + F.linear(mixed, *w.o)
    h = F.rms_norm(x, (dims.hidden,), w.post_norm, dims.eps)
    gate, up = _project(h, w.gate_up, [dims.inner, dims.inner])
    return x + F.linear(_act(dims.act)(gate) * up, *w.down)
