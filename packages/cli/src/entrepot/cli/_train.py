"""What `rl grpo train` and `rl grpo eval` do, kept out of the Typer signatures.

Order of work: resolve the config, pick an unused run directory (entrepot.grpo.train creates it
only once the config's machine and input checks pass; it is removed again if the run fails or is
stopped before its first step), train with the live display fed by `on_step` (entrepot.grpo.train
writes config.yaml, metrics.jsonl and the checkpoints), and finally write the plot and print the
summary.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from entrepot.cli import _metrics as m
from entrepot.cli._errors import CLIUsageError, one_line
from entrepot.cli._grpo_config import load_checked_config
from entrepot.cli._run_dir import resume_config_path, unused_run_dir

if TYPE_CHECKING:
    from rich.console import Console

    from entrepot.grpo.errors import StageError

INTERRUPTED_EXIT_CODE = 130  # the shell convention for "stopped by Ctrl-C"
STAGE_FAILED_EXIT_CODE = 1  # a worker failed; not a usage mistake (2), so scripts can tell them apart
ERROR_LOG = "error.log"


@dataclass(kw_only=True)
class TrainRequest:
    """The parsed command line of `rl grpo train`."""

    config: Path | None
    overrides: list[str] = field(default_factory=list)
    resume: Path | None = None
    output_dir: Path = Path("runs")
    quiet: bool = False


def run_training(request: TrainRequest) -> int:
    """Run (or resume) one training run; return the process exit code."""
    from rich.console import Console
    from rich.markup import escape

    console = Console()
    if request.resume is not None:
        if request.config is not None:
            raise CLIUsageError(
                "--config and --resume cannot be combined: a resumed run keeps its config.yaml "
                "(pass KEY=VALUE overrides to change it)"
            )
        config = load_checked_config(resume_config_path(request.resume), request.overrides)
        run_dir = request.resume
    else:
        config = load_checked_config(request.config, request.overrides)
        run_dir = unused_run_dir(request.output_dir, config.name)  # train() creates it after its checks
    console.print(f"run directory: [bold]{escape(str(run_dir))}[/]")

    from entrepot.cli._interrupt import StepBoundaryInterrupt
    from entrepot.cli._live import TrainDisplay
    from entrepot.cli._report import print_summary, write_plot
    from entrepot.grpo import train
    from entrepot.grpo.errors import StageError
    from entrepot.grpo.run.resume import resume_point

    metrics_path = run_dir / config.logging.metrics_file
    # What a resume continues from is the newest checkpoint, not metrics.jsonl (which may hold steps
    # logged after it, before a crash), once it is shown to be the run's own; a new run has none.
    # Its files are checked by size here (state.json by hash): train() hashes them all next.
    done_before = 0
    if request.resume is not None:
        done_before = resume_point(run_dir, config, hash_only={"state.json"}).step
    if request.resume is not None and done_before >= config.max_steps:
        raise CLIUsageError(
            f"--resume {str(run_dir)!r}: the run's newest checkpoint is at step {done_before} of max_steps "
            f"({config.max_steps}); pass max_steps=N with N > {done_before} to continue it"
        )
    started = time.perf_counter()
    interrupt = StepBoundaryInterrupt(lambda text: console.print(f"[yellow]{text}[/]"))
    display = None if request.quiet else TrainDisplay(config.max_steps, done_before, console)

    def on_startup(line: str) -> None:  # printed above the live display, and in -q mode
        console.print(f"[dim]{escape(line)}[/]")

    def on_step(metrics: dict[str, Any]) -> None:
        if display is not None:
            display.update(metrics)
        interrupt.check()

    try:
        with interrupt, display or contextlib.nullcontext():
            result = train(
                config, run_dir, resume=request.resume is not None, on_step=on_step, on_startup=on_startup
            )
    except StageError as exc:  # a worker failed mid-step: one line here, its traceback in error.log
        return _stage_failed(exc, run_dir, console)
    except BaseException as exc:
        if request.resume is None and not m.read_metrics(metrics_path):  # nothing trained: leave no folder
            shutil.rmtree(run_dir, ignore_errors=True)
        if not isinstance(exc, KeyboardInterrupt):
            raise
        console.print("[yellow]interrupted before a checkpoint could be written[/]")
        return INTERRUPTED_EXIT_CODE
    console.print()
    records = m.read_metrics(metrics_path)
    plot = write_plot(records, run_dir, config.name)
    print_summary(console, result, records, run_dir, plot, time.perf_counter() - started)
    if result.interrupted and result.checkpoint is None:  # stopped mid-step before the first save
        console.print("[yellow]interrupted before the first checkpoint[/]: there is nothing to resume")
        return INTERRUPTED_EXIT_CODE
    if result.interrupted:
        console.print(f"[yellow]interrupted[/]: resume with: rl grpo train --resume {escape(str(run_dir))}")
        return INTERRUPTED_EXIT_CODE
    return 0


def _stage_failed(error: StageError, run_dir: Path, console: Console) -> int:
    """Report a failed stage on one line, keep the worker's traceback in the run's error.log."""
    from rich.markup import escape

    from entrepot.grpo.run.checkpoint import latest_checkpoint

    log = run_dir / ERROR_LOG
    log.write_text(f"{error}\n\n{error.details or '(no traceback: the worker did not answer)'}")
    typer.echo(f"error: {one_line(str(error))}", err=True)
    console.print(f"the worker's traceback: {escape(str(log))}", soft_wrap=True)
    if latest_checkpoint(run_dir) is not None:
        console.print(
            f"resume from the last checkpoint: rl grpo train --resume {escape(str(run_dir))}", soft_wrap=True
        )
    return STAGE_FAILED_EXIT_CODE


def run_evaluation(path: Path, num_prompts: int | None) -> None:
    """Evaluate a run directory's latest checkpoint (or a checkpoint directory) and print the result."""
    if not path.exists():
        raise CLIUsageError(f"{str(path)!r} does not exist (expected a run directory or a checkpoint)")
    from rich.console import Console

    from entrepot.cli._report import print_evaluation
    from entrepot.grpo import evaluate

    print_evaluation(Console(), path, evaluate(path, num_prompts))
