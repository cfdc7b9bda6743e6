"""What the update's forward and backward add on top of the weights: activations and the LM head's logits.

`estimate_memory` (`entrepot.grpo.run.memory`) counts these for the torch training engine at the
update, its fullest moment on CPU. One micro-batch is in flight at a time (lanes split it, they do
not add to it), so the figures are those of the largest micro-batch the planner can form:

    rows     min(the rank's rows, update budget // longest sequence, update sequence cap)
    tokens   with remove_padding and groups of n > 1 samples, each group's prompt once
             (`embedded.shared_prefix`), else every row whole: prompt + response
    logits   rows x response budget positions, through the LM head

Activations are float32 values a decoder layer keeps for its backward pass, per token (E hidden,
Q = heads x head_dim, K = KV heads x head_dim, I the MLP width): its two norms' inputs and outputs
(4E), q, k, v before and after the rotary embedding (2(Q + 2K)), the attention output (Q) and the
MLP's gate, up, activation and product (4I); `ACTIVATION_SLACK` covers what the attention kernel and
the allocator add (fitted on SmolLM2-135M-Instruct, `BENCHMARKS.md`). With
`engine.activation_checkpointing` a layer keeps only its input (E) and one layer's whole set lives
during its recompute.

The logits: a plain LM head (Llama, Qwen2/3, Mistral, GPT-2: `algo.hidden_states.head_weight`) runs a
chunk of `algo.chunked_head.chunk_rows` rows at a time: about 3 float32 [C, V] buffers, and the
head's float32 gradient [V, E]. Other heads hold the whole [R, V] logits, their log-softmax, the
entropy's product and the gradient: 4 x R x V.

Left out: the log-prob passes (no_grad: one layer's activations at a time, below the update's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data.lengths import longest_sequence, response_budget

__all__ = ["ACTIVATION_SLACK", "UpdateWorkingSet", "update_lanes", "update_working_set"]

FLOAT32_BYTES = 4
ACTIVATION_SLACK = 1.25  # attention kernel scratch and allocator rounding over the saved tensors
LOGIT_BUFFERS = 3  # a chunk's logits, log-softmax and probabilities (or its gradient) at once
WHOLE_LOGIT_BUFFERS = 4  # logits, log-softmax, the entropy's product, the gradient


@dataclass(frozen=True)
class UpdateWorkingSet:
    """Bytes the update's largest micro-batch adds, and how they were counted.

    Attributes:
        activations: what the forward keeps for the backward pass (all layers).
        logits: the LM head's working set (chunked or whole).
        basis: one line of the counts used.
    """

    activations: int
    logits: int
    basis: str


def update_working_set(
    config: GRPOConfig, hf_config: Any, architecture: str, num_ranks: int
) -> UpdateWorkingSet:
    """The update's activations and logits per rank for `config`'s policy (`hf_config`, `architecture`)."""
    from entrepot.grpo.algo.chunked_head import chunk_rows
    from entrepot.grpo.algo.hidden_states import PLAIN_HEAD_ARCHITECTURES
    from entrepot.resharding.adaptors import ModelDims

    dims = ModelDims.from_config(hf_config)
    rollout, batching = config.rollout, config.batching
    longest = longest_sequence(config.data, rollout, config.multiturn)
    response = response_budget(config.data, rollout)
    if config.multiturn.enabled:
        response = config.multiturn.max_tokens
    prompt = longest - response
    group = rollout.n_samples_per_prompt
    rank_rows = -(-rollout.prompts_per_step // num_ranks) * group
    budget, max_seqs = batching.limits("update")
    rows = (
        min(rank_rows, max(1, budget // longest))
        if batching.dynamic_batch_size
        else batching.micro_batch_size
    )
    rows = min(rows, max_seqs or rows, rank_rows)
    shared = batching.remove_padding and group > 1
    tokens = (-(-rows // group) * prompt + rows * response) if shared else rows * longest
    hidden = dims.hidden_size
    inner = int(
        getattr(hf_config, "intermediate_size", None) or getattr(hf_config, "n_inner", None) or 4 * hidden
    )
    q, kv = dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
    per_layer = 4 * hidden + 2 * (q + 2 * kv) + q + 4 * inner  # float32 values per token, module docstring
    if config.engine.activation_checkpointing:
        values = tokens * (dims.num_layers * hidden + per_layer)
    else:
        values = tokens * dims.num_layers * per_layer
    activations = int(values * FLOAT32_BYTES * ACTIVATION_SLACK)
    positions = rows * response
    vocab = int(hf_config.vocab_size)
    if architecture in PLAIN_HEAD_ARCHITECTURES:
        chunk = min(positions, chunk_rows(vocab))
        logits = (LOGIT_BUFFERS * chunk * vocab + vocab * hidden) * FLOAT32_BYTES
        head = f"chunks of {chunk} rows"
    else:
        logits = WHOLE_LOGIT_BUFFERS * positions * vocab * FLOAT32_BYTES
        head = "whole logits"
    checkpointed = ", checkpointed" if config.engine.activation_checkpointing else ""
    basis = (
        f"update micro-batch of {rows} rows, {tokens} tokens{' (prompts shared)' if shared else ''} x "
        f"{dims.num_layers} layers{checkpointed}; LM head over {positions} positions in {head}"
    )
    return UpdateWorkingSet(activations, logits, basis)


def update_lanes(config: GRPOConfig) -> int:
    """The compute lanes the torch engine's update splits a micro-batch over (`embedded.lanes`)."""
    from entrepot.grpo.embedded.lanes import compute_lanes
    from entrepot.grpo.run.deployment import uses_ray

    on_ray = uses_ray(config.resources, config.parallel, config.dock)
    from entrepot.grpo.engines.registry import choose_engines

    splits = choose_engines(config.engine).train.lanes
    return compute_lanes(config.threads, device=config.engine.device, splits=splits, on_ray=on_ray)
