"""The actor's rollout stage, engine-agnostic: whole responses, or one round of partial rollout.

Every engine answers `generate` with a `Rollout` of flat tensors (`engines.base`), which go into the
dock as they are. The behaviour log-probs travel with the tokens when something reads them: partial
rollout (the importance ratio divides by them) or an engine with kernels of its own (the old log-prob
stage checks them against the trainer's, `LogpMismatch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from entrepot.dock import Batch, DockClient
from entrepot.grpo.engines.policy import Policy
from entrepot.grpo.multiturn import Row, Trajectory
from entrepot.grpo.multiturn.runner import TrajectoryRollout
from entrepot.grpo.workers._partial_rollout import partial_round
from entrepot.grpo.workers._stage import DockReader
from entrepot.grpo.workers.reward import tensor_text

__all__ = [
    "LogpMismatch",
    "MultiTurnTotals",
    "batch_generator",
    "full_rollout",
    "multiturn_rollout",
    "partial_rollout",
    "reshard_metrics",
    "trajectory_columns",
    "trajectory_starts",
]


def batch_generator(base: int, rows: torch.Tensor) -> torch.Generator:
    """The sampling stream of one rollout batch when several ranks generate.

    Ranks take batches from the dock in whatever order they ask, so a per-rank stream would make
    the samples depend on that race (and a resumed run differ); seeding by the batch's first row
    and a base drawn alike on every rank makes them depend on the rows only.
    """
    return torch.Generator().manual_seed(base + int(rows[0]))


def full_rollout(
    policy: Policy, reader: DockReader, dock: DockClient, count: int, *, n: int, base: int | None,
    alone: bool, puts: bool, logprobs: bool,
) -> dict[str, float]:  # fmt: skip
    """Whole responses for every prompt row (`count` rows a get, whole groups of `n`); `rollout_tokens`.

    `alone`: every rank samples its own rows (TP1 rollout); otherwise a tensor-parallel engine spans
    the model-parallel group, whose ranks generate the same rows in lockstep and whose first rank
    `puts` them. `logprobs`: the engine's log-probs of its tokens go into the dock too.
    """
    engine, tokens = policy.engine, 0
    for batch in reader.batches(dock, "actor_rollout", ["prompts"], count, min_count=n, alone=alone):
        prompts = torch.split(batch.columns["prompts"], batch.lengths["prompts"].tolist())
        generator = policy.generator if base is None else batch_generator(base, batch.indexes)
        out = engine.generate(prompts, policy.sampling, pad_token_id=_pad(policy), generator=generator)
        columns: dict[str, Any] = {"responses": (out.tokens, out.lengths), "response_length": out.lengths}
        if logprobs:
            columns["rollout_log_prob"] = (out.logprobs, out.lengths)
        if alone or puts:
            dock.put(columns, batch.indexes)
        tokens += int(out.lengths.sum())
    return {"rollout_tokens": float(tokens)}


def multiturn_rollout(
    policy: Policy, runner: TrajectoryRollout, reader: DockReader, dock: DockClient, count: int, *, n: int,
    base: int | None, version: int = 0,
) -> dict[str, float]:  # fmt: skip
    """Multi-turn trajectories for every prompt row (`count` rows a get, whole groups of `n`): per row
    the tokens after the prompt, which of them the model sampled (`model_mask`), their log-probs, the
    environment's (or agent's) reward and why the trajectory ended (`version`: the policy's)."""
    totals = MultiTurnTotals()
    columns = ["prompts", "prompt_text", "answer"]
    for batch in reader.batches(dock, "actor_rollout", columns, count, min_count=n, alone=True):
        prompts = torch.split(batch.columns["prompts"], batch.lengths["prompts"].tolist())
        starts = trajectory_starts(batch, prompts)
        generator = policy.generator if base is None else batch_generator(base, batch.indexes)
        trajectories, metrics = runner.run(policy.engine, starts, policy.sampling, pad_token_id=_pad(policy),
                                           generator=generator, version=version)  # fmt: skip
        dock.put(trajectory_columns(trajectories), batch.indexes)
        totals.add(metrics)
    return totals.metrics()


class MultiTurnTotals:
    """`MultiTurnRollout.run` metrics summed over runs: counts and seconds added, means weighted by
    their trajectories."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}

    @staticmethod
    def _is_mean(key: str) -> bool:
        return key.startswith("env/") or key in ("multiturn/turns_mean", "multiturn/env_token_frac")

    def add(self, metrics: dict[str, float]) -> None:
        count = metrics.get("multiturn/trajectories", 0.0)
        for key, value in metrics.items():
            self.sums[key] = self.sums.get(key, 0.0) + value * (count if self._is_mean(key) else 1.0)

    def metrics(self) -> dict[str, float]:
        rows = max(self.sums.get("multiturn/trajectories", 0.0), 1.0)
        return {key: value / rows if self._is_mean(key) else value for key, value in self.sums.items()}


def trajectory_starts(texts: Batch, prompts: Sequence[torch.Tensor]) -> list[tuple[Row, list[int]]]:
    """Per row of `texts` (a packed batch of the ``prompt_text`` and ``answer`` columns): the `Row` its
    environment resets with, and its prompt's tokens (`prompts`, in the same order)."""
    decoded = [
        [tensor_text(t) for t in torch.split(texts.columns[c].to(torch.uint8), texts.lengths[c].tolist())]
        for c in ("prompt_text", "answer")
    ]
    return [(Row(p, a, int(i)), prompt.tolist())
            for p, a, i, prompt in zip(*decoded, texts.indexes, prompts, strict=True)]  # fmt: skip


def trajectory_columns(trajectories: list[Trajectory]) -> dict[str, Any]:
    """The dock columns of finished trajectories (responses are every token after the prompt)."""
    lengths = torch.tensor([len(t.tokens) for t in trajectories], dtype=torch.int64)
    return {
        "responses": (torch.tensor([x for t in trajectories for x in t.tokens], dtype=torch.int64), lengths),
        "response_length": lengths,
        "model_mask": (
            torch.tensor([m for t in trajectories for m in t.model_mask], dtype=torch.bool),
            lengths,
        ),
        "rollout_log_prob": (torch.tensor([x for t in trajectories for x in t.logprobs]), lengths),
        "env_reward": torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        "env_accuracy": torch.tensor([float(t.correct) for t in trajectories], dtype=torch.float32),
        "end_reason": torch.tensor([int(t.end) for t in trajectories], dtype=torch.int64),
    }


def partial_rollout(
    policy: Policy, reader: DockReader, dock: DockClient, count: int, *, base: int | None, version: int,
    partial_max_tokens: int, max_age: int,
) -> dict[str, float]:  # fmt: skip
    """One partial-rollout round (see `_partial_rollout.partial_round`) over every row the rollout
    has not finished: new prompt rows and responses carried over from earlier steps.

    Rows are taken singly, not in whole groups (a carried group may hold finished rows), under a lease
    acked by the put, so that downstream stages running beside the rollout wait for rows in flight.
    """
    totals = {"rollout_tokens": 0.0, "partial/rows_continued": 0.0, "partial/forced_completions": 0.0}
    take: dict[str, Any] = {"min_count": 1, "groups": False, "lease": math.inf, "alone": True}
    while (batch := reader.get(dock, "actor_rollout", ["prompts"], count, **take)) is not None:
        prompts = list(torch.split(batch.columns["prompts"], batch.lengths["prompts"].tolist()))
        generator = policy.generator if base is None else batch_generator(base, batch.indexes)
        out = partial_round(
            policy.engine, prompts, batch.ages, _responses_so_far(dock, batch), policy.sampling,
            partial_max_tokens=partial_max_tokens, max_age=max_age, version=version,
            pad_token_id=_pad(policy), generator=generator,
        )  # fmt: skip
        dock.put(out.columns, batch.indexes, completed=out.completed, ack=batch.lease)
        totals["rollout_tokens"] += out.new_tokens
        totals["partial/rows_continued"] += out.continued
        totals["partial/forced_completions"] += out.forced
    return totals


def _pad(policy: Policy) -> int:
    return int(policy.setup.tokenizer.pad_token_id)


def _responses_so_far(
    dock: DockClient, batch: Batch
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per row of `batch`: (tokens, behaviour log-probs, policy versions) of its response so far."""
    empty = (torch.zeros(0, dtype=torch.long), torch.zeros(0), torch.zeros(0, dtype=torch.int32))
    previous = [empty] * batch.indexes.numel()
    carried = (batch.ages > 0).nonzero().squeeze(1)
    if carried.numel():
        columns = ["responses", "rollout_log_prob", "policy_version"]
        got = dock.peek(columns, batch.indexes[carried], layout="packed")
        parts = [torch.split(got.columns[c], got.lengths[c].tolist()) for c in columns]
        for i, row in enumerate(carried.tolist()):
            previous[row] = (parts[0][i], parts[1][i], parts[2][i])
    return previous


class LogpMismatch:
    """|log p_rollout - log p_train| over the sampled tokens of one stage: sum, count and max."""

    def __init__(self) -> None:
        self.total, self.count, self.max = 0.0, 0, 0.0

    def add(self, rollout: torch.Tensor, train: torch.Tensor) -> None:
        diff = (rollout.float() - train.float()).abs()  # [R]
        self.total += float(diff.sum())
        self.count += diff.numel()
        self.max = max(self.max, float(diff.max())) if diff.numel() else self.max

    def metrics(self) -> dict[str, float]:
        if not self.count:
            return {}
        return {"rollout/logp_mismatch_mean": self.total / self.count, "rollout/logp_mismatch_max": self.max}


def reshard_metrics(stats: Any) -> dict[str, float]:
    """`reshard/*` figures of the last train -> infer resharding (none for a local conversion)."""
    if stats is None:
        return {}
    moved = stats.bytes_sent + stats.bytes_received + stats.bytes_local
    return {
        "reshard/seconds": stats.seconds,
        "reshard/bytes": float(moved),
        "reshard/gbps": moved / max(stats.seconds, 1e-9) / 1e9,
        "reshard/scratch_bytes": float(stats.scratch_bytes),
    }
