"""The actor's passes over a step's rows: micro-batched log-probs and the policy update.

Both are plain functions of a model and tensors; the worker (or the single-process baseline in
benchmarks/) supplies the rows. Under data parallelism a rank passes a `DataParallel` and only its
own rows: every normalizer is summed over ranks before the backward pass and gradients are summed
(not averaged) after it, so the update equals the single-process update on all rows, whatever the
split (a skewed split included).

Legend: B rows, R response tokens of those rows (flat, row after row).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from entrepot.grpo.algo import correction as offpolicy
from entrepot.grpo.algo.losses import LossOutput, loss_normalizer, policy_loss, row_sums, token_weights
from entrepot.grpo.algo.optim import AdamW, LRSchedule
from entrepot.grpo.algo.sequences import ResponseBatch, packed_attention, response_logprobs, segment_index
from entrepot.grpo.config import AlgorithmConfig, BatchingConfig, CorrectionConfig
from entrepot.grpo.embedded import gpt2_forward
from entrepot.grpo.embedded.lanes import run_lanes, split_rows

__all__ = [
    "DataParallel",
    "UpdateInputs",
    "compute_logprobs",
    "micro_batch_loss",
    "micro_batches",
    "mini_batch_counts",
    "ppo_update",
    "process_group_backend",
]


def process_group_backend(device: torch.device | str) -> str:
    """torch.distributed backend for ranks training on `device`: gloo on CPU; on an accelerator its
    collective library for device tensors and gloo for the small CPU tensors the update sums."""
    kind = torch.device(device).type
    return {"cpu": "gloo", "cuda": "cpu:gloo,cuda:nccl", "npu": "cpu:gloo,npu:hccl"}[kind]


@dataclass(frozen=True)
class DataParallel:
    """This rank's data-parallel process group (gloo on CPU, NCCL on GPU): the sums the update needs."""

    group: Any = None  # a torch.distributed ProcessGroup; None = the default group

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def max(self, value: int) -> int:
        import torch.distributed as dist

        out = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=self.group)
        return int(out)


def micro_batches(
    lengths: torch.Tensor, config: BatchingConfig, pass_name: str, dp: DataParallel | None = None
) -> list[torch.Tensor]:
    """Row indexes of each micro-batch of one pass; every DP rank gets the same count.

    With `dynamic_batch_size` the rows are packed under the pass's token budget and sequence cap
    (`entrepot.batching.plan_micro_batches`, ranks agreeing on the largest count); otherwise they
    are cut into `micro_batch_size` rows, and ranks with fewer cuts get empty micro-batches.
    """
    if config.dynamic_batch_size:
        from entrepot.batching import plan_micro_batches

        budget, max_seqs = config.limits(pass_name)
        group = None if dp is None else dp.group
        if dp is not None and group is None:
            import torch.distributed as dist

            group = dist.group.WORLD
        plan = plan_micro_batches(lengths.tolist(), budget, max_seqs, group=group)
        return [torch.as_tensor(rows, dtype=torch.int64) for rows in plan.micro_batches]
    rows = torch.arange(lengths.numel())
    parts = list(torch.split(rows, config.micro_batch_size))
    count = len(parts) if dp is None else dp.max(len(parts))
    return parts + [rows[:0]] * (count - len(parts))


def _attention(model: torch.nn.Module, packed: bool) -> contextlib.AbstractContextManager[None]:
    """HF's attention switched to the packed kernel around packed passes that run HF's forward."""
    if packed and not gpt2_forward.supports(model):  # the written-out forward attends by itself
        return packed_attention(model)
    return contextlib.nullcontext()


