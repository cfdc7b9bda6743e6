"""Prompt+response rows as one flat token tensor, and their response-token log-probs (packed or padded).

A stage reads its rows from the dock in the packed layout: prompts flat [P] with lengths [B],
responses flat [R] with lengths [B]. `ResponseBatch` interleaves them into one flat [N] tensor
(prompt_0, response_0, prompt_1, ...) with index arithmetic, so no stage goes through Python lists
or a padded copy it does not compute in. Values that live on response tokens (log-probs,
reference log-probs) are flat [R], row after row, exactly as the dock stores them.

`response_logprobs` runs the model either on the packed row (remove padding: one row of N tokens,
varlen attention, no compute on pads) or on a right-padded [B, L] grid, and returns the log-prob
of every response token under the model, [R], plus the entropy there.

Legend: B rows, N = sum(p_i + r_i) tokens, R = sum(r_i) response tokens, L = max(p_i + r_i), V vocab.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from entrepot.grpo.algo.chunked_head import chunked_logprobs
from entrepot.grpo.embedded import gpt2_forward, llama_forward
from entrepot.grpo.embedded.gpt2_model import EmbeddedGPT2
from entrepot.grpo.embedded.shared_prefix import (
    cached_shared_prefix_layout,
    segment_starts,
    shared_prefix_attention,
)

__all__ = [
    "PACKED_ATTENTION",
    "PackedRow",
    "ResponseBatch",
    "packed_attention",
    "packed_row",
    "response_logprobs",
    "segment_index",
    "written_out_forward",
]

PACKED_ATTENTION = "entrepot_packed"


def segment_index(lengths: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Flat positions of the elements of segments `rows`, in that order, in a flat tensor of segments.

    Args:
        lengths: int64 [B] segment lengths of the flat tensor.
        rows: int64 [K] the segments to take.

    Returns:
        int64 [sum(lengths[rows])].
    """
    picked = lengths[rows]  # [K]
    shift = segment_starts(lengths)[rows] - segment_starts(picked)  # [K] source start - destination start
    return torch.arange(int(picked.sum()), device=lengths.device) + torch.repeat_interleave(shift, picked)


