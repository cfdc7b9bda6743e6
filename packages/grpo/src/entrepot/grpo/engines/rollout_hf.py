"""A rollout engine for any local HF causal LM: HF `generate` over a module in HF layout.

The embedded GPT-2 engine (`rollout_embedded.py`) keeps its own fused inference layout; for other
architectures (Qwen2, Llama, ...) this engine holds a generation copy of the HF module, receives
HF-named weights through `LocalResharder(adaptor, target="hf")`, and samples with HF's
`generate`. Sampling draws from torch's global RNG (which checkpoints save and restore).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from entrepot.grpo.engines.base import Rollout, SamplingParams
from entrepot.grpo.errors import GRPOConfigError

if TYPE_CHECKING:
    from entrepot.grpo.config import EngineConfig

__all__ = ["HFRolloutEngine", "build_hf_engine", "unfused_weights"]


def unfused_weights(weights: Mapping[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """Fused Llama-style inference names -> HF names (views, no copies)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q_size = config.num_attention_heads * head_dim
    kv_size = getattr(config, "num_key_value_heads", config.num_attention_heads) * head_dim
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if ".qkv_proj." in name:
            for part, piece in zip("qkv", tensor.split([q_size, kv_size, kv_size]), strict=True):
                out[name.replace(".qkv_proj.", f".{part}_proj.")] = piece
        elif ".gate_up_proj." in name:
            gate, up = tensor.chunk(2)
            out[name.replace(".gate_up_proj.", ".gate_proj.")] = gate
            out[name.replace(".gate_up_proj.", ".up_proj.")] = up
        else:
            out[name] = tensor
    return out


def _engine_base() -> type:
    from entrepot.resharding.engines.torch import TorchInferenceEngine

    return TorchInferenceEngine


class HFRolloutEngine(_engine_base()):  # type: ignore[misc]
    """`TorchInferenceEngine` plus batched sampling with a KV cache (HF `generate`).

    Takes HF names, or the fused inference layout a `Resharder` produces for Llama-style models
    (``qkv_proj`` = [Q; K; V] rows, ``gate_up_proj`` = [gate; up]), which it splits back.

    Args:
        module: the generation copy of the model (its weights are overwritten on every load).
    """

    readable_weights = True
    tensor_parallel = 1

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy `weights` in place (fused ``qkv_proj`` / ``gate_up_proj`` are split into HF's)."""
        super().load_weights(unfused_weights(weights, self.module.config))

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """The generation copy's weights by HF name."""
        return dict(self.module.state_dict())

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int] | torch.Tensor],
        params: SamplingParams,
        *,
        pad_token_id: int = 0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """One response per prompt (left-padded batch; a stop token, kept, ends it), with each sampled
        token's log-prob under the raw logits (HF's ``output_logits``: before temperature, top-k and
        top-p)."""
        module = self.module
        device = next(module.parameters()).device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
            mask[row, width - len(p) :] = 1
        sample = params.temperature > 0
        out = module.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=params.top_k if sample else None,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=list(params.stop_token_ids) or None,
            pad_token_id=pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        tokens = out.sequences[:, width:].cpu()  # [B, T]
        raw = torch.stack(out.logits, 1).float().log_softmax(-1).cpu()  # [B, T, V]
        logp = raw.gather(2, tokens[:, :, None]).squeeze(2)  # [B, T]
        stop = torch.tensor(params.stop_token_ids, dtype=torch.long)
        stopped = torch.isin(tokens, stop).long()  # [B, T]
        after_stop = stopped.cumsum(1) - stopped  # [B, T] stop tokens before each position
        kept = after_stop == 0  # [B, T] up to and including the first stop token
        return Rollout(tokens[kept], kept.sum(1), logp[kept].contiguous())  # [R], [B], [R]


def build_hf_engine(engine: EngineConfig, model: torch.nn.Module, copy_module: bool) -> HFRolloutEngine:
    """HF `generate` over `model` (a copy of it when the trainer keeps training the original).

    Raises:
        GRPOConfigError: ``engine.rollout_dtype`` is bfloat16 (HF generate runs the policy's dtype).
    """
    if engine.rollout_dtype == "bfloat16":  # auto: the policy's float32
        raise GRPOConfigError(
            f"engine.rollout_dtype={engine.rollout_dtype!r}: the HF generate fallback for "
            f"{type(model).__name__} runs the policy's float32 weights; a bfloat16 rollout copy is built "
            "for Llama / Qwen2 / Qwen3 and GPT-2 only (set engine.rollout_dtype: float32)"
        )
    module = copy.deepcopy(model) if copy_module else model
    return HFRolloutEngine(module.requires_grad_(False).eval().to(engine.device))
