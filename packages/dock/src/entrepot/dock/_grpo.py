"""GRPODock: the dock preset with the GRPO columns and stages, and prompt fan-out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from entrepot.dock._columns import ColumnSpec
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import DockConfigError, DockFullError, InvalidArgumentError
from entrepot.dock._inputs import ColumnData, normalize_column
from entrepot.dock._rowcopy import RowSource

_SEQ = ColumnSpec(scalar=False)
_SCALAR = ColumnSpec(scalar=True)

GRPO_COLUMNS: dict[str, ColumnSpec] = {
    "prompts": _SEQ,  # put_prompts
    "prompt_length": _SCALAR,  # put_prompts
    "responses": _SEQ,  # the rollout
    "response_length": _SCALAR,  # the rollout
    "rm_scores": _SCALAR,  # the reward stage
    "old_log_prob": _SEQ,  # the actor, before its update
    "ref_log_prob": _SEQ,  # the reference model
    "advantages": _SCALAR,  # one per response: GRPO advantages are per sequence
}
"""The GRPO columns, each with the stage that writes it (dtypes are fixed by the first put; kinds here).

Only columns a GRPO stage writes: model inputs (input ids, masks, labels) are built from prompts and
responses where a model needs them, and a run's own columns go in `GRPODock(extra_columns=...)`.
"""

GRPO_CONSUMERS: tuple[str, ...] = (
    "actor_rollout",
    "ref_log_prob",
    "actor_log_prob",
    "rule_reward",
    "reward_scores",
    "compute_advantage",
    "actor_train",
    "grpo_metrics",
)
"""The GRPO stages, in loop order; `actor_rollout` is the partial-rollout consumer."""


class GRPODock(ExperienceDock):
    """ExperienceDock with the GRPO columns and consumers; gets take whole prompt groups by default.

    Args:
        prompts_num: prompt groups the dock holds (e.g. the global batch size).
        n_samples_per_prompt: responses per prompt (rows per group).
        extra_columns: user columns (names, or name -> ColumnSpec), e.g. dataset keys for rewards.
        extra_consumers: user stages.
        seed: seeds the random samplers.
        max_age: partial rollout: clears an unfinished group may survive (+1); None = no limit.
        max_staleness: partial rollout: policy versions a group may lag (see `set_policy_version`).
    """

    def __init__(
        self,
        prompts_num: int,
        n_samples_per_prompt: int,
        *,
        extra_columns: Sequence[str] | Mapping[str, ColumnSpec] = (),
        extra_consumers: Sequence[str] = (),
        seed: int = 0,
        max_age: int | None = None,
        max_staleness: int | None = None,
    ) -> None:
        extra = (
            dict(extra_columns)
            if isinstance(extra_columns, Mapping)
            else dict.fromkeys(extra_columns, ColumnSpec())
        )
        clash = sorted(set(extra) & set(GRPO_COLUMNS)) + sorted(set(extra_consumers) & set(GRPO_CONSUMERS))
        if clash:
            raise DockConfigError(f"extra columns/consumers {clash} clash with the GRPO preset's names")
        super().__init__(
            prompts_num=prompts_num,
            n_samples_per_prompt=n_samples_per_prompt,
            columns={**GRPO_COLUMNS, **extra},
            consumers=[*GRPO_CONSUMERS, *extra_consumers],
            seed=seed,
            rollout_consumer="actor_rollout",
            max_age=max_age,
            max_staleness=max_staleness,
            group_gets=True,
        )

    def put_prompts(
        self,
        prompts: Any,
        n_samples_per_prompt: int | None = None,
        *,
        lengths: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> torch.Tensor:
        """Fan each of P prompts out to its n rows (prompts + prompt_length) in the first free groups.

        Args:
            prompts: P token sequences: a list of 1-D tensors, padded [P, L] with `lengths`, or a
                packed `(flat, lengths)` pair.
            n_samples_per_prompt: must equal the dock's (accepted for call-site clarity).
            lengths: int [P] valid lengths of padded prompts.
            extra: per-prompt values of user columns (same forms as `put`), fanned out with the prompts.

        Returns:
            int64 [P * n] the rows written; prompt p occupies rows[p * n : (p + 1) * n].
        """
        t = self._table
        n = t.n_samples_per_prompt
        if n_samples_per_prompt is not None and n_samples_per_prompt != n:
            raise InvalidArgumentError(
                f"n_samples_per_prompt is {n} in this dock, got {n_samples_per_prompt}"
            )
        num_prompts = count_prompts(prompts, lengths)
        column = normalize_column("prompts", prompts, lengths, num_prompts, False)
        extras = {
            name: normalize_column(
                name, value, None, num_prompts, t.scalar_kind(name) if name in t.specs else None
            )
            for name, value in (extra or {}).items()
        }
        assert column.lengths is not None  # sequences
        data: dict[str, Any] = {
            "prompts": _fan_out(column, n),
            "prompt_length": column.lengths.repeat_interleave(n),
        }
        for name, values in extras.items():
            data[name] = _fan_out(values, n)
        with t.cond:  # choose free groups and fill them atomically
            free = (~t.live.view(-1, n).any(1)).nonzero().squeeze(1)
            if free.numel() < num_prompts:
                raise DockFullError(
                    f"{num_prompts} prompts need {num_prompts} free groups of {n} rows; "
                    f"{free.numel()} are free"
                )
            rows = (free[:num_prompts, None] * n + torch.arange(n)).reshape(-1)
            self.put(data, rows)
        return rows


def count_prompts(prompts: Any, lengths: Any) -> int:
    """How many prompts `put_prompts` was given (in any of its forms)."""
    if lengths is not None:
        return int(torch.as_tensor(lengths).numel())
    if isinstance(prompts, tuple) and len(prompts) == 2 and isinstance(prompts[1], torch.Tensor):
        return int(prompts[1].numel())
    if isinstance(prompts, torch.Tensor):
        return int(prompts.shape[0])
    return len(prompts)


def _fan_out(column: ColumnData, n: int) -> ColumnData:
    """Each row repeated n times (the copies point at the row; the store copies each once)."""
    if column.lengths is None:
        return ColumnData(column.flat.repeat_interleave(n), None)
    starts = torch.cumsum(column.lengths, 0) - column.lengths
    lengths = column.lengths.repeat_interleave(n)
    rows = RowSource([column.flat], None, starts.repeat_interleave(n), lengths)
    return ColumnData(None, lengths, rows=rows)
