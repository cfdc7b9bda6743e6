"""What `rl eval` prints: the figures of one evaluation and where its files went."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["print_result"]


def print_result(console: Console, plan: Any, result: Any) -> None:
    """One table of the figures (pass@k, reward, lengths, end reasons), the audit's flags, the files."""
    target, settings = plan.target, plan.settings
    what = f"step {target.step}" if target.step is not None else str(target.model_dir)
    sampled = f"{settings.num_samples} samples, temperature {settings.temperature:g}, seed {settings.seed}"
    how = "greedy" if settings.temperature == 0 else sampled
    # on its own line, never wrapped by rich: the path stays whole (and copyable) on any width
    console.print(f"evaluated: {escape(str(target.checkpoint or target.model_dir))}", soft_wrap=True)
    table = Table(title=f"evaluation of {escape(what)} ({how}, {plan.data.source})", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for key, value in result.metrics.items():
        table.add_row(
            key, f"{value:.4f}" if isinstance(value, float) and not value.is_integer() else f"{value:g}"
        )
    explained = result.audit.get("hacking/format_explained")
    table.add_row("hacking/format_explained", "-" if explained is None else f"{explained:.3f}")
    console.print(table)
    for flag in result.audit.get("flags", []):
        console.print(f"[bold yellow]warning: reward hacking? {flag} at or above its threshold "
                      f"({result.audit['thresholds'][flag]})", soft_wrap=True)  # fmt: skip
    console.print(f"eval: {escape(str(result.eval_file))}", soft_wrap=True)
    console.print(f"samples: {escape(str(result.samples_file))}", soft_wrap=True)
