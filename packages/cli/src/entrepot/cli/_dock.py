"""`rl dock bench`: run the experience dock's GRPO workload at a chosen size and show where time goes."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from entrepot.cli._errors import user_errors

dock_app = typer.Typer(
    name="dock", help="Inspect and benchmark the experience dock (entrepot.dock).", no_args_is_help=True
)


class Backend(StrEnum):
    """Where the dock lives."""

    local = "local"
    ray = "ray"


class Layout(StrEnum):
    """How gets return sequence columns."""

    padded = "padded"
    packed = "packed"


@dock_app.command("bench")
def bench(
    prompts: Annotated[int, typer.Option(min=1, help="Prompts per iteration.")] = 64,
    n_samples: Annotated[int, typer.Option(min=1, help="Responses per prompt (group size).")] = 8,
    prompt_length: Annotated[int, typer.Option(min=1, help="Mean prompt tokens (lognormal).")] = 128,
    response_length: Annotated[int, typer.Option(min=1, help="Mean response tokens (lognormal).")] = 512,
    dispatch_size: Annotated[
        int, typer.Option(min=1, help="Rows per get (a multiple of --n-samples: gets take whole groups).")
    ] = 64,
    iterations: Annotated[int, typer.Option(min=1, help="GRPO iterations to run.")] = 5,
    backend: Annotated[Backend, typer.Option(help="In this process, or in a Ray actor.")] = Backend.local,
    layout: Annotated[Layout, typer.Option(help="Layout of the batches gets return.")] = Layout.padded,
    seed: Annotated[int, typer.Option(help="Seed of the generated data.")] = 0,
) -> None:
    """Push GRPO iterations (put prompts, rollout, ref, reward, advantages, update, clear) through a dock."""
    from entrepot.cli._dock_bench import DockWorkload, run_dock_bench
    from entrepot.cli._dock_report import launch_client, render_result

    workload = DockWorkload(
        prompts=prompts,
        n_samples=n_samples,
        prompt_length=prompt_length,
        response_length=response_length,
        dispatch_size=dispatch_size,
        iterations=iterations,
        layout=layout.value,
        seed=seed,
    )
    from rich.progress import Progress

    with user_errors():
        client = launch_client(workload, backend.value)
        with Progress(transient=True) as progress:
            task = progress.add_task(f"dock bench ({backend.value})", total=iterations)
            result = run_dock_bench(workload, client, lambda done: progress.update(task, completed=done))
    render_result(workload, backend.value, result)
