"""The embedded rollout engine: GPT-2 generation with a KV cache, holding weights in the inference layout.

Like vLLM, the engine owns its own weight tensors in an inference layout (nn.Linear-style [out, in]
matrices, fused ``qkv_proj``) and receives new weights through `load_weights(named_tensors)` after
each update, from the resharder. The training model is never called during generation.

The inference layout's names and shapes are in `entrepot.grpo.embedded.gpt2_layout`.

Shape legend: B = sequences, S = cached positions, H = hidden, N = heads, D = head dim, V = vocab.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from entrepot.grpo.embedded.gpt2_layout import gpt2_infer_meta, gpt2_infer_to_hf
from entrepot.grpo.embedded.lanes import run_lanes
from entrepot.grpo.engines.base import Rollout, SamplingParams
from entrepot.resharding.adaptors.gpt2 import gpt2_activation

if TYPE_CHECKING:
    from entrepot.grpo.config import EngineConfig

__all__ = ["GPT2RolloutEngine", "build_embedded_engine"]


def _flat_ids(prompts: Sequence[Sequence[int] | torch.Tensor]) -> torch.Tensor:
    """The prompts' token ids end to end, int64 [sum of lengths] (one cat or one tensor, no per-row op)."""
    if any(isinstance(p, torch.Tensor) for p in prompts):
        return torch.cat([torch.as_tensor(p, dtype=torch.long).reshape(-1).cpu() for p in prompts])
    return torch.tensor([token for p in prompts for token in p], dtype=torch.long)


