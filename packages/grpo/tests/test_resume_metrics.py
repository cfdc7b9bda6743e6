"""A run stopped and resumed writes the metrics of a run that never stopped, at every step.

One six-step run straight through; another stopped twice the way a kill stops it (after a step is
logged, before its checkpoint: an exception from `on_step` after steps 3 and 5, checkpoints every
two steps) and resumed each time. Every key but the measured ones (`run.metrics.is_measured`:
seconds, rates, memory peaks) must be equal at every step, the dock's rows per step included: before,
the first step after each resume reported the run's cumulative dock totals (96 and 160 rows at
steps 3 and 5 here, instead of 32). `packages/cli/tests/test_kill_resume.py` checks the same over
ten SIGKILLs of `rl grpo train`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from entrepot.grpo import load_config, train
from entrepot.grpo.run.metrics import is_measured, read_metrics

pytestmark = pytest.mark.integration  # training runs

OVERRIDES = ["eval.num_prompts=16", "eval.every=2", "logging.tensorboard=false", "checkpoint.keep_last=0",
             "resources.use_ray=false", "rollout.prompts_per_step=4", "checkpoint.save_every=2",
             "max_steps=6"]  # fmt: skip


class Killed(Exception):
    """Stands in for a SIGKILL: the step is logged, its checkpoint is not written."""


def _stop_after(step: int) -> Any:
    def on_step(metrics: dict[str, Any]) -> None:
        if metrics["step"] == step:
            raise Killed

    return on_step


def _computed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in record.items() if not is_measured(k)} for record in records]


def test_a_resumed_run_writes_the_metrics_of_an_uninterrupted_one(tmp_path: Path) -> None:
    config = load_config(None, OVERRIDES)
    train(config, tmp_path / "straight")
    stopped = tmp_path / "stopped"
    with pytest.raises(Killed):
        train(config, stopped, on_step=_stop_after(3))
    with pytest.raises(Killed):
        train(config, stopped, resume=True, on_step=_stop_after(5))
    train(config, stopped, resume=True)
    want, got = (read_metrics(run / "metrics.jsonl") for run in (tmp_path / "straight", stopped))
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]
    assert [r["dock/actor_train/rows"] for r in got] == [32] * 6
    for expected, actual in zip(_computed(want), _computed(got), strict=True):
        assert actual == expected, actual["step"]
