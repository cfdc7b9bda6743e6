"""`rl eval compare`: evaluations side by side, each one's difference from the first with its standard error.

The difference is of accuracy (pass@1). Paired when two evaluations decoded the same prompts (the same
prompt text at every index): the standard error of the mean per-prompt difference, which cancels the
prompts' own difficulty; unpaired otherwise: sqrt(var_a / n_a + var_b / n_b) over per-prompt accuracies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from entrepot.cli._errors import CLIUsageError

__all__ = ["Comparison", "Row", "compare_evaluations", "print_comparison"]


@dataclass(frozen=True)
class Row:
    """One evaluation of a comparison."""

    label: str
    path: Path
    metrics: dict[str, float]
    run_dir: str | None
    diff: float | None = None  # accuracy minus the first's (None for the first)
    stderr: float | None = None
    paired: bool | None = None


@dataclass(frozen=True)
class Comparison:
    rows: list[Row]
    pass_keys: list[str]


def _label(doc: dict[str, Any], path: Path) -> str:
    model, settings = doc["model"], doc["settings"]
    what = f"step {model['step']}" if model.get("step") is not None else Path(str(model["path"])).name
    how = (
        "greedy"
        if settings["temperature"] == 0
        else f"n={settings['num_samples']} t={settings['temperature']:g}"
    )
    return f"{what} ({how})"


def _per_prompt(records: Sequence[Any]) -> dict[int, tuple[str, float]]:
    hits: dict[int, list[float]] = {}
    text: dict[int, str] = {}
    for r in records:
        hits.setdefault(r.prompt_index, []).append(float(r.correct))
        text[r.prompt_index] = r.prompt
    return {i: (text[i], sum(v) / len(v)) for i, v in hits.items()}


def _mean_var(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, var


def difference(a: dict[int, tuple[str, float]], b: dict[int, tuple[str, float]]) -> tuple[float, float, bool]:
    """Accuracy of `b` minus `a`, its standard error, and whether it was paired (same prompts)."""
    if a.keys() == b.keys() and all(a[i][0] == b[i][0] for i in a):
        diffs = [b[i][1] - a[i][1] for i in sorted(a)]
        mean, var = _mean_var(diffs)
        return mean, math.sqrt(var / len(diffs)), True
    (ma, va), (mb, vb) = _mean_var([v for _, v in a.values()]), _mean_var([v for _, v in b.values()])
    return mb - ma, math.sqrt(va / len(a) + vb / len(b)), False


def compare_evaluations(paths: Sequence[Path]) -> Comparison:
    """Read the evaluations (`read_eval`) and difference each from the first."""
    from entrepot.grpo.evaluation.records import read_eval

    if len(paths) < 2:
        raise CLIUsageError(f"rl eval compare needs two or more evaluations, got {len(paths)}")
    loaded = [(p, *read_eval(p)) for p in paths]
    for path, _, records in loaded:
        if not records:
            raise CLIUsageError(
                f"{str(path)!r}: its eval_samples.jsonl is missing (needed for the standard error)"
            )
    first = _per_prompt(loaded[0][2])
    rows = []
    for n, (path, doc, records) in enumerate(loaded):
        diff = stderr = paired = None
        if n:
            diff, stderr, paired = difference(first, _per_prompt(records))
        rows.append(
            Row(_label(doc, path), path, doc["metrics"], doc["model"].get("run_dir"), diff, stderr, paired)
        )
    keys = sorted({k for row in rows for k in row.metrics if k.startswith("pass@") and k != "pass@1"},
                  key=lambda k: int(k[5:]))  # fmt: skip
    return Comparison(rows, keys)


def print_comparison(console: Console, comparison: Comparison) -> None:
    table = Table(title="evaluations (difference: accuracy minus the first's)")
    for name in [
        "evaluation",
        "prompts",
        "accuracy",
        *comparison.pass_keys,
        "reward",
        "length",
        "difference",
        "s.e.",
    ]:
        table.add_column(name, justify="left" if name == "evaluation" else "right")
    for row in comparison.rows:
        m = row.metrics
        diff = "-" if row.diff is None else f"{row.diff:+.4f}"
        se = "-" if row.stderr is None else f"{row.stderr:.4f}"
        table.add_row(
            row.label, f"{m['prompts']:g}", f"{m['accuracy']:.4f}",
            *(f"{m[k]:.4f}" if k in m else "-" for k in comparison.pass_keys),
            f"{m['reward_mean']:.4f}", f"{m['response_length']:.2f}", diff, se,
        )  # fmt: skip
    console.print(table)
    first = comparison.rows[0]
    for row in comparison.rows[1:]:  # one line each, never wrapped: the difference and how it was paired
        console.print(
            f"{row.label} - {first.label}: accuracy {row.diff:+.4f} +- {row.stderr:.4f} "
            f"({'paired: same prompts' if row.paired else 'unpaired: other prompts'})",
            soft_wrap=True,
        )