def _left_padded(
    flat: torch.Tensor, lengths: list[int], width: int, total: int, pad_token_id: int,
    device: str | torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Prompt ids left-padded to [B, width], and the key mask [B, total], true on their tokens."""
    key_mask = torch.zeros(len(lengths), total, dtype=torch.bool)
    key_mask[:, :width] = torch.arange(width)[None, :] >= (width - torch.tensor(lengths))[:, None]
    ids = torch.full((len(lengths), width), pad_token_id, dtype=torch.long)
    ids[key_mask[:, :width]] = flat  # row-major: each row's tokens in order, after its padding
    return ids.to(device), key_mask.to(device)


# Most bytes of sampling noise drawn before decoding, so that lanes can split a batch (the default
# model's batch needs 0.13 MB; a 50k vocabulary at 256 rows x 512 tokens would need 26 GB).
_NOISE_BYTES = 64 * 2**20


class GPT2RolloutEngine:
    """Batched sampling with a KV cache over GPT-2 weights in the inference layout.

    Args:
        num_layers, num_heads, hidden, vocab, positions: the architecture (from the HF config).
        device: where weights and caches live.
        layer_norm_eps: LayerNorm epsilon of the checkpoint.
        activation: the MLP activation, as HF GPT-2 names it (``activation_function``).
        lanes: threads a batch is decoded on, each taking a contiguous part of the rows
            (`entrepot.grpo.embedded.lanes`); the samples do not depend on it (see `generate`).
    """

    readable_weights = True
    tensor_parallel = 1

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
    ) -> None:
        self.num_layers, self.num_heads, self.hidden = num_layers, num_heads, hidden
        self.lanes = lanes
        self.activation = gpt2_activation(activation)
        self.vocab, self.positions, self.eps = vocab, positions, layer_norm_eps
        self.device = torch.device(device)
        self.meta = gpt2_infer_meta(num_layers, hidden, vocab, positions)
        self.weights: dict[str, torch.Tensor] = {
            name: torch.zeros(shape, dtype=dtype, device=self.device)
            for name, (shape, dtype) in self.meta.items()
        }
        self._loaded: set[str] = set()

    @classmethod
    def from_hf_config(
        cls, hf_config: object, device: str | torch.device = "cpu", lanes: int = 1
    ) -> GPT2RolloutEngine:
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
        )

    # -- the InferenceEngine protocol ----------------------------------------------------------

    @torch.no_grad()
    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
    ) -> None:
        """Copy inference-layout tensors into the engine's own storage (shapes must match)."""
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        for name, tensor in items:
            if name not in self.weights:
                raise KeyError(
                    f"inference weight {name!r} is unknown; expected names like {next(iter(self.meta))!r}"
                )
            target = self.weights[name]
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(
                    f"inference weight {name!r}: shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                )
            target.copy_(tensor)
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
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        start: int,
        key_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Run tokens at cache slots [start, start + Q) and return last-position logits [B, V].

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
        return F.linear(x, w["transformer.wte.weight"])  # tied LM head  # [B, V]

    def _prefill(
        self,
        flat: list[int],
        lengths: list[int],
        ids: torch.Tensor,
        positions: torch.Tensor,
        key_mask: torch.Tensor,
        total: int,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Run the prompts ids [B, Lp]: last-position logits [B, V], the KV cache [B, N, total, D] per layer.

        `flat` holds the prompts' ids end to end, `lengths` each one's. Each distinct prompt runs
        once (GRPO repeats every prompt n times); its rows copy the result.
        """
        slot: dict[tuple[int, ...], int] = {}
        unique: list[int] = []  # the first row of each distinct prompt
        inverse: list[int] = []  # each row's distinct prompt
        start = 0
        for row, length in enumerate(lengths):
            key = tuple(flat[start : start + length])
            start += length
            if key not in slot:
                slot[key] = len(unique)
                unique.append(row)
            inverse.append(slot[key])
        d = self.hidden // self.num_heads
        cache = [
            (
                torch.zeros(len(unique), self.num_heads, total, d, device=ids.device),
                torch.zeros(len(unique), self.num_heads, total, d, device=ids.device),
            )
            for _ in range(self.num_layers)
        ]
        if len(unique) == len(inverse):
            return self._forward(ids, positions, cache, 0, key_mask), cache
        first = torch.tensor(unique, device=ids.device)
        logits = self._forward(ids[first], positions[first], cache, 0, key_mask[first])
        rows = torch.tensor(inverse, device=ids.device)
        return logits[rows], [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in cache]

    @staticmethod
    def _sample(logits: torch.Tensor, params: SamplingParams, noise: torch.Tensor | None) -> torch.Tensor:
        """Next token per row from logits [B, V] -> [B]; `noise` [B, V] is Gumbel noise (None: greedy).

        The Gumbel-max trick: argmax(logits / T + g) with g = -log(E), E ~ Exp(1), is a sample of
        softmax(logits / T), as `torch.multinomial` draws one, from noise drawn before decoding.
        """
        if params.temperature == 0 or noise is None:
            return logits.argmax(-1)
        logits = logits / params.temperature
        if params.top_k > 0:
            kth = logits.topk(min(params.top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # [B, 1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_logits, order = logits.sort(dim=-1, descending=True)  # [B, V]
            probs = sorted_logits.softmax(-1)
            drop = probs.cumsum(-1) - probs > params.top_p  # keep the smallest prefix reaching top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
        return (logits.float() + noise).argmax(-1)

    def _gumbel_noise(
        self, rows: int, steps: int, params: SamplingParams, generator: torch.Generator | None
    ) -> torch.Tensor | None:
        """Gumbel noise [steps, B, V] drawn in one call on the generator's device (None when greedy).

        `torch.multinomial` samples as argmax(p / E), E ~ Exp(1) [B, V], one block per step: drawn
        time-major, these are its draws, so a seed gives the samples it gave.
        """
        if params.temperature == 0:
            return None
        device = generator.device if generator is not None else torch.device("cpu")
        exponential = torch.empty(steps, rows, self.vocab, device=device).exponential_(generator=generator)
        return exponential.clamp_min_(torch.finfo(exponential.dtype).tiny).log_().neg_().to(self.device)

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """The weights by HF GPT2LMHeadModel name (the tied head left out)."""
        return gpt2_infer_to_hf(self.weights)

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int] | torch.Tensor],
        params: SamplingParams,
        *,
        pad_token_id: int = 0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """Sample one response per prompt (a stop token, kept, or the budget ends it), with each sampled
        token's log-prob under the raw logits (before temperature, top-k and top-p: the distribution
        the trainer's log-probs are of).

        Prompts are left-padded so that every row decodes in lock-step; position ids skip padding.
        With `lanes` > 1, contiguous parts of the rows decode on that many threads, each reading its
        rows' share of sampling noise drawn for the whole batch before decoding, so the samples do
        not depend on the split; where that noise would pass `_NOISE_BYTES` (a real vocabulary and
        budget), one thread decodes and draws each step's noise as it goes, which gives the same
        samples.
        """
        if len(self._loaded) != len(self.meta):
            missing = sorted(set(self.meta) - self._loaded)[:3]
            raise RuntimeError(f"rollout engine has no weights for {missing}...; call load_weights first")
        prompt_len = max(len(p) for p in prompts)
        if prompt_len + params.max_new_tokens > self.positions:  # learned positions cannot extrapolate
            budget = f"prompt ({prompt_len}) + max_new_tokens ({params.max_new_tokens})"
            raise ValueError(f"{budget} exceeds the model's {self.positions} positions")
        b, steps = len(prompts), params.max_new_tokens
        lanes = max(1, min(self.lanes, b))
        if lanes == 1 or steps * b * self.vocab * 4 > _NOISE_BYTES:
            return self._decode(prompts, lambda t: self._gumbel_noise(b, 1, params, generator), params,
                                pad_token_id)  # fmt: skip
        noise = self._gumbel_noise(b, steps, params, generator)
        bounds = [b * lane // lanes for lane in range(lanes + 1)]

        def decode(part: tuple[int, int]) -> Rollout:
            rows = slice(*part)
            return self._decode(
                prompts[rows],
                lambda t: None if noise is None else noise[t : t + 1, rows],
                params,
                pad_token_id,
            )

        decoded = run_lanes(decode, list(itertools.pairwise(bounds)))
        return Rollout(
            torch.cat([part.tokens for part in decoded]),
            torch.cat([part.lengths for part in decoded]),
            torch.cat([part.logprobs for part in decoded]),
        )

    def _decode(
        self,
        prompts: Sequence[Sequence[int] | torch.Tensor],
        noise: Callable[[int], torch.Tensor | None],
        params: SamplingParams,
        pad_token_id: int,
    ) -> Rollout:
        """Decode the rows of `prompts`; `noise(t)` is step t's Gumbel noise [1, B, V] (None: greedy)."""
        b, dev = len(prompts), self.device
        prompt_len = max(len(p) for p in prompts)
        total = prompt_len + params.max_new_tokens
        lengths_in = [len(p) for p in prompts]
        flat = _flat_ids(prompts)
        ids, key_mask = _left_padded(flat, lengths_in, prompt_len, total, pad_token_id, dev)
        positions = (key_mask[:, :prompt_len].long().cumsum(-1) - 1).clamp(min=0)  # [B, Lp]
        next_pos = key_mask[:, :prompt_len].sum(-1)  # [B]
        logits, cache = self._prefill(flat.tolist(), lengths_in, ids, positions, key_mask, total)
        stop = torch.tensor(params.stop_token_ids, dtype=torch.long, device=dev)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        out = torch.full((b, params.max_new_tokens), pad_token_id, dtype=torch.long, device=dev)
        out_logp = torch.zeros(b, params.max_new_tokens, dtype=torch.float32, device=dev)
        lengths = torch.zeros(b, dtype=torch.long, device=dev)
        for t in range(params.max_new_tokens):
            step_noise = noise(t)
            token = self._sample(logits, params, None if step_noise is None else step_noise[0])  # [B]
            token = torch.where(done, torch.full_like(token, pad_token_id), token)
            out[:, t] = token
            out_logp[:, t] = logits.float().log_softmax(-1).gather(1, token[:, None]).squeeze(1)
            lengths += (~done).long()
            done = done | torch.isin(token, stop)
            if bool(done.all()) or t == params.max_new_tokens - 1:
                break
            key_mask[:, prompt_len + t] = True
            logits = self._forward(token[:, None], next_pos[:, None], cache, prompt_len + t, key_mask)
            next_pos = next_pos + 1
        kept = torch.arange(out.shape[1], device=dev)[None, :] < lengths[:, None]  # [B, T] generated
        return Rollout(out[kept].cpu(), lengths.cpu(), out_logp[kept].cpu())  # [R], [B], [R]


def build_embedded_engine(engine: EngineConfig, model: torch.nn.Module, lanes: int) -> GPT2RolloutEngine:
    """The embedded engine shaped like `model` (a GPT-2), decoding on `lanes` threads (the run's
    compute lanes, as the log-prob and update passes have)."""
    return GPT2RolloutEngine.from_hf_config(model.config, device=engine.device, lanes=lanes)