@torch.no_grad()
def compute_logprobs(
    model: torch.nn.Module,
    batch: ResponseBatch,
    config: BatchingConfig,
    pass_name: str,
    *,
    pad_token_id: int = 0,
    lanes: int = 1,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probs [R] of every response token of `batch` under `model` (CPU, row after row).

    `lanes` > 1 splits each micro-batch over that many threads (`entrepot.grpo.embedded.lanes`);
    `temperature` scores under softmax(logits / temperature) (`response_logprobs`).
    """
    out = torch.empty(batch.num_response_tokens, dtype=torch.float32)
    packed = config.remove_padding

    def lane(rows: torch.Tensor) -> torch.Tensor:
        return response_logprobs(model, batch.select(rows), packed=packed, pad_token_id=pad_token_id,
                                 temperature=temperature)[0]  # fmt: skip

    for rows in micro_batches(batch.lengths, config, pass_name):
        if rows.numel() == 0:
            continue
        parts = split_rows(batch.lengths, rows, lanes)
        with _attention(model, packed):
            logps = run_lanes(lane, parts)
        for part, logp in zip(parts, logps, strict=True):
            out[segment_index(batch.response_lengths, part)] = logp.float().cpu()
    return out


@dataclass
class UpdateInputs:
    """What one rank trains on in a step.

    Attributes:
        batch: the rank's rows (all mini-batches).
        advantages: [B] one advantage per row.
        old_logp: [R] sampling-policy log-probs, or None when the policy has not moved since sampling
            (one epoch, one mini-batch: the current log-probs, detached, are the old ones).
        ref_logp: [R] reference log-probs, or None without a KL term in the loss.
        mini_batches: rows of `batch` in each mini-batch (the same number on every DP rank; a rank
            may hold no row of a mini-batch).
        horizon: the constant of `seq-mean-token-sum-norm` (tokens; the generation budget).
        keep: [B] bool, the rows whose tokens have a loss (None: all); `algorithm.mask_truncated`
            drops responses cut at the budget from the loss and its normaliser.
        behaviour_logp: [R] log-probs the rollout engine sampled each token with, or None.
        correction: the resolved `algorithm.correction` (`entrepot.grpo.config.correction.resolve`); None or
            kind none: no correction. Applied only with `behaviour_logp` (`algo.correction`).
        model_mask: [R] bool, the tokens the model sampled (None: all). Multi-turn rows hold the
            environment's tokens too: they condition the model's later tokens in the forward pass, but
            the loss, its normaliser and every diagnostic count the model's tokens only.
        token_advantages: [R] one advantage per response token (distillation, `algo.distill`), used
            instead of `advantages` broadcast over each response; None: per response.
    """

    batch: ResponseBatch
    advantages: torch.Tensor
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    mini_batches: Sequence[torch.Tensor]
    horizon: int = 1
    keep: torch.Tensor | None = None
    behaviour_logp: torch.Tensor | None = None
    correction: CorrectionConfig | None = None
    model_mask: torch.Tensor | None = None
    token_advantages: torch.Tensor | None = None

    def model_lengths(self, rows: torch.Tensor) -> torch.Tensor:
        """int64 [K] tokens of each of `rows` the model sampled (the whole response without a mask)."""
        lengths = self.batch.response_lengths[rows]
        if self.model_mask is None:
            return lengths
        return row_sums(self.batch.select_response_values(self.model_mask, rows).long(), lengths)

    @property
    def corrected(self) -> bool:
        """Whether the surrogate gets an off-policy correction (and the offpolicy/* metrics)."""
        return self.behaviour_logp is not None and self.correction is not None and self.correction.active


def mini_batch_counts(
    inputs: UpdateInputs, rows: torch.Tensor, algo: AlgorithmConfig, dp: DataParallel | None
) -> tuple[float, float]:
    """The loss normaliser and the token count of mini-batch `rows`, summed over DP ranks (both engines).

    Rows outside `inputs.keep` count in neither.
    """
    lengths = inputs.model_lengths(rows)
    if inputs.keep is not None:
        lengths = lengths[inputs.keep[rows]]
    counts = torch.tensor(
        [loss_normalizer(lengths, algo.loss_agg, inputs.horizon), float(lengths.sum())], dtype=torch.float64
    )
    if dp is not None:
        dp.sum_(counts)
    return float(counts[0]), float(counts[1])


def ppo_update(
    model: torch.nn.Module,
    optimizer: AdamW,
    scheduler: LRSchedule,
    inputs: UpdateInputs,
    algo: AlgorithmConfig,
    batching: BatchingConfig,
    *,
    dp: DataParallel | None = None,
    pad_token_id: int = 0,
    lanes: int = 1,
) -> dict[str, float]:
    """Policy-loss epochs over the mini-batches, one optimiser step each; returns mean diagnostics.

    Each mini-batch's loss is `policy_loss` (`algorithm.loss`) with token weights normalised over
    the whole (global) mini-batch, summed over micro-batches; with `dp` the normalizers and the
    gradients are summed over ranks, so every rank takes the same step. `lanes` > 1 splits each
    micro-batch over that many threads, their gradients summed in lane order (`embedded.lanes`).
    """
    totals: dict[str, float] = {}
    steps = 0
    for _ in range(algo.epochs):
        for rows in inputs.mini_batches:
            step = _mini_batch_step(model, optimizer, inputs, rows, algo, batching, dp, pad_token_id, lanes)
            scheduler.step()
            steps += 1
            for key, value in step.items():
                totals[key] = totals.get(key, 0.0) + value
    return {key: value / max(steps, 1) for key, value in totals.items()}


def _mini_batch_step(
    model: torch.nn.Module,
    optimizer: AdamW,
    inputs: UpdateInputs,
    rows: torch.Tensor,
    algo: AlgorithmConfig,
    batching: BatchingConfig,
    dp: DataParallel | None,
    pad_token_id: int,
    lanes: int,
) -> dict[str, float]:
    mini = inputs.batch.select(rows)
    normalizer, num_tokens = mini_batch_counts(inputs, rows, algo, dp)
    optimizer.zero_grad(set_to_none=True)
    # The same keys on every rank (a rank may hold no row of this mini-batch) for the one all-reduce.
    keys = ["pg_loss", "clip_frac", "ratio_mean", "entropy"] + (["kl"] if inputs.ref_logp is not None else [])
    keys += list(offpolicy.METRIC_SUMS) if inputs.corrected else []
    sums = dict.fromkeys(keys, 0.0)
    ratio_max = 1.0
    weight_max = 0.0
    params = [p for p in model.parameters() if p.requires_grad]

    def lane(picked: torch.Tensor) -> tuple[Sequence[torch.Tensor | None], dict[str, float]]:
        """Gradients and diagnostics of the rows `picked` (its share of the micro-batch's loss)."""
        sub = inputs.batch.select(picked)
        logp, entropy = response_logprobs(
            model, sub, packed=batching.remove_padding, with_entropy=True,
            entropy_grad=algo.entropy_coef > 0, pad_token_id=pad_token_id,
        )  # fmt: skip
        out = micro_batch_loss(inputs, picked, sub, logp, entropy, algo, normalizer, num_tokens)
        return torch.autograd.grad(out.loss, params, allow_unused=True), out.metrics

    plan = micro_batches(mini.lengths, batching, "update", dp)
    for micro in plan:
        if micro.numel() == 0:
            continue
        with _attention(model, batching.remove_padding):
            results = run_lanes(lane, split_rows(inputs.batch.lengths, rows[micro], lanes))
        for grads, metrics in results:  # in lane order: the same sums on every run
            _accumulate(params, grads)
            ratio_max = max(ratio_max, metrics.pop("ratio_max"))
            weight_max = max(weight_max, metrics.pop(offpolicy.METRIC_MAX, 0.0))
            for key in keys:
                sums[key] += metrics[key]
    if dp is not None:
        sums = _sum_over_ranks(params, sums, dp)
    max_norm = algo.grad_clip if algo.grad_clip is not None else float("inf")
    sums["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    sums["lr"] = float(optimizer.param_groups[0]["lr"])
    sums["ratio_max"] = ratio_max  # this rank's max, like the weight max: not reduced over DP ranks
    if inputs.corrected:
        sums[offpolicy.METRIC_MAX] = weight_max
    sums["micro_batches"] = float(len(plan))  # equal on every DP rank
    optimizer.step()
    return sums


def _accumulate(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> None:
    """Add `grads` into the parameters' `.grad` (what `backward` does, here in an order we choose)."""
    with torch.no_grad():
        for param, grad in zip(params, grads, strict=True):
            if grad is None:
                continue
            if param.grad is None:
                param.grad = grad
            else:
                param.grad += grad


def micro_batch_loss(
    inputs: UpdateInputs,
    picked: torch.Tensor,
    sub: ResponseBatch,
    logp: torch.Tensor,
    entropy: torch.Tensor | None,
    algo: AlgorithmConfig,
    normalizer: float,
    num_tokens: float,
) -> LossOutput:
    """`policy_loss` of the rows `picked` of `inputs` (`sub` = those rows), given their current log-probs.

    Shared by both training engines: `normalizer` and `num_tokens` are the global mini-batch's.
    With `inputs.corrected` the surrogate is reweighted by `algo.correction.correction_weights` of
    the old (proximal) and behaviour log-probs, and the offpolicy/* diagnostics are added over the
    kept rows' tokens.
    """
    device = logp.device
    old = logp.detach() if inputs.old_logp is None else _values(inputs, inputs.old_logp, picked, device)
    ref = None if inputs.ref_logp is None else _values(inputs, inputs.ref_logp, picked, device)
    if inputs.token_advantages is None:  # one per response, on each of its tokens
        advantages = sub.per_token(inputs.advantages[picked].to(device))
    else:
        advantages = _values(inputs, inputs.token_advantages, picked, device)
    kept = None if inputs.keep is None else sub.per_token(inputs.keep[picked])  # [R] bool
    behaviour = None if not inputs.corrected else _values(inputs, inputs.behaviour_logp, picked, device)  # type: ignore[arg-type]
    lengths = sub.response_lengths
    if inputs.model_mask is not None:  # the loss sees the model's tokens only (module docstring)
        mine = inputs.batch.select_response_values(inputs.model_mask, picked).bool()  # [R]
        lengths = row_sums(mine.long(), lengths)  # each row's model tokens
        mine = mine.to(device)
        logp, old, advantages = logp[mine], old[mine], advantages[mine]
        ref, entropy, behaviour, kept = (
            None if t is None else t[mine] for t in (ref, entropy, behaviour, kept)
        )
    weights = token_weights(lengths, algo.loss_agg, normalizer)
    if kept is not None:
        weights = weights * kept.to(weights.dtype)
    correction = None
    if behaviour is not None:
        assert inputs.correction is not None  # `corrected`
        correction = offpolicy.correction_weights(old, behaviour, lengths, inputs.correction)
    out = policy_loss(
        logp, old, advantages, weights.to(device),
        response_lengths=lengths, loss=algo.loss,
        num_tokens=num_tokens, clip_low=algo.clip_low, clip_high=algo.clip_high,
        ref_logp=ref, kl_coef=0.0 if algo.kl_in_reward else algo.kl_coef, kl_kind=algo.kl_kind,
        entropy=entropy, entropy_coef=algo.entropy_coef,
        correction=None if correction is None else correction.weights,
    )  # fmt: skip
    if correction is not None:
        out.metrics.update(offpolicy.correction_metrics(correction, num_tokens, kept))
    return out


def _values(
    inputs: UpdateInputs, values: torch.Tensor, rows: torch.Tensor, device: torch.device
) -> torch.Tensor:
    return inputs.batch.select_response_values(values, rows).to(device)


def _sum_over_ranks(
    params: list[torch.nn.Parameter], sums: dict[str, float], dp: DataParallel
) -> dict[str, float]:
    """Sum gradients (a rank without rows contributes zeros) and diagnostics over DP ranks in one call."""
    keys = sorted(sums)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads] + [torch.tensor([sums[k] for k in keys])])
    dp.sum_(flat)
    offset = 0
    for param, grad in zip(params, grads, strict=True):
        size = grad.numel()
        param.grad = flat[offset : offset + size].view_as(grad).to(grad.dtype)
        offset += size
    return dict(zip(keys, flat[offset:].tolist(), strict=True))
