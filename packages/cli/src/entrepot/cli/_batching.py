"""`rl batching plan`: how a list of lengths splits into DP ranks and token-budgeted micro-batches."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from entrepot.cli._errors import user_errors
from entrepot.cli._lengths import Distribution

batching_app = typer.Typer(
    name="batching", help="Inspect micro-batching and DP balance (entrepot.batching).", no_args_is_help=True
)


@batching_app.command("plan")
def plan(
    lengths_file: Annotated[
        Path | None,
        typer.Option(
            "--lengths-file",
            "-f",
            help="Text/JSON file of sequence lengths; default: generate them.",
            show_default=False,
        ),
    ] = None,
    distribution: Annotated[
        Distribution, typer.Option(help="Shape of generated lengths.")
    ] = Distribution.lognormal,
    count: Annotated[int, typer.Option(min=1, help="How many lengths to generate.")] = 64,
    mean_length: Annotated[float, typer.Option(help="Mean of generated lengths (tokens).")] = 512.0,
    min_length: Annotated[int, typer.Option(help="Generated lengths are clamped to at least this.")] = 16,
    max_length: Annotated[int, typer.Option(help="Generated lengths are clamped to at most this.")] = 2048,
    seed: Annotated[int, typer.Option(help="Seed of generated lengths.")] = 0,
    budget: Annotated[int, typer.Option(min=1, help="Token budget per micro-batch.")] = 4096,
    max_micro_batch_size: Annotated[
        int | None,
        typer.Option(min=1, help="At most this many sequences per micro-batch.", show_default=False),
    ] = None,
    num_ranks: Annotated[int, typer.Option(min=1, help="Data-parallel ranks to balance across.")] = 2,
    group_size: Annotated[
        int, typer.Option(min=1, help="Sequences kept together on one rank (GRPO group size).")
    ] = 1,
    show_indices: Annotated[
        bool, typer.Option(help="List the sequence indices of every micro-batch.")
    ] = False,
) -> None:
    """Split lengths across DP ranks (Karmarkar-Karp), then into micro-batches under a token budget."""
    from entrepot.cli._lengths import generate_lengths, read_lengths

    with user_errors():  # before torch loads (with entrepot.batching): a missing file is said at once
        lengths = (
            read_lengths(lengths_file)
            if lengths_file is not None
            else generate_lengths(distribution, count, mean_length, min_length, max_length, seed)
        )
    from entrepot.batching import BatchingError
    from entrepot.cli._batching_plan import PlanRequest, compute_plan, render_plan

    with user_errors(BatchingError):
        request = PlanRequest(
            budget=budget,
            max_micro_batch_size=max_micro_batch_size,
            num_ranks=num_ranks,
            group_size=group_size,
        )
        result = compute_plan(lengths, request)
    render_plan(result, show_indices)
