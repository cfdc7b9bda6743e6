"""Final hidden states at the response positions, and the LM head weight, for `algo.chunked_head`.

The same forwards as `entrepot.grpo.algo.sequences`' logits paths (packed: shared-prefix or
varlen; padded), stopped before the LM head: the written-out forward of GPT-2 or the Llama family
(`entrepot.grpo.embedded.gpt2_forward` / `llama_forward`, `packed_hidden`), HF's decoder stack
otherwise. The head then runs a chunk of rows at a time. `head_weight` says which models qualify
(their logits are exactly hidden @ W^T); the others keep the logits paths.

Legend: B rows, N tokens, R response tokens, L = longest row, E hidden size, V vocab.
"""

from __future__ import annotations

from typing import Any

import torch

from entrepot.grpo.algo.sequences import ResponseBatch, packed_attention, packed_row, written_out_forward
from entrepot.grpo.embedded.gpt2_model import EmbeddedGPT2, hf_architecture
from entrepot.grpo.embedded.shared_prefix import segment_starts

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
    row = packed_row(batch, keep, next(model.parameters()).device)
    written_out = written_out_forward(model)
    if written_out is not None:
        hidden: torch.Tensor = written_out.packed_hidden(model, *row.written_out_args())
        return hidden
    with packed_attention(model):
        output = _decoder(model)(**row.hf_inputs(), use_cache=False)
    decoded: torch.Tensor = output.last_hidden_state[0, row.keep]  # [R, E]
    return decoded


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
