"""What `rl grpo train` and `rl grpo eval` do, kept out of the Typer signatures.

Order of work: resolve the config, pick an unused run directory, and call entrepot.grpo.train,
which checks the machine and every input (model directory, tokenizer, every prompt under the chat
template, the gold answers) before it creates anything: a bad input is one `error:` line, exit 2,
and no folder. Once the checks pass the folder exists (it is removed again if the run fails or is
stopped before its first step) and `on_ready` prints its path and starts the live display fed by
`on_step`; library logs and warnings go to the folder's engines.log from then on (held in memory
until then). entrepot.grpo.train writes config.yaml, metrics.jsonl and the checkpoints; finally the
plot is written and the summary printed. Start-up and wall time count from the process's start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
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


def process_started_at() -> float:
    """The `time.perf_counter()` reading at which this process started.

    Linux says when in /proc/self/stat (clock ticks since boot, against /proc/uptime); elsewhere the
    earliest reading left is now, which misses the interpreter's own start and the imports so far.
    """
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(after_name[19])  # field 22 of the file; field 3 is the first after the name
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.perf_counter()
    age = max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    return time.perf_counter() - age


def run_training(request: TrainRequest) -> int:
    """Run (or resume) one training run; return the process exit code."""
    from entrepot.grpo.run.logs import ENGINE_LOG, EngineLogs

    started = process_started_at()
    with EngineLogs() as engine_logs:
        return _run_training(request, started, lambda run: engine_logs.to_file(run / ENGINE_LOG))


def _run_training(request: TrainRequest, started: float, on_folder: Callable[[Path], None]) -> int:
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
        run_dir = unused_run_dir(request.output_dir, config.run_name)  # train() creates it after its checks

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
    interrupt = StepBoundaryInterrupt(lambda text: console.print(f"[yellow]{text}[/]"))
    display = None if request.quiet else TrainDisplay(config.max_steps, done_before, console)
    shown = contextlib.ExitStack()  # the display, once the checks pass

    def on_ready(run: Path) -> None:  # every check passed and the folder exists
        on_folder(run)
        console.print(f"run directory: [bold]{escape(str(run))}[/]")
        if display is not None:
            shown.callback(_end_line, console)  # runs after the display has drawn its last frame
            shown.enter_context(display)

    def on_startup(line: str) -> None:  # printed above the live display, and in -q mode
        console.print(f"[dim]{escape(line)}[/]")

    def on_step(metrics: dict[str, Any]) -> None:
        if display is not None:
            display.update(metrics)
        interrupt.check()

    try:
        with interrupt, shown:
            result = train(config, run_dir, resume=request.resume is not None, on_step=on_step,
                           on_startup=on_startup, on_ready=on_ready, started_at=started)  # fmt: skip
    except StageError as exc:  # a worker failed mid-step: one line here, its traceback in error.log
        return _stage_failed(exc, run_dir, console)
    except BaseException as exc:
        if request.resume is None and not m.read_metrics(metrics_path):  # nothing trained: leave no folder
            shutil.rmtree(run_dir, ignore_errors=True)
        if not isinstance(exc, KeyboardInterrupt):
            raise
        console.print("[yellow]interrupted before a checkpoint could be written[/]")
        return INTERRUPTED_EXIT_CODE
    if display is None:
        console.print()
    records = m.read_metrics(metrics_path)
    plot = write_plot(records, run_dir, config.run_name)
    print_summary(console, result, records, run_dir, plot, time.perf_counter() - started, config)
    if result.interrupted and result.checkpoint is None:  # stopped mid-step before the first save
        console.print("[yellow]interrupted before the first checkpoint[/]: there is nothing to resume")
        return INTERRUPTED_EXIT_CODE
    if result.interrupted:
        console.print(f"[yellow]interrupted[/]: resume with: rl grpo train --resume {escape(str(run_dir))}")
        return INTERRUPTED_EXIT_CODE
    return 0


def _end_line(console: Console) -> None:
    """End the display's last line, so what follows (the summary, an `error:` line) starts a line.

    Piped, the display leaves its last frame's line open; on a terminal it ends it itself, and this
    leaves a blank line.
    """
    console.line()


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
