"""The comparison's plot: accuracy of each evaluation with its difference's standard error (matplotlib,
as the training curves are)."""

from __future__ import annotations

from pathlib import Path

from entrepot.cli._eval.compare import Comparison

__all__ = ["PLOT_FILE", "write_comparison_plot"]

PLOT_FILE = "eval_compare.png"


def write_comparison_plot(comparison: Comparison, out: Path | None) -> Path:
    """Write the PNG to `out`, default the first evaluation's run directory (else beside its eval.json)."""
    from matplotlib.figure import Figure  # not pyplot: no GUI backend, no global figure to close

    first = comparison.rows[0]
    if out is None:
        base = (
            Path(first.run_dir)
            if first.run_dir
            else (first.path if first.path.is_dir() else first.path.parent)
        )
        out = base / PLOT_FILE
    rows = comparison.rows
    figure = Figure(figsize=(max(4.0, 1.6 * len(rows)), 3.6))
    axes = figure.add_subplot()
    accuracy = [row.metrics["accuracy"] for row in rows]
    errors = [0.0 if row.stderr is None else row.stderr for row in rows]
    axes.bar(range(len(rows)), accuracy, yerr=errors, capsize=4, color="#4c72b0")
    axes.set_xticks(range(len(rows)), [row.label for row in rows], rotation=15, ha="right", fontsize=8)
    axes.set_ylabel("accuracy (error bar: s.e. of the difference from the first)", fontsize=8)
    axes.set_ylim(0, 1.05)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    return out
