"""End-of-run output: the curves PNG, the summary table, and the evaluation table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from entrepot.cli import _metrics as m
from entrepot.cli._plot import PLOT_FILE, plot_curves

if TYPE_CHECKING:
    from rich.console import Console

    from entrepot.grpo import GRPOConfig, TrainResult


REACHED = 0.9  # the summary says when greedy accuracy first reached this


def write_plot(records: Sequence[dict[str, Any]], run_dir: Path, title: str) -> Path | None:
    """Plot reward and accuracy into `run_dir/curves.png`; None when no step finished."""
    if not records:
        return None
    return plot_curves(m.with_elapsed(list(records)), run_dir / PLOT_FILE, title)


def _last(records: Sequence[dict[str, Any]], key: str) -> float | None:
    for record in reversed(records):
        value = m.number(record, key)
        if value is not None:
            return value
    return None


def _best(records: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [v for v in (m.number(r, key) for r in records) if v is not None]
    return max(values) if values else None


def _first_reaching(records: Sequence[dict[str, Any]], key: str, threshold: float) -> str:
    """'step N (T s)' of the first record whose `key` is >= threshold, else '-'."""
    for record in m.with_elapsed(list(records)):
        value = m.number(record, key)
        if value is not None and value >= threshold:
            return f"step {int(record[m.STEP])} ({record[m.ELAPSED]:.1f} s)"
    return "-"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def negative_reward_causes(config: GRPOConfig) -> list[str]:
    """The settings that take reward away, so that a mean below 0 reads as by design, not as a bug."""
    reward, causes = config.reward, []
    if reward.overlong_buffer and reward.overlong_penalty:
        causes.append(
            f"reward.overlong_penalty ({reward.overlong_penalty:g}) is taken from responses in the last "
            f"reward.overlong_buffer ({reward.overlong_buffer}) tokens of the budget"
        )
    causes += [
        f"reward.verifiers.{name} has a negative weight ({weight:g})"
        for name, weight in reward.verifiers.items()
        if weight < 0
    ]
    if reward.models:
        causes.append("reward.models score without a floor (a reward model's score can be below 0)")
    return causes


def print_summary(
    console: Console,
    result: TrainResult,
    records: Sequence[dict[str, Any]],
    run_dir: Path,
    plot: Path | None,
    wall_seconds: float,
    config: GRPOConfig | None = None,
) -> None:
    """A short table: steps, reward, accuracy, time, and where the outputs are.

    With `config`, a final reward below 0 gets a row naming the settings that make it so.
    """
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="GRPO run summary", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("steps", str(int(_last(records, m.STEP) or 0)))
    final_reward = _last(records, m.REWARD)
    table.add_row("final reward (mean)", _fmt(final_reward))
    causes = negative_reward_causes(config) if config is not None else []
    if final_reward is not None and final_reward < 0 and causes:
        table.add_row("reward below 0", escape("by design: " + "; ".join(causes)))
    table.add_row("final accuracy", _fmt(_last(records, m.ACCURACY)))
    table.add_row("best accuracy", _fmt(_best(records, m.ACCURACY)))
    table.add_row(f"first accuracy >= {REACHED}", _first_reaching(records, m.ACCURACY, REACHED))
    table.add_row(
        "training time (all steps)",
        f"{m.with_elapsed(list(records))[-1][m.ELAPSED]:.1f} s" if records else "-",
    )
    startup = m.number(result.history[0], m.STARTUP) if result.history else None
    table.add_row("start-up (this invocation)", "-" if startup is None else f"{startup:.1f} s")
    table.add_row("wall time (this invocation)", f"{wall_seconds:.1f} s")
    table.add_row("run directory", escape(str(run_dir)))
    table.add_row("checkpoint", escape(str(result.checkpoint)) if result.checkpoint else "-")
    table.add_row("plot", escape(str(plot)) if plot else "-")
    console.print(table)
