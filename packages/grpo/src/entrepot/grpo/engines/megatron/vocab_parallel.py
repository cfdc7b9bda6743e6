"""Log-probs and entropy of vocab-parallel logits: each TP rank holds V / TP columns of every row.

Only [R]-sized partial results cross ranks (a max, a sum of exponentials, the target logit and the
expected logit), never the [R, V] logits. The sums go through megatron-core's
`reduce_from_tensor_model_parallel_region` (all-reduce forward, identity backward), which is the
exact gradient because every TP rank computes the same loss from the reduced values.

Legend: R scored tokens, V vocabulary, TP tensor-parallel ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["vocab_parallel_logprobs"]


def vocab_parallel_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, *, with_entropy: bool, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of `labels` and (optionally) the entropy, from this rank's vocab columns.

    Args:
        logits: [R, V / TP] this rank's slice of the vocabulary (rank r holds columns
            r * V/TP ... (r + 1) * V/TP - 1, megatron's `VocabParallelEmbedding` split).
        labels: int64 [R] global token ids.
        with_entropy: also return the entropy of each row's distribution.
        entropy_grad: keep the entropy in the autograd graph.

    Returns:
        logp [R] and entropy [R] (or None), fp32, identical on every TP rank.
    """
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region as tp_sum

    logits = logits.float()
    width = logits.shape[-1]
    start = mpu.get_tensor_model_parallel_rank() * width
    peak = logits.detach().max(dim=-1).values  # [R]; any constant works, the max keeps exp() finite
    if mpu.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=mpu.get_tensor_model_parallel_group())
    shifted = logits - peak[:, None]  # [R, V / TP]
    exp = shifted.exp()
    sum_exp = tp_sum(exp.sum(dim=-1))  # [R]
    local = labels.to(logits.device) - start
    mine = (local >= 0) & (local < width)  # [R] whose label column this rank holds
    target = shifted.gather(-1, local.clamp(0, width - 1)[:, None]).squeeze(-1) * mine
    logp = tp_sum(target) - sum_exp.log()  # [R]
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            expected = tp_sum((exp * shifted).sum(dim=-1)) / sum_exp  # E_p[shifted logit]
            entropy = sum_exp.log() - expected
    return logp, entropy
