"""The passes of a megatron actor rank: micro-batches, megatron's forward-backward schedule, diagnostics.

Every rank of a model-parallel group (same DP rank) holds the same rows (the group reads the dock
once and broadcasts). A pass cuts them into micro-batches under the pass's token budget
(`plan_micro_batches`) and runs them through megatron's forward-backward schedule (1F1B or
interleaved under PP, `run_schedule`); each micro-batch is a right-padded [b, L] grid with causal
attention (megatron's local attention takes no packed sequences), and the LM head's vocab-parallel
logits are scored at response positions (`MicroBatch.scored`).

Legend: B rows, R response tokens, L longest row of a micro-batch, V vocabulary.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from entrepot.grpo.algo.sequences import ResponseBatch
from entrepot.grpo.algo.update import DataParallel, micro_batches
from entrepot.grpo.config import BatchingConfig
from entrepot.grpo.errors import GRPOConfigError

__all__ = ["METRIC_KEYS", "MicroBatch", "plan_micro_batches", "run_schedule", "step_metrics"]

METRIC_KEYS = ("pg_loss", "clip_frac", "ratio_mean", "entropy", "kl")


class MicroBatch:
    """One micro-batch: its rows of the pass's batch, the padded grid and the scored positions."""

    def __init__(self, batch: ResponseBatch, rows: torch.Tensor) -> None:
        self.rows = rows
        self.batch = batch.select(rows)
        keep = self.batch.predicting_positions()  # [R] flat positions scored
        self.labels = self.batch.tokens[keep + 1]  # [R]
        starts = torch.cumsum(self.batch.lengths, 0) - self.batch.lengths
        self.row = torch.repeat_interleave(torch.arange(self.batch.num_rows), self.batch.response_lengths)
        self.column = keep - starts[self.row]  # [R] position inside its row

    def grid(
        self, device: torch.device, shape: tuple[int, int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded tokens [b, L] and positions [b, L] (pads are never attended to by real tokens).

        `shape`: pad to this [b, L] instead (extra rows are all padding and never scored).
        """
        tokens, _ = self.batch.padded(pad_token_id=0)
        if shape is not None:
            extra_rows, extra_columns = shape[0] - tokens.shape[0], shape[1] - tokens.shape[1]
            tokens = torch.nn.functional.pad(tokens, (0, extra_columns, 0, extra_rows))
        positions = torch.arange(tokens.shape[1]).expand_as(tokens).contiguous()
        return tokens.to(device), positions.to(device)

    def scored(self, logits: torch.Tensor) -> torch.Tensor:
        """[b, L, V / TP] -> [R, V / TP] at the positions that predict response tokens."""
        return logits[self.row.to(logits.device), self.column.to(logits.device)]


def plan_micro_batches(
    lengths: torch.Tensor, batching: BatchingConfig, tconfig: Any, pass_name: str,
    dp: DataParallel | None = None,
) -> list[torch.Tensor]:  # fmt: skip
    """Row indexes of each micro-batch of a pass (none empty).

    The interleaved (VPP) schedule runs micro-batches in groups of PP: with VPP the largest
    micro-batches are halved until their count is a multiple of PP.
    """
    plan = [m for m in micro_batches(lengths, batching, pass_name, dp) if m.numel()]
    pp = tconfig.pipeline_model_parallel_size
    if not tconfig.virtual_pipeline_model_parallel_size or not plan:
        return plan
    while len(plan) % pp:
        largest = max(range(len(plan)), key=lambda i: len(plan[i]))
        if len(plan[largest]) < 2:
            raise GRPOConfigError(
                f"parallel.train.virtual_pipeline: the interleaved schedule needs a multiple of "
                f"parallel.train.pipeline ({pp}) micro-batches, and this pass has {len(plan)} rows; "
                f"use more rows per step or no virtual pipeline"
            )
        half = len(plan[largest]) // 2
        plan[largest : largest + 1] = [plan[largest][:half], plan[largest][half:]]
    return plan


def run_schedule(
    model: list[torch.nn.Module], batch: ResponseBatch, plan: Sequence[torch.Tensor], score: Any,
    *, tconfig: Any, device: torch.device, forward_only: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    """Run `plan`'s micro-batches through megatron's forward-backward schedule.

    Args:
        model: the chunks of this rank (policy or reference).
        batch: the pass's rows.
        plan: row indexes of each micro-batch (`plan_micro_batches`).
        score: ``score(micro, logits) -> (loss, count, outputs)``, megatron's loss function of a
            micro-batch (called on the last stage only).
        tconfig: megatron's transformer config (fixed shapes when it has no variable lengths).
        device: where the grids go.
        forward_only: no backward pass (log-probs).
    """
    if not plan:
        return []
    from megatron.core.pipeline_parallel import get_forward_backward_func

    micros = [MicroBatch(batch, rows) for rows in plan]
    width = max(int(m.batch.lengths.max()) for m in micros)
    # With VPP megatron exchanges fixed shapes (see `training_transformer_config`): every
    # micro-batch is padded to the pass's widest one, with all-pad rows where it has fewer.
    rows = max(m.batch.num_rows for m in micros) if not tconfig.variable_seq_lengths else None

    def forward_step(data: Iterator[MicroBatch], chunk: torch.nn.Module) -> tuple[torch.Tensor, Any]:
        micro = next(data)
        tokens, positions = micro.grid(device, None if rows is None else (rows, width))
        logits = chunk(tokens, positions, attention_mask=None)
        return logits, functools.partial(score, micro)

    iterators: Any = [iter(micros) for _ in model] if len(model) > 1 else iter(micros)
    outputs = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iterators, model=model, forward_only=forward_only,
        num_microbatches=len(micros), seq_length=width, micro_batch_size=rows or 1,
    )  # fmt: skip
    return list(outputs)


def step_metrics(outputs: list[dict[str, Any]], with_kl: bool, dp: DataParallel) -> dict[str, float]:
    """Diagnostics summed over micro-batches and DP ranks, sent from the last stage to the others."""
    from megatron.core import parallel_state as mpu

    keys = [k for k in METRIC_KEYS if with_kl or k != "kl"]
    sums = torch.zeros(len(keys) + 1, dtype=torch.float64)
    for out in outputs:
        sums[:-1] += torch.tensor([float(out[k]) for k in keys], dtype=torch.float64)
        sums[-1] = max(float(sums[-1]), float(out["ratio_max"]))
    if mpu.get_pipeline_model_parallel_world_size() > 1:  # only the last stage computed a loss
        dist.all_reduce(sums, group=mpu.get_pipeline_model_parallel_group())
    ratio_max = torch.tensor([max(float(sums[-1]), 1.0)])
    dp.sum_(sums[:-1])
    dist.all_reduce(ratio_max, op=dist.ReduceOp.MAX, group=dp.group)
    return {**dict(zip(keys, sums[:-1].tolist(), strict=True)), "ratio_max": float(ratio_max)}
