"""The end-of-run PNG: reward and accuracy over steps (left) and over training time (right)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from entrepot.cli import _metrics as m

PLOT_FILE = "curves.png"


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float], list[float]]:
    """(steps, elapsed seconds, values) of the records that report `key`."""
    steps, times, values = [], [], []
    for record in records:
        value, step = m.number(record, key), m.number(record, m.STEP)
        if value is None or step is None:
            continue
        steps.append(step)
        times.append(m.number(record, m.ELAPSED) or 0.0)
        values.append(value)
    return steps, times, values


def plot_curves(records: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Write the reward/accuracy figure for `records` (metrics.jsonl rows) to `path` and return it."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for key, label, style in ((m.REWARD, "reward (mean)", "-"), (m.ACCURACY, "accuracy (greedy)", "o-")):
        steps, times, values = _series(records, key)
        by_step.plot(steps, values, style, label=label, markersize=3)
        by_time.plot(times, values, style, label=label, markersize=3)
    by_step.set_xlabel("step")
    by_time.set_xlabel("training time (s): sum of step and eval times")
    by_step.set_ylabel("value")
    for axis in (by_step, by_time):
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
