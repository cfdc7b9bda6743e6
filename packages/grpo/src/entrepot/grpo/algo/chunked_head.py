"""The LM head, log-softmax and entropy of response positions, a chunk of rows at a time.

A forward that materialises the logits of every response token holds [R, V] float32 several times
over: the logits, their log-softmax, the entropy's product, and in the backward pass their
gradients. With a 49k vocabulary that is 200 KB a token and copy, gigabytes for a micro-batch of a
few thousand tokens. `chunked_logprobs` computes the same values from the final hidden states
[R, E] and the head weight [V, E] chunk by chunk: the forward keeps only [R] results, and the
backward (`_ChunkedHead.backward`) recomputes each chunk's logits, so at most one [rows, V] chunk
lives at a time. The maths per chunk are those of the unchunked path (log_softmax of float32
logits, the label gathered, entropy -sum p log p), so the values agree to float32 rounding.

Gradients, per row with p = softmax(z), z the logits, y the label:
    d logp / dz = onehot(y) - p
    d H / dz    = -p * (log p + H)
then dL/dh = (dL/dz) W and dL/dW = sum over rows of (dL/dz)^T h.

Legend: R response positions, E hidden size, V vocabulary, C rows of one chunk.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["CHUNK_BYTES", "chunk_rows", "chunked_logprobs"]

CHUNK_BYTES = 64 * 2**20  # float32 bytes of one chunk's logits: 341 rows at V = 49,152


def chunk_rows(vocab_size: int) -> int:
    """Rows per chunk whose float32 logits [C, V] fit `CHUNK_BYTES` (at least one)."""
    return max(1, CHUNK_BYTES // (4 * max(1, vocab_size)))


def _chunk_values(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """log_softmax [C, V] (float32) of one chunk's logits and the labels' log-probs [C]."""
    logits = (hidden @ weight.t()).float()  # [C, V]
    log_probs = F.log_softmax(logits, dim=-1)  # [C, V]
    return log_probs, log_probs.gather(-1, labels[:, None]).squeeze(-1)


class _ChunkedHead(torch.autograd.Function):
    """(hidden [R, E], weight [V, E], labels [R]) -> (logp [R], entropy [R]); see the module docstring."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, rows: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        num_rows = hidden.shape[0]
        logp = torch.empty(num_rows, dtype=torch.float32, device=hidden.device)  # [R]
        entropy = torch.zeros(num_rows, dtype=torch.float32, device=hidden.device)  # [R]
        for start in range(0, num_rows, rows):
            part = slice(start, start + rows)
            log_probs, logp[part] = _chunk_values(hidden[part], weight, labels[part])
            if with_entropy:
                entropy[part] = -(log_probs.exp() * log_probs).sum(-1)  # [C]
        ctx.save_for_backward(hidden, weight, labels, entropy)
        ctx.rows = rows
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        hidden, weight, labels, entropy = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if want_hidden else None  # [R, E]
        grad_weight = torch.zeros_like(weight) if want_weight else None  # [V, E]
        if grad_logp is None and grad_entropy is None:
            return grad_hidden, grad_weight, None, None, None
        for start in range(0, hidden.shape[0], ctx.rows):
            part = slice(start, start + ctx.rows)
            h = hidden[part]  # [C, E]
            log_probs, _ = _chunk_values(h, weight, labels[part])  # [C, V]
            # dL/dz = p * (-g_logp - g_H (log p + H)) + onehot(y) g_logp, built in place: two [C, V]
            probs = log_probs.exp()  # [C, V]
            g_logp = (
                torch.zeros(h.shape[0], device=h.device) if grad_logp is None else grad_logp[part].float()
            )
            if grad_entropy is not None:  # only with entropy_grad, so the entropy was computed
                g_entropy = grad_entropy[part].float()[:, None]  # [C, 1]
                grad_logits = log_probs.add_(entropy[part][:, None]).mul_(-g_entropy)  # [C, V]
                grad_logits.sub_(g_logp[:, None]).mul_(probs)
                del probs
            else:
                del log_probs
                grad_logits = probs.mul_(-g_logp[:, None])  # [C, V]
            grad_logits.scatter_add_(-1, labels[part][:, None], g_logp[:, None])
            grad_logits = grad_logits.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[part] = grad_logits @ weight  # [C, E]
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t(), h)  # [V, E], in place
        return grad_hidden, grad_weight, None, None, None


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    rows: int | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each label under logits hidden @ weight^T, and the entropy there, chunk by chunk.

    Args:
        hidden: [R, E] final hidden states (after the last norm) at the predicting positions.
        weight: [V, E] the LM head's weight (no bias).
        labels: int64 [R] the next tokens.
        with_entropy: also return the entropy.
        entropy_grad: keep the entropy in the autograd graph (only when it is in the loss).
        rows: rows per chunk; None = `chunk_rows(V)`.
        temperature: the logits are (hidden @ weight^T) / temperature, computed as (hidden /
            temperature) @ weight^T (the same up to rounding; gradients flow through the division).

    Returns:
        logp [R] and entropy [R] (or None), float32, on `hidden`'s device. A lower-precision model
        (a bfloat16 reference) gets float32 logits: its hidden states and head are upcast first.
    """
    if weight.dtype != torch.float32:
        hidden, weight = hidden.float(), weight.float()
    if temperature != 1.0:
        hidden = hidden / temperature  # [R, E]
    logp, entropy = _ChunkedHead.apply(
        hidden, weight, labels, rows or chunk_rows(weight.shape[0]), with_entropy
    )
    if not with_entropy:
        return logp, None
    return logp, entropy if entropy_grad and torch.is_grad_enabled() else entropy.detach()
