"""Start the dock for `rl dock bench` and print its result table."""

from __future__ import annotations

from typing import Any

from entrepot.cli._dock_bench import DockBenchResult, DockWorkload
from entrepot.cli._errors import CLIUsageError


def launch_client(workload: DockWorkload, backend: str) -> Any:
    """A GRPODock in this process, or a Ray actor holding one (local Ray started here)."""
    from entrepot.dock import GRPODock

    if workload.dispatch_size % workload.n_samples:
        raise CLIUsageError(
            f"--dispatch-size ({workload.dispatch_size}) must be a multiple of --n-samples "
            f"({workload.n_samples}): gets take whole prompt groups"
        )
    kwargs: dict[str, Any] = {
        "prompts_num": workload.prompts,
        "n_samples_per_prompt": workload.n_samples,
        "seed": workload.seed,
    }
    if backend == "local":
        return GRPODock(**kwargs)
    import ray

    from entrepot.dock.ray import RayDockClient

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    client = RayDockClient.launch(GRPODock, **kwargs)
    client.metrics()  # wait until the actor is up, so its start-up is not timed as the first put
    return client


def render_result(workload: DockWorkload, backend: str, result: DockBenchResult) -> None:
    """Per-stage calls, rows, dock seconds and rows/s, then the per-iteration wall time."""
    from rich.console import Console
    from rich.table import Table

    w = workload
    table = Table(
        title=(
            f"dock bench ({backend}, {w.layout}): {w.prompts} prompts x {w.n_samples} samples, "
            f"~{w.prompt_length}+{w.response_length} tokens, {w.iterations} iterations"
        )
    )
    for column in ("stage", "calls", "rows", "dock seconds", "rows/s", "ms per call"):
        table.add_column(column, justify="right" if column != "stage" else "left")
    for stage, stats in result.stages.items():
        rate = stats.rows / stats.seconds if stats.seconds else float("inf")
        per_call = 1000 * stats.seconds / stats.calls if stats.calls else 0.0
        table.add_row(stage, str(stats.calls), str(stats.rows), f"{stats.seconds:.3f}", f"{rate:,.0f}",
                      f"{per_call:.2f}")  # fmt: skip
    dock_seconds = sum(s.seconds for s in result.stages.values())
    console = Console()
    console.print(table)
    iters = result.iteration_seconds
    console.print(
        f"dock time per iteration {dock_seconds / len(iters) * 1000:.1f} ms; "
        f"wall per iteration (with data generation) {sum(iters) / len(iters) * 1000:.1f} ms; "
        f"peak bytes stored {result.bytes_stored / 2**20:.1f} MiB"
    )
