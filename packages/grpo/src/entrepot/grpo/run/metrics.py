"""Per-step metrics: merged across ranks, appended to metrics.jsonl, mirrored to TensorBoard and
(`logging.wandb`) to Weights & Biases.

A resumed run writes, at every step, the same values as a run that was never stopped, except for
the keys `is_measured` names: seconds and rates, and memory peaks, which are measurements of the
process and the machine rather than functions of the run's data (on CPU a peak counts the model
state resident at the time, and the first step after a resume holds no gradients until its update;
on a GPU it is the allocator's, whose cache depends on the process's history). The dock's counters
are cumulative over the run and checkpointed with it; a step reports what it moved
(`dock_step_metrics` against the totals at the previous step, or at the checkpoint it resumed from).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from entrepot.grpo import _install
from entrepot.grpo.errors import GRPOConfigError

if TYPE_CHECKING:
    from entrepot.grpo.config import LoggingConfig

__all__ = [
    "MetricsWriter",
    "WandbWriter",
    "check_wandb",
    "dock_step_metrics",
    "is_measured",
    "merge_rank_metrics",
    "read_metrics",
]

# Stage timings of parallel ranks overlap: the step waits for the slowest one; memory peaks likewise.
_MAX_KEYS = ("time/", "memory/")
_MAX_SUFFIXES = ("_max",)
_SUM_KEYS = ("rollout_tokens", "train_tokens", "multiturn/trajectories", "multiturn/env_failures")
# trajectories per end reason, programs and judged rows per verdict (and the judge's cache hits)
_SUM_PREFIXES = ("multiturn/end_", "reward/code_", "reward/judge_")
_DOCK_COUNTERS = (("rows_got", "rows"), ("bytes_got", "bytes"), ("wait_s", "wait_s"))
_MEASURED_PREFIXES = ("time/", "memory/")
_MEASURED_SUFFIXES = ("wait_s", "per_s", "/seconds", "/gbps")


def is_measured(key: str) -> bool:
    """Whether a metric is a measurement of the process and machine (seconds, rates, memory peaks).

    Only these keys may differ between a resumed run and an uninterrupted one at the same step.
    """
    return key.startswith(_MEASURED_PREFIXES) or key.endswith(_MEASURED_SUFFIXES)


def merge_rank_metrics(
    stage_stats: Sequence[Mapping[str, float]], update_stats: Sequence[Mapping[str, float]]
) -> dict[str, float]:
    """Combine worker results: times take the max over ranks, token and trajectory counts the sum, the
    rest the mean."""
    merged: dict[str, list[float]] = {}
    for stats in [*stage_stats, *update_stats]:
        for key, value in stats.items():
            merged.setdefault(key, []).append(float(value))
    out: dict[str, float] = {}
    for key, values in merged.items():
        if key.startswith(_MAX_KEYS) or key.endswith(_MAX_SUFFIXES):
            out[key] = max(values)
        elif key in _SUM_KEYS or key.startswith(_SUM_PREFIXES):
            out[key] = sum(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def dock_step_metrics(totals: Mapping[str, float], previous: dict[str, float]) -> dict[str, float]:
    """This step's rows, bytes and wait seconds per dock consumer (`dock/<consumer>/<figure>`).

    Args:
        totals: the dock's cumulative `metrics()` now.
        previous: the totals at the previous call (updated in place).

    Consumers that read nothing this step are left out.
    """
    out: dict[str, float] = {}
    for counter, figure in _DOCK_COUNTERS:
        prefix = f"dock/{counter}/"
        for key, value in totals.items():
            if not key.startswith(prefix):
                continue
            delta = value - previous.get(key, 0.0)
            previous[key] = value
            consumer = key[len(prefix) :]
            if delta or f"dock/{consumer}/rows" in out:
                out[f"dock/{consumer}/{figure}"] = delta
    return out


def _tensorboard_writer(directory: Path, purge_step: int | None = None) -> Any:
    """A TensorBoard SummaryWriter, or None when tensorboard is not installed (it is optional).

    `purge_step`: hide the events already logged at this step and after (the steps a resume repeats).
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(directory), purge_step=purge_step)


class MetricsWriter:
    """Appends one JSON object per step to `run_dir/metrics.jsonl` (and TensorBoard when installed)."""

    def __init__(self, run_dir: Path, config: LoggingConfig) -> None:
        self.path = run_dir / config.metrics_file  # relative, without '..' (the config checks)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb_dir = run_dir / "tensorboard"
        self._tb: Any = None
        if config.tensorboard:
            self._tb = _tensorboard_writer(self._tb_dir)

    def write(self, metrics: Mapping[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(dict(metrics)) + "\n")
        if self._tb is not None:
            step = int(metrics["step"])
            for key, value in metrics.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)

    def truncate(self, last_step: int) -> None:
        """Drop records of steps after `last_step` (a resumed run repeats them), in TensorBoard too."""
        if self.path.is_file():
            kept = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= last_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        if self._tb is not None:
            self._tb.close()
            self._tb = _tensorboard_writer(self._tb_dir, purge_step=last_step + 1)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All step records of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric values of a step's metrics (a flag or a text is not a scalar to plot)."""
    return {
        key: float(value)
        for key, value in metrics.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def check_wandb(config: LoggingConfig) -> None:
    """Raise `GRPOConfigError` before the run starts if `logging.wandb` is set and wandb is not installed."""
    if config.wandb and importlib.util.find_spec("wandb") is None:
        raise GRPOConfigError(
            f"logging.wandb (true) needs wandb, which is not installed: {_install.WANDB}, "
            "or logging.wandb=false"
        )


_SAMPLE_COLUMNS = ("step", "prompt", "response", "answer", "reward", "accuracy", "parts")


class WandbWriter:
    """Logs each step's numeric metrics, and a table of its samples, to a Weights & Biases run.

    The run's files go to `run_dir/wandb/` (offline: `offline-run-*`, uploaded later with `wandb sync`).
    The mode is `logging.wandb_mode` unless the WANDB_MODE environment variable says otherwise. Each
    session (a resume too) is a W&B run of its own, named after the config's `name`.

    Args:
        run_dir: the run directory.
        config: the `logging` section.
        name: the run's name.
        run_config: the whole config as a dict (shown with the W&B run).
    """

    def __init__(
        self, run_dir: Path, config: LoggingConfig, name: str, run_config: Mapping[str, Any]
    ) -> None:
        import wandb

        mode: Literal["online", "offline"] = "online" if config.wandb_mode == "online" else "offline"
        self._wandb = wandb
        self._run = wandb.init(  # None: wandb reads WANDB_MODE itself
            project=config.wandb_project, name=name, dir=str(run_dir), config=dict(run_config),
            mode=None if os.environ.get("WANDB_MODE") else mode,
        )  # fmt: skip

    def write(self, metrics: Mapping[str, Any], samples: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Log one step: its numbers, and its samples as a table (`samples`) when it wrote some."""
        record: dict[str, Any] = _numbers(metrics)
        step = int(record.pop("step"))
        if samples:
            rows = [[*(s[c] for c in _SAMPLE_COLUMNS[:-1]), json.dumps(s["parts"])] for s in samples]
            record["samples"] = self._wandb.Table(columns=list(_SAMPLE_COLUMNS), data=rows)
        self._run.log(record, step=step)

    def close(self) -> None:
        self._run.finish()
