"""Final hidden states at the response positions, and the LM head weight, for `algo.chunked_head`.

The same forwards as `entrepot.grpo.algo.sequences`' logits paths (packed: shared-prefix or
varlen; padded), stopped before the LM head: the written-out forward of GPT-2 or the Llama family
(`entrepot.grpo.embedded.gpt2_forward` / `llama_forward`, `packed_hidden`), HF's decoder stack
otherwise. The head then
runs a chunk of rows at a time. `head_weight` says which models qualify (their logits are exactly
hidden @ W^T); the others keep the logits paths.

Legend: B rows, N tokens, R response tokens, L = longest row, E hidden size, V vocab.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from entrepot.grpo.algo.sequences import ResponseBatch, packed_attention
from entrepot.grpo.embedded import gpt2_forward, llama_forward
from entrepot.grpo.embedded.gpt2_model import EmbeddedGPT2, hf_architecture
from entrepot.grpo.embedded.shared_prefix import (
    cached_shared_prefix_layout,
    segment_starts,
    shared_prefix_attention,
)

__all__ = ["PLAIN_HEAD_ARCHITECTURES", "head_weight", "packed_hidden", "padded_hidden"]

# HF causal LMs whose logits are exactly lm_head(decoder(...).last_hidden_state): no logit scale,
# soft-capping or bias. Others keep the logits path.
PLAIN_HEAD_ARCHITECTURES = frozenset(
    {"GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
)


def head_weight(model: torch.nn.Module) -> torch.Tensor | None:
    """The LM head's weight [V, E] when `model`'s logits are hidden @ weight^T (else None).

    A peft model counts when its head is not adapted (LoRA on `lm_head` keeps the logits path).
    """
    if hf_architecture(_base_model(model)) not in PLAIN_HEAD_ARCHITECTURES:
        return None
    base: Any = _base_model(model)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else base.lm_head
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    weight: torch.Tensor = head.weight
    return weight


def _base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HF module under a peft wrapper (the module itself otherwise)."""
    get_base: Any = getattr(model, "get_base_model", None)
    return model if get_base is None else get_base()


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack of an HF causal LM (what runs before `lm_head`), peft adapters included."""
    base: Any = _base_model(model)
    if isinstance(base, EmbeddedGPT2):
        transformer: Any = base.hf_view().transformer
        return transformer
    decoder: torch.nn.Module = base.get_decoder()
    return decoder


def packed_hidden(model: torch.nn.Module, batch: ResponseBatch, keep: torch.Tensor) -> torch.Tensor:
    """Final hidden states [R, E] (after the last norm) at flat positions `keep` of the packed row.

    The same forward as `_packed_logits` without its LM head: a written-out forward, or HF's decoder
    (`use_cache=False`: a training forward builds no KV cache, and a checkpointed layer recomputes).
    """
    device = next(model.parameters()).device
    layout = cached_shared_prefix_layout(batch.tokens, batch.prompt_lengths, batch.response_lengths)
    written_out = next((f for f in (gpt2_forward, llama_forward) if f.supports(model)), None)
    if layout is not None and written_out is not None:
        prefix = layout  # narrowed to not-None for the closure
        return written_out.packed_hidden(
            model,
            batch.tokens[layout.order].to(device),
            layout.position_ids.to(device),
            layout.keep.to(device),
            lambda q, k, v: shared_prefix_attention(q, k, v, prefix, q.shape[-1] ** -0.5),
        )
    if layout is not None:
        with packed_attention(model):
            output = _decoder(model)(
                input_ids=batch.tokens[layout.order][None].to(device),
                attention_mask=torch.ones(1, layout.num_tokens, dtype=torch.int64, device=device),
                position_ids=layout.position_ids[None].to(device),
                shared_prefix=layout,
                use_cache=False,
            )
        shared: torch.Tensor = output.last_hidden_state[0, layout.keep.to(device)]  # [R, E]
        return shared
    lengths = batch.lengths  # [B]
    starts = segment_starts(lengths)
    position_ids = torch.arange(batch.tokens.numel()) - torch.repeat_interleave(starts, lengths)  # [N]
    cu = F.pad(torch.cumsum(lengths, 0), (1, 0)).to(device=device, dtype=torch.int32)  # [B + 1]
    max_length = int(lengths.max())
    if written_out is not None:
        from entrepot.batching import packed_causal_attention

        return written_out.packed_hidden(
            model,
            batch.tokens.to(device),
            position_ids.to(device),
            keep.to(device),
            lambda q, k, v: packed_causal_attention(
                q, k, v, cu, max_length, softmax_scale=q.shape[-1] ** -0.5
            ),
        )
    with packed_attention(model):
        output = _decoder(model)(
            input_ids=batch.tokens[None].to(device),
            attention_mask=torch.ones(1, batch.tokens.numel(), dtype=torch.int64, device=device),
            position_ids=position_ids[None].to(device),
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
            max_length_q=max_length,
            max_length_k=max_length,
            use_cache=False,
        )
    hidden: torch.Tensor = output.last_hidden_state[0, keep.to(device)]  # [R, E]
    return hidden


def padded_hidden(
    model: torch.nn.Module, batch: ResponseBatch, keep: torch.Tensor, pad_token_id: int
) -> torch.Tensor:
    """Final hidden states [R, E] at flat positions `keep`, computed on the right-padded [B, L] grid."""
    device = next(model.parameters()).device
    input_ids, mask = batch.padded(pad_token_id)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]
    hidden = _decoder(model)(
        input_ids=input_ids.to(device), attention_mask=mask.to(device), position_ids=position_ids.to(device),
        use_cache=False,
    ).last_hidden_state  # [B, L, E]  # fmt: skip
    row = torch.repeat_interleave(torch.arange(batch.num_rows), batch.response_lengths)  # [R]
    column = keep - segment_starts(batch.lengths)[row]  # [R] position inside the row
    picked: torch.Tensor = hidden[row.to(device), column.to(device)]  # [R, E]
    return picked
