"""`rl grpo samples RUN [--step N] [--last K]`: what the model generated, from RUN/samples.jsonl.

The trainer writes a few prompts, responses and rewards at the first step and every
`logging.samples_every` steps (`entrepot.grpo.run.samples`); this prints them one block each, wrapped to
fit an 80-column terminal (texts are long: a wide table folds them into unreadable slivers).
"""

from __future__ import annotations

import shutil
import textwrap
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
    """Print the sampled prompts, responses, rewards and per-verifier parts of a run, one block each.

    A run writes them at step 1 and every `logging.samples_every` steps (default 10) to RUN/samples.jsonl.
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


WIDTH = 80  # the widest a block gets, however wide the terminal


def format_sample(record: dict[str, Any], width: int = WIDTH) -> str:
    """One sample as a block of lines at most `width` wide: a header (step, reward, correct, parts),
    then the prompt, the response and the answer, each wrapped and indented (its own newlines kept)."""
    correct = "yes" if record.get("accuracy", 0.0) >= 1.0 else "no"
    parts = ", ".join(f"{name}={value:.3f}" for name, value in record.get("parts", {}).items())
    header = f"-- step {record['step']}  reward {record['reward']:.3f}  correct {correct} "
    lines = [header + "-" * max(0, width - len(header))]
    if parts:
        lines += textwrap.wrap(f"parts: {parts}", width, subsequent_indent="  ")
    for name in ("prompt", "response", "answer"):
        lines.append(f"{name}:")
        for line in str(record[name]).splitlines() or [""]:
            lines += textwrap.wrap(
                line, width, initial_indent="  ", subsequent_indent="  ", drop_whitespace=False
            ) or ["  "]
    return "\n".join(line.rstrip() for line in lines)


def print_samples(records: Sequence[dict[str, Any]]) -> None:
    """Each record as a block (`format_sample`), at most 80 columns or the terminal's width."""
    width = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)
    typer.echo("\n\n".join(format_sample(r, width) for r in records))
