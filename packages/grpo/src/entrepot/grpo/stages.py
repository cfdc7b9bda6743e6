"""The compute of each GRPO stage on tensors, shared by the plain loop and the Ray workers.

Every function takes plain tensors / lists and returns them; where the data comes from (a local
list, the dock) is the caller's business.

Shape legend: B = responses, L = padded prompt+response length, T = L - 1 (next-token positions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from entrepot.grpo.algorithm import group_advantages, kl_penalty, policy_loss
from entrepot.grpo.config import AlgorithmConfig, BatchingConfig
from entrepot.grpo.model import packed_sequence_logprobs, sequence_logprobs

__all__ = [
    "TokenBatch",
    "actor_update",
    "compute_logprobs",
    "make_token_batch",
    "shaped_advantages",
]


@dataclass
class TokenBatch:
    """Right-padded prompt+response tokens with the masks the losses need.

    input_ids, attention_mask: [B, L]; response_mask: [B, T], 1 where position t predicts a response
    token (t + 1 is in the response); prompt_lengths, response_lengths: [B] int64.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    prompt_lengths: torch.Tensor
    response_lengths: torch.Tensor

    def rows(self, index: Sequence[int] | torch.Tensor) -> TokenBatch:
        """The sub-batch of rows `index`, trimmed to its own longest sequence."""
        idx = torch.as_tensor(index, dtype=torch.long)
        length = int((self.prompt_lengths[idx] + self.response_lengths[idx]).max())
        return TokenBatch(
            input_ids=self.input_ids[idx, :length],
            attention_mask=self.attention_mask[idx, :length],
            response_mask=self.response_mask[idx, : length - 1],
            prompt_lengths=self.prompt_lengths[idx],
            response_lengths=self.response_lengths[idx],
        )


def make_token_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_token_id: int
) -> TokenBatch:
    """Concatenate each prompt with its response and right-pad to the longest sequence."""
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    length = max(len(s) for s in seqs)
    b = len(seqs)
    input_ids = torch.full((b, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(b, length, dtype=torch.long)
    response_mask = torch.zeros(b, length - 1, dtype=torch.float32)
    for row, (p, s) in enumerate(zip(prompts, seqs, strict=True)):
        input_ids[row, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        attention_mask[row, : len(s)] = 1
        response_mask[row, len(p) - 1 : len(s) - 1] = 1.0
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        prompt_lengths=torch.as_tensor([len(p) for p in prompts], dtype=torch.long),
        response_lengths=torch.as_tensor([len(r) for r in responses], dtype=torch.long),
    )


def micro_batches(batch: TokenBatch, config: BatchingConfig) -> list[list[int]]:
    """Row indexes of each micro-batch: under a token budget (dynamic) or of a fixed count."""
    lengths = (batch.prompt_lengths + batch.response_lengths).tolist()
    if config.dynamic_batch_size:
        from entrepot.batching import plan_micro_batches

        return [
            list(mb) for mb in plan_micro_batches(lengths, config.max_tokens_per_micro_batch).micro_batches
        ]
    size = config.micro_batch_size
    return [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]


def _logprobs(config: BatchingConfig) -> Any:
    """The forward used for log-probs: packed (remove padding) or padded."""
    return packed_sequence_logprobs if config.remove_padding else sequence_logprobs


@torch.no_grad()
def compute_logprobs(model: torch.nn.Module, batch: TokenBatch, config: BatchingConfig) -> torch.Tensor:
    """Per-token log-probs [B, T] of `batch` under `model`, micro-batched (zeros off the response)."""
    out = torch.zeros_like(batch.response_mask)
    for rows in micro_batches(batch, config):
        sub = batch.rows(rows)
        logp, _ = _logprobs(config)(model, sub.input_ids, sub.attention_mask)
        out[torch.as_tensor(rows), : logp.shape[1]] = logp * sub.response_mask
    return out


def shaped_advantages(
    scores: torch.Tensor,
    group_size: int,
    algo: AlgorithmConfig,
    *,
    logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    response_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B] advantages from [B] scores; with kl_in_reward the summed KL is subtracted first."""
    rewards = scores.float()
    if algo.kl_in_reward and algo.kl_coef > 0:
        if logp is None or ref_logp is None or response_mask is None:
            raise ValueError("kl_in_reward needs logp, ref_logp and response_mask")
        kl = (kl_penalty(logp, ref_logp, algo.kl_kind) * response_mask).sum(-1)  # [B]
        rewards = rewards - algo.kl_coef * kl
    return group_advantages(rewards, group_size, normalize_std=algo.normalize_std)


def _loss_weight(sub: TokenBatch, mini: TokenBatch, mode: str) -> float:
    """Share of a micro-batch in its mini-batch's loss, so that summed micro losses equal the mini loss."""
    if mode == "token-mean":
        return float(sub.response_mask.sum() / mini.response_mask.sum().clamp(min=1))
    return sub.input_ids.shape[0] / mini.input_ids.shape[0]


def actor_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: TokenBatch,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    algo: AlgorithmConfig,
    batching: BatchingConfig,
    *,
    mini_batch_size: int | None = None,
    grad_scale: float = 1.0,
    all_reduce: Any = None,
) -> dict[str, float]:
    """PPO-clip epochs over mini-batches of `batch`, each one optimiser step; returns mean diagnostics.

    `old_logp` None means the policy has not changed since sampling (one epoch, one mini-batch):
    the current log-probs, detached, are the old ones, as upstream skips that forward pass.
    `grad_scale` and `all_reduce` (a callable over the flat grad list) let DP workers average grads.
    """
    size = mini_batch_size or batch.input_ids.shape[0]
    totals: dict[str, float] = {}
    steps = 0
    kl_coef = 0.0 if algo.kl_in_reward else algo.kl_coef
    for _ in range(algo.epochs):
        for start in range(0, batch.input_ids.shape[0], size):
            rows = list(range(start, min(start + size, batch.input_ids.shape[0])))
            mini = batch.rows(rows)
            optimizer.zero_grad(set_to_none=True)
            agg: dict[str, float] = {}
            for micro in micro_batches(mini, batching):
                sub = mini.rows(micro)
                index = torch.as_tensor(rows)[torch.as_tensor(micro)]
                t = sub.response_mask.shape[1]
                logp, entropy = _logprobs(batching)(
                    model, sub.input_ids, sub.attention_mask, with_entropy=True
                )
                old = logp.detach() if old_logp is None else old_logp[index, :t]
                ref = None if ref_logp is None else ref_logp[index, :t]
                out = policy_loss(
                    logp,
                    old,
                    advantages[index],
                    sub.response_mask,
                    clip_low=algo.clip_low,
                    clip_high=algo.clip_high,
                    ref_logp=ref,
                    kl_coef=kl_coef,
                    kl_kind=algo.kl_kind,
                    entropy=entropy,
                    entropy_coef=algo.entropy_coef,
                    loss_agg=algo.loss_agg,
                )
                weight = _loss_weight(sub, mini, algo.loss_agg)
                (out.loss * weight * grad_scale).backward()
                for key, value in out.metrics.items():
                    agg[key] = agg.get(key, 0.0) + value * weight
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            if all_reduce is not None:
                all_reduce(grads)
            max_norm = algo.grad_clip if algo.grad_clip is not None else float("inf")
            agg["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
            agg["lr"] = float(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
            steps += 1
            for key, value in agg.items():
                totals[key] = totals.get(key, 0.0) + value
    return {key: value / steps for key, value in totals.items()}
