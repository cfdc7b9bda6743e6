"""The end-of-run PNG: reward, accuracy and KL over steps (left) and over training time (right)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from entrepot.cli import _metrics as m

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOT_FILE = "curves.png"
# One row of panels per metric: (metrics.jsonl key, y label, line style).
PANELS = (
    (m.REWARD, f"reward ({m.REWARD})", "-"),
    (m.ACCURACY, f"greedy accuracy ({m.ACCURACY})", "o-"),
    (m.KL, f"KL to the reference ({m.KL})", "-"),
)
TIME_LABEL = "training time (s) from step 1: steps and evals, start-up excluded"


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


def curves_figure(records: Sequence[dict[str, Any]], title: str) -> Figure:
    """The figure for `records` (metrics.jsonl rows with `elapsed`, see `with_elapsed`)."""
    from matplotlib.figure import Figure  # not pyplot: no GUI backend, no global figure to close
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(11, 2.6 * len(PANELS)))
    axes = fig.subplots(len(PANELS), 2, sharex="col", squeeze=False)
    for (key, label, style), (by_step, by_time) in zip(PANELS, axes, strict=True):
        steps, times, values = _series(records, key)
        by_step.plot(steps, values, style, markersize=3)
        by_time.plot(times, values, style, markersize=3)
        for axis in (by_step, by_time):
            axis.set_ylabel(label)
            axis.grid(alpha=0.3)
            if not values:
                axis.text(0.5, 0.5, f"no {key!r} in the metrics", ha="center", transform=axis.transAxes)
        by_step.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        by_time.set_xlim(left=0)  # 0 is when step 1 began; start-up is not on this axis
    axes[-1][0].set_xlabel("step")
    axes[-1][1].set_xlabel(TIME_LABEL)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_curves(records: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Write the curves of `records` (metrics.jsonl rows with `elapsed`) to `path` and return it."""
    curves_figure(records, title).savefig(path, dpi=110)
    return path
