"""Reading the trainer's per-step metrics (metrics.jsonl) and the names of the keys the CLI shows.

The trainer owns the metric names; the CLI only picks a few of them for display, summary and plot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP = "step"
REWARD = "reward_mean"
ACCURACY = "accuracy"  # greedy accuracy on held-out prompts, on eval steps only
EVAL_REWARD = "eval_reward"  # mean reward of the greedy held-out responses
EVAL_PROMPTS = "eval_prompts"  # how many held-out prompts that evaluation decoded
TRAIN_ACCURACY = "train_accuracy"  # share of sampled responses that were correct, every step
KL = "kl"
TOKENS_PER_S = "tokens_per_s"
STEP_TIME = "time/step"
STARTUP = "time/startup"  # the first step of each session: workers started, models built, state restored
# engine.rollout=vllm: mean / max |log p_rollout - log p_train| of the sampled tokens (weight-sync health)
LOGP_MISMATCH_MEAN = "rollout/logp_mismatch_mean"
LOGP_MISMATCH_MAX = "rollout/logp_mismatch_max"
RESHARD_SECONDS = "reshard/seconds"  # engine.train=megatron: train -> infer weight sync
RESHARD_GBPS = "reshard/gbps"
EVAL_TIME = "time/eval"
ELAPSED = "elapsed"  # added by `with_elapsed`: training seconds since the run began
STAGE_PREFIX = "time/"
DOCK_PREFIX = "dock/"  # dock/<consumer>/rows|bytes|wait_s: what each dock consumer read this step
# The GRPO pipeline order of the dock consumers; consumers not listed follow in record order.
DOCK_CONSUMERS = (
    "actor_rollout",
    "rule_reward",
    "ref_log_prob",
    "actor_log_prob",
    "teacher_log_prob",  # on-policy distillation's teacher stage
    "compute_advantage",
    "actor_train",
    "grpo_metrics",
)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file, in order (an empty list when it does not exist yet)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        if line.strip():
            records.append(json.loads(line))
    return records


def with_elapsed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of `records` with `elapsed`: the running sum of step and eval time.

    Summing the trainer's own timings (instead of wall-clock stamps) keeps the time axis continuous
    across a resume and leaves out start-up (Ray, model build), which is not training.
    """
    total = 0.0
    out = []
    for record in records:
        total += (number(record, STEP_TIME) or 0.0) + (number(record, EVAL_TIME) or 0.0)
        out.append({**record, ELAPSED: total})
    return out


def number(record: Mapping[str, Any], key: str) -> float | None:
    """`record[key]` as a float, or None when the step did not report it."""
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def stage_times(record: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per stage of one step (`time/<stage>` keys), without the totals."""
    skip = {ELAPSED, STEP_TIME, EVAL_TIME, STARTUP}
    return {
        key.removeprefix(STAGE_PREFIX): float(value)
        for key, value in record.items()
        if key.startswith(STAGE_PREFIX) and key not in skip and isinstance(value, (int, float))
    }


@dataclass(frozen=True)
class DockFigures:
    """What one dock consumer read in one step: rows, bytes and seconds spent waiting for them."""

    rows: float = 0.0
    nbytes: float = 0.0
    wait_s: float = 0.0


_DOCK_FIELDS = {"rows": "rows", "bytes": "nbytes", "wait_s": "wait_s"}  # key suffix -> DockFigures field


def dock_figures(record: Mapping[str, Any]) -> dict[str, DockFigures]:
    """Rows, bytes and wait seconds per dock consumer of one step (`dock/<consumer>/<figure>` keys).

    The trainer leaves out figures that did not change during the step, so a missing one is 0.
    Consumers come in GRPO pipeline order (`DOCK_CONSUMERS`), unknown ones after them.
    """
    found: dict[str, dict[str, float]] = {}
    for key in record:
        if not key.startswith(DOCK_PREFIX):
            continue
        consumer, _, figure = key[len(DOCK_PREFIX) :].rpartition("/")
        value = number(record, key)
        if consumer and figure in _DOCK_FIELDS and value is not None:
            found.setdefault(consumer, {})[_DOCK_FIELDS[figure]] = value
    rank = {name: i for i, name in enumerate(DOCK_CONSUMERS)}
    order = sorted(found, key=lambda name: rank.get(name, len(rank)))  # stable: unknowns keep record order
    return {name: DockFigures(**found[name]) for name in order}