@dataclass(frozen=True)
class ResponseBatch:
    """B prompt+response sequences laid end to end.

    Attributes:
        tokens: int64 [N], row i is prompt_i followed by response_i.
        prompt_lengths: int64 [B].
        response_lengths: int64 [B].
    """

    tokens: torch.Tensor
    prompt_lengths: torch.Tensor
    response_lengths: torch.Tensor

    @classmethod
    def from_packed(
        cls,
        prompts: torch.Tensor,
        prompt_lengths: torch.Tensor,
        responses: torch.Tensor,
        response_lengths: torch.Tensor,
    ) -> ResponseBatch:
        """Interleave packed prompts [P] and responses [R] (with their [B] lengths) into one flat row."""
        prompt_lengths = prompt_lengths.to(torch.int64)
        response_lengths = response_lengths.to(torch.int64)
        lengths = prompt_lengths + response_lengths  # [B]
        starts = segment_starts(lengths)  # [B]
        tokens = torch.empty(int(lengths.sum()), dtype=torch.int64)  # [N]
        prompt_at = torch.repeat_interleave(starts - segment_starts(prompt_lengths), prompt_lengths)
        tokens[torch.arange(prompts.numel()) + prompt_at] = prompts.to(torch.int64)
        response_at = torch.repeat_interleave(
            starts + prompt_lengths - segment_starts(response_lengths), response_lengths
        )
        tokens[torch.arange(responses.numel()) + response_at] = responses.to(torch.int64)
        return cls(tokens, prompt_lengths, response_lengths)

    @property
    def num_rows(self) -> int:
        return int(self.prompt_lengths.numel())

    @property
    def lengths(self) -> torch.Tensor:
        """int64 [B] tokens per row."""
        return self.prompt_lengths + self.response_lengths

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_lengths.sum())

    def select(self, rows: torch.Tensor) -> ResponseBatch:
        """The sub-batch of `rows` (int64 [K]), in that order."""
        return ResponseBatch(
            self.tokens[segment_index(self.lengths, rows)],
            self.prompt_lengths[rows],
            self.response_lengths[rows],
        )

    def select_response_values(self, values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Per-response-token values [R] of this batch -> those of `rows`, in that order."""
        return values[segment_index(self.response_lengths, rows)]

    def per_token(self, per_row: torch.Tensor) -> torch.Tensor:
        """Broadcast one value per row [B] to each of the row's response tokens [R]."""
        return torch.repeat_interleave(per_row, self.response_lengths.to(per_row.device))

    def predicting_positions(self) -> torch.Tensor:
        """int64 [R] flat positions t whose next token t + 1 is a response token (the ones we score)."""
        first = (
            segment_starts(self.lengths) + self.prompt_lengths - 1
        )  # [B] predicts the first response token
        shift = first - segment_starts(self.response_lengths)
        return torch.arange(self.num_response_tokens) + torch.repeat_interleave(shift, self.response_lengths)

    def padded(self, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded input_ids [B, L] and attention_mask [B, L] (one scatter, no Python loop)."""
        lengths = self.lengths
        width = int(lengths.max()) if self.num_rows else 0
        mask = torch.arange(width)[None, :] < lengths[:, None]  # [B, L]
        input_ids = torch.full((self.num_rows, width), pad_token_id, dtype=torch.int64)
        input_ids[mask] = self.tokens
        return input_ids, mask.to(torch.int64)


def _packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """An HF attention function over one packed row: causal attention inside each sequence.

    query/key/value: [1, N_heads, T, D]; kwargs carry ``cu_seq_lens_q`` and ``max_length_q`` from the
    model call, or ``shared_prefix`` (a `SharedPrefixLayout`) for a row whose groups share their
    prompt. Returns [1, T, N_heads, D] as HF's attention functions do.
    """
    from entrepot.batching import packed_causal_attention

    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # each [T, heads, D]
    layout = kwargs.get("shared_prefix")
    if layout is not None:
        return shared_prefix_attention(q, k, v, layout, scaling).unsqueeze(0), None
    out = packed_causal_attention(
        q, k, v, kwargs["cu_seq_lens_q"], int(kwargs["max_length_q"]), softmax_scale=scaling
    )
    return out.unsqueeze(0), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def packed_attention(model: torch.nn.Module) -> Iterator[None]:
    """`model` (an HF module) attends with the varlen kernel inside the block; re-entering is a no-op.

    The attention choice lives on the shared config, so threads running one model
    (`entrepot.grpo.embedded.lanes`) enter this once around all of them: a per-call switch would
    restore it under another thread's feet.
    """
    from transformers import AttentionInterface, AttentionMaskInterface

    hf_module = model.hf_view() if isinstance(model, EmbeddedGPT2) else model  # the module HF's forward runs
    config: Any = hf_module.config
    previous = config._attn_implementation
    if previous == PACKED_ATTENTION:
        yield
        return
    AttentionInterface.register(PACKED_ATTENTION, _packed_attention)
    # No [N, N] mask: the varlen kernel masks by cu_seqlens.
    AttentionMaskInterface.register(PACKED_ATTENTION, _no_mask)
    config._attn_implementation = PACKED_ATTENTION  # only inside the block: the padded path stays eager
    try:
        yield
    finally:
        config._attn_implementation = previous


@dataclass(frozen=True)
class PackedRow:
    """A batch as one packed row, on the model's device, ready for a forward over it.

    Rows that share a prompt (a GRPO group) carry it once (`entrepot.grpo.embedded.shared_prefix`);
    otherwise the row is the sequences end to end under varlen causal attention.

    Attributes:
        ids: int64 [M] the row's tokens.
        position_ids: int64 [M] each token's position inside its sequence.
        keep: int64 [R] the positions whose next token is a response token.
        attend: the row's attention for the written-out forwards (q, k, v [M, H, D] -> [M, H, D]).
        hf_kwargs: what HF's forward takes for the same attention inside `packed_attention`.
    """

    ids: torch.Tensor
    position_ids: torch.Tensor
    keep: torch.Tensor
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    hf_kwargs: dict[str, Any]

    def written_out_args(self) -> tuple[Any, ...]:
        """(ids, position_ids, keep, attend): what a written-out forward takes after the model."""
        return self.ids, self.position_ids, self.keep, self.attend

    def hf_inputs(self) -> dict[str, Any]:
        """HF forward keyword arguments for the row (batch of one, no padding mask)."""
        mask = torch.ones(1, self.ids.numel(), dtype=torch.int64, device=self.ids.device)
        return {"input_ids": self.ids[None], "attention_mask": mask, "position_ids": self.position_ids[None],
                **self.hf_kwargs}  # fmt: skip


def packed_row(batch: ResponseBatch, keep: torch.Tensor, device: torch.device) -> PackedRow:
    """`batch` as one packed row (`keep` [R]: the flat positions predicting response tokens)."""
    layout = cached_shared_prefix_layout(batch.tokens, batch.prompt_lengths, batch.response_lengths)
    if layout is not None:
        prefix = layout  # narrowed to not-None for the closure
        return PackedRow(
            batch.tokens[layout.order].to(device),
            layout.position_ids.to(device),
            layout.keep.to(device),
            lambda q, k, v: shared_prefix_attention(q, k, v, prefix, q.shape[-1] ** -0.5),
            {"shared_prefix": layout},
        )
    from entrepot.batching import packed_causal_attention

    lengths = batch.lengths  # [B]
    starts = segment_starts(lengths)
    position_ids = torch.arange(batch.tokens.numel()) - torch.repeat_interleave(starts, lengths)  # [N]
    cu = F.pad(torch.cumsum(lengths, 0), (1, 0)).to(device=device, dtype=torch.int32)  # [B + 1]
    max_length = int(lengths.max())
    return PackedRow(
        batch.tokens.to(device),
        position_ids.to(device),
        keep.to(device),
        lambda q, k, v: packed_causal_attention(q, k, v, cu, max_length, softmax_scale=q.shape[-1] ** -0.5),
        {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max_length, "max_length_k": max_length},
    )


def written_out_forward(model: torch.nn.Module) -> Any:
    """The written-out forward module serving `model` (`gpt2_forward` / `llama_forward`), or None."""
    return next((f for f in (gpt2_forward, llama_forward) if f.supports(model)), None)


def _packed_logits(model: torch.nn.Module, batch: ResponseBatch, keep: torch.Tensor) -> torch.Tensor:
    """Logits [R, V] at flat positions `keep` of the packed row (the LM head runs on those only).

    GPT-2 and the Llama family run their written-out forward (`written_out_forward`), other models
    HF's.
    """
    row = packed_row(batch, keep, _device_of(model))
    written_out = written_out_forward(model)
    if written_out is not None:
        logits: torch.Tensor = written_out.packed_logits(model, *row.written_out_args())
        return logits
    with packed_attention(model):
        output = model(**row.hf_inputs(), logits_to_keep=row.keep)
    hf_logits: torch.Tensor = output.logits[0]  # [R, V]
    return hf_logits


def _padded_logits(
    model: torch.nn.Module, batch: ResponseBatch, keep: torch.Tensor, pad_token_id: int
) -> torch.Tensor:
    """Logits [R, V] at flat positions `keep`, computed on the right-padded [B, L] grid."""
    device = _device_of(model)
    input_ids, mask = batch.padded(pad_token_id)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]
    logits = model(
        input_ids=input_ids.to(device), attention_mask=mask.to(device), position_ids=position_ids.to(device)
    ).logits  # [B, L, V]
    row = torch.repeat_interleave(torch.arange(batch.num_rows), batch.response_lengths)  # [R]
    column = keep - segment_starts(batch.lengths)[row]  # [R] position inside the row
    return logits[row.to(device), column.to(device)]  # [R, V]


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def response_logprobs(
    model: torch.nn.Module,
    batch: ResponseBatch,
    *,
    packed: bool,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    pad_token_id: int = 0,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each response token under `model`, and the policy entropy at that position.

    Models whose logits are a plain linear head on the final hidden states (`algo.hidden_states`)
    get them through `algo.chunked_head`, a chunk of rows at a time (the [R, V] logits are never
    whole); the others through their full logits.

    Args:
        model: an HF causal LM.
        batch: the rows (on CPU; inputs are moved to the model's device).
        packed: run one packed row with varlen attention (remove padding) instead of a padded grid.
        with_entropy: also return the entropy of the next-token distribution.
        entropy_grad: keep the entropy in the autograd graph (only when it is in the loss).
        pad_token_id: fill of the padded grid.
        temperature: the distribution is softmax(logits / temperature) (a teacher and its student
            scored at the rollout's temperature); 1 leaves the logits untouched.

    Returns:
        logp [R] and entropy [R] (or None), on the model's device.
    """
    from entrepot.grpo.algo import hidden_states  # it builds on this module's rows and attention

    keep = batch.predicting_positions()  # [R]
    labels = batch.tokens[keep + 1]  # [R]
    head = hidden_states.head_weight(model)
    if head is not None:
        if packed:
            hidden = hidden_states.packed_hidden(model, batch, keep)
        else:
            hidden = hidden_states.padded_hidden(model, batch, keep, pad_token_id)
        return chunked_logprobs(hidden, head, labels.to(hidden.device), with_entropy=with_entropy,
                                entropy_grad=entropy_grad, temperature=temperature)  # fmt: skip
    if packed:
        logits = _packed_logits(model, batch, keep)
    else:
        logits = _padded_logits(model, batch, keep, pad_token_id)
    logits = logits.float() if temperature == 1.0 else logits.float() / temperature  # [R, V]
    log_probs = F.log_softmax(logits, dim=-1)  # [R, V]
    labels = labels.to(log_probs.device)  # [R]
    logp = log_probs.gather(-1, labels[:, None]).squeeze(-1)  # [R]
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(log_probs.exp() * log_probs).sum(-1)  # [R]
    return logp, entropy
