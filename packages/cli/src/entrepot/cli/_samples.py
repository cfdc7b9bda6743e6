"""`rl grpo samples RUN [--step N] [--last K]`: what the model generated, from RUN/samples.jsonl.

The trainer writes a few prompts, responses and rewards every `logging.samples_every` steps
(`entrepot.grpo.run.samples`); this prints them as a table. Imports rich inside the command.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from entrepot.cli._errors import CLIUsageError, user_errors

SAMPLES_FILE = (
    "samples.jsonl"  # entrepot.grpo.run.samples.SAMPLES_FILE (not imported: `rl --help` stays light)
)


def samples(
    run_dir: Annotated[Path, typer.Argument(help="The run directory.", show_default=False)],
    step: Annotated[
        int | None,
        typer.Option(min=1, help="The step's samples; default: the newest sampled step.", show_default=False),
    ] = None,
    last: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The last K samples over all steps (of --step's only, with --step).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print the sampled prompts, responses, rewards and per-verifier parts of a run as a table.

    A run writes them every `logging.samples_every` steps (default 10) to RUN/samples.jsonl.
    """
    with user_errors():
        records = select_samples(load_samples(run_dir), step, last)
        print_samples(records)


def load_samples(run_dir: Path) -> list[dict[str, Any]]:
    """The records of `run_dir/samples.jsonl`; a `CLIUsageError` when the run has none."""
    from entrepot.grpo.run.samples import read_samples

    path = run_dir / SAMPLES_FILE
    if not path.is_file():
        raise CLIUsageError(
            f"{str(run_dir)!r} has no {SAMPLES_FILE} (not a run directory, no step sampled yet, "
            "or logging.samples_every=0)"
        )
    records = read_samples(path)
    if not records:
        raise CLIUsageError(f"{str(path)!r} holds no samples yet")
    return records


def select_samples(
    records: Sequence[dict[str, Any]], step: int | None, last: int | None
) -> list[dict[str, Any]]:
    """The samples of `step` (default: the newest sampled step), or the last `last` ones."""
    if step is not None:
        chosen = [r for r in records if int(r["step"]) == step]
        if not chosen:
            steps = sorted({int(r["step"]) for r in records})
            raise CLIUsageError(f"--step {step}: no samples; sampled steps: {', '.join(map(str, steps))}")
    elif last is None:
        newest = max(int(r["step"]) for r in records)
        chosen = [r for r in records if int(r["step"]) == newest]
    else:
        chosen = list(records)
    return chosen[-last:] if last is not None else chosen


def print_samples(records: Sequence[dict[str, Any]]) -> None:
    """A rich table: step, prompt, response, answer, reward, its parts and accuracy."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="samples", show_lines=True)
    table.add_column("step", justify="right")
    for name in ("prompt", "response", "answer"):
        table.add_column(name, overflow="fold")
    table.add_column("reward", justify="right")
    table.add_column("parts")
    table.add_column("correct", justify="center")
    for r in records:
        parts = "\n".join(f"{name}={value:.3f}" for name, value in r.get("parts", {}).items())
        table.add_row(
            str(r["step"]), escape(r["prompt"]), escape(r["response"]), escape(r["answer"]),
            f"{r['reward']:.3f}", escape(parts), "yes" if r.get("accuracy", 0.0) >= 1.0 else "no",
        )  # fmt: skip
    Console().print(table)
