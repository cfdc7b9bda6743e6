"""End-of-run output: the curves PNG, the summary table, and the evaluation table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from entrepot.cli import _metrics as m
from entrepot.cli._plot import PLOT_FILE, plot_curves

if TYPE_CHECKING:
    from rich.console import Console

    from entrepot.grpo import TrainResult


def write_plot(records: Sequence[dict[str, Any]], run_dir: Path, title: str) -> Path | None:
    """Plot reward and accuracy into `run_dir/curves.png`; None when no step finished."""
    if not records:
        return None
    return plot_curves(records, run_dir / PLOT_FILE, title)


def _last(records: Sequence[dict[str, Any]], key: str) -> float | None:
    for record in reversed(records):
        value = m.number(record, key)
        if value is not None:
            return value
    return None


def _best(records: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [v for v in (m.number(r, key) for r in records) if v is not None]
    return max(values) if values else None


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_summary(
    console: Console,
    result: TrainResult,
    records: Sequence[dict[str, Any]],
    run_dir: Path,
    plot: Path | None,
    wall_seconds: float,
) -> None:
    """A short table: steps, reward, accuracy, time, and where the outputs are."""
    from rich.table import Table

    table = Table(title="GRPO run summary", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("steps", str(int(_last(records, m.STEP) or 0)))
    table.add_row("final reward (mean)", _fmt(_last(records, m.REWARD)))
    table.add_row("final accuracy", _fmt(_last(records, m.ACCURACY)))
    table.add_row("best accuracy", _fmt(_best(records, m.ACCURACY)))
    table.add_row("wall time (this invocation)", f"{wall_seconds:.1f} s")
    table.add_row("run directory", str(run_dir))
    table.add_row("checkpoint", str(result.checkpoint))
    table.add_row("plot", str(plot) if plot else "-")
    console.print(table)


def print_evaluation(console: Console, path: Path, result: Any) -> None:
    """Accuracy and reward of an evaluation."""
    from rich.table import Table

    table = Table(title=f"evaluation of {path}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("accuracy", _fmt(result.accuracy))
    table.add_row("reward (mean)", _fmt(result.reward))
    table.add_row("prompts", str(result.num_prompts))
    console.print(table)
