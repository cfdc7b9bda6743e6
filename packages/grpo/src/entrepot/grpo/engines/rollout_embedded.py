"""The embedded rollout engine: GPT-2 generation with a KV cache, holding weights in the inference layout.

Like vLLM, the engine owns its own weight tensors in an inference layout (nn.Linear-style [out, in]
matrices, fused ``qkv_proj``) and receives new weights through `load_weights(named_tensors)` after
each update, from the resharder. The training model is never called during generation.

The inference layout's names and shapes are in `entrepot.grpo.embedded.gpt2_layout`.

Shape legend: B = sequences, S = cached positions, H = hidden, N = heads, D = head dim, V = vocab.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from entrepot.grpo.embedded.gpt2_layout import gpt2_infer_meta, gpt2_infer_to_hf
from entrepot.grpo.engines.kv_decoding import Cache, KVCacheDecoder, NamedTensors, named_items, weight_target
from entrepot.resharding.adaptors.gpt2 import gpt2_activation

if TYPE_CHECKING:
    from entrepot.grpo.config import EngineConfig

__all__ = ["GPT2RolloutEngine", "build_embedded_engine"]


class GPT2RolloutEngine(KVCacheDecoder):
    """Batched sampling with a KV cache over GPT-2 weights in the inference layout.

    Args:
        num_layers, num_heads, hidden, vocab, positions: the architecture (from the HF config).
        device: where weights and caches live.
        layer_norm_eps: LayerNorm epsilon of the checkpoint.
        activation: the MLP activation, as HF GPT-2 names it (``activation_function``).
        lanes: threads a batch is decoded on, each taking a contiguous part of the rows
            (`entrepot.grpo.embedded.lanes`); the samples do not depend on it (see `generate`).
        dtype: of the weights, KV cache and matmuls (``engine.rollout_dtype``); the last logits are
            upcast to float32 for sampling and log-probs.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_heads: int,
        hidden: int,
        vocab: int,
        positions: int,
        device: str | torch.device = "cpu",
        layer_norm_eps: float = 1e-5,
        activation: str = "gelu_new",
        lanes: int = 1,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.num_layers, self.num_heads, self.hidden = num_layers, num_heads, hidden
        self.lanes = lanes
        self.activation = gpt2_activation(activation)
        self.vocab, self.positions, self.eps = vocab, positions, layer_norm_eps
        self.device, self.dtype = torch.device(device), dtype
        self.meta = gpt2_infer_meta(num_layers, hidden, vocab, positions)
        self.weights: dict[str, torch.Tensor] = {
            name: torch.zeros(shape, dtype=dtype if kind.is_floating_point else kind, device=self.device)
            for name, (shape, kind) in self.meta.items()
        }
        self._loaded: set[str] = set()

    @classmethod
    def from_hf_config(
        cls, hf_config: object, device: str | torch.device = "cpu", lanes: int = 1,
        dtype: torch.dtype = torch.float32,
    ) -> GPT2RolloutEngine:  # fmt: skip
        """An engine shaped like an HF GPT2Config (weights still to be loaded)."""
        c = hf_config
        return cls(
            num_layers=c.n_layer,  # type: ignore[attr-defined]
            num_heads=c.n_head,  # type: ignore[attr-defined]
            hidden=c.n_embd,  # type: ignore[attr-defined]
            vocab=c.vocab_size,  # type: ignore[attr-defined]
            positions=c.n_positions,  # type: ignore[attr-defined]
            layer_norm_eps=c.layer_norm_epsilon,  # type: ignore[attr-defined]
            activation=c.activation_function,  # type: ignore[attr-defined]
            device=device,
            lanes=lanes,
            dtype=dtype,
        )

    # -- the InferenceEngine protocol ----------------------------------------------------------

    @torch.no_grad()
    def load_weights(self, named_tensors: NamedTensors) -> None:
        """Copy inference-layout tensors into the engine's own storage (shapes must match)."""
        for name, tensor in named_items(named_tensors):
            weight_target(self.weights, name, tensor).copy_(tensor)
            self._loaded.add(name)

    def offload(self) -> None:
        """Move weights to host memory (a no-op on CPU)."""
        self.weights = {k: v.to("cpu") for k, v in self.weights.items()}

    def resident_bytes(self) -> int:
        """Bytes of the weights held now (the KV cache lives only inside `generate`)."""
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    def onload(self, tags: Sequence[str] = ("weights", "kv_cache")) -> None:
        """Move weights back to the engine's device (the KV cache is allocated per generate call)."""
        self.weights = {k: v.to(self.device) for k, v in self.weights.items()}

    # -- forward -------------------------------------------------------------------------------

    def _layer_norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        w = self.weights
        return F.layer_norm(x, (self.hidden,), w[prefix + ".weight"], w[prefix + ".bias"], self.eps)

    def _linear(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.linear(x, self.weights[prefix + ".weight"], self.weights[prefix + ".bias"])

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: Cache,
        start: int,
        key_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Run tokens at cache slots [start, start + Q) and return last-position logits float32 [B, V].

        ids, positions: [B, Q]; cache: per layer (k, v) each [B, N, S, D]; key_mask: [B, S] bool.
        """
        w = self.weights
        n, d = self.num_heads, self.hidden // self.num_heads
        b, q = ids.shape
        x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][positions]  # [B, Q, H]
        end = start + q
        causal = torch.ones(q, end, dtype=torch.bool, device=ids.device).tril(diagonal=start)  # [Q, S']
        mask = causal[None, None] & key_mask[:, None, None, :end]  # [B, 1, Q, S']
        for i, (k_cache, v_cache) in enumerate(cache):
            p = f"transformer.h.{i}."
            qkv = self._linear(self._layer_norm(x, p + "ln_1"), p + "attn.qkv_proj")  # [B, Q, 3H]
            qh, kh, vh = qkv.view(b, q, 3, n, d).permute(2, 0, 3, 1, 4)  # each [B, N, Q, D]
            k_cache[:, :, start:end] = kh
            v_cache[:, :, start:end] = vh
            attn = F.scaled_dot_product_attention(
                qh, k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=mask
            )
            attn = attn.transpose(1, 2).reshape(b, q, self.hidden)  # [B, Q, H]
            x = x + self._linear(attn, p + "attn.c_proj")
            h = self._linear(self._layer_norm(x, p + "ln_2"), p + "mlp.c_fc")
            x = x + self._linear(self.activation(h), p + "mlp.c_proj")
        x = self._layer_norm(x[:, -1], "transformer.ln_f")  # [B, H]
        return F.linear(x, w["transformer.wte.weight"]).float()  # tied LM head, upcast  # [B, V]

    @property
    def max_positions(self) -> int:
        """Learned positions cannot extrapolate."""
        return self.positions

    def _new_cache(self, rows: int, total: int) -> Cache:
        """Keys and values [rows, N, total, D] per layer."""
        d = self.hidden // self.num_heads
        shape = (rows, self.num_heads, total, d)
        return [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(self.num_layers)
        ]

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """The weights by HF GPT2LMHeadModel name (the tied head left out)."""
        return gpt2_infer_to_hf(self.weights)


def build_embedded_engine(
    engine: EngineConfig, model: torch.nn.Module, lanes: int, dtype: torch.dtype
) -> GPT2RolloutEngine:
    """The embedded engine shaped like `model` (a GPT-2), decoding on `lanes` threads (the run's
    compute lanes, as the log-prob and update passes have) in `dtype` (`engine.rollout_dtype` resolved:
    `engines.rollout_dtype`)."""
    return GPT2RolloutEngine.from_hf_config(model.config, device=engine.device, lanes=lanes, dtype=dtype)
