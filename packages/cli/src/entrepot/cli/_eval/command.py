"""`rl eval PATH`: pass@k, reward, lengths and end reasons of a checkpoint, written to eval.json.

Composes `entrepot.grpo.evaluation.standalone`: `prepare` checks everything a user can get wrong (one
line, exit 2) before `run` loads a model. ``rl eval PATH`` is ``rl eval run PATH``: the group sends an
argument that is not one of its commands to ``run``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from entrepot.cli._errors import user_errors


class _RunByDefault(TyperGroup):
    """``rl eval PATH ...`` runs ``rl eval run PATH ...``; ``rl eval compare ...`` and ``--help`` stay."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # typer's own click Context
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


eval_app = typer.Typer(
    name="eval", cls=_RunByDefault, no_args_is_help=True,
    help="Evaluate a checkpoint (rl eval PATH) or compare evaluations (rl eval compare A B).",
)  # fmt: skip


@eval_app.command("run")
def evaluate(
    path: Annotated[
        Path,
        typer.Argument(
            help="A run directory (its newest checkpoint, or --step), a checkpoint directory, or an HF "
            "model directory (an export or a local model).",
            show_default=False,
        ),
    ],
    step: Annotated[
        int | None, typer.Option(help="The run's checkpoint of this step.", show_default=False)
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            help="A .jsonl / .parquet of prompts and answers; default: the task's held-out split.",
            show_default=False,
        ),
    ] = None,
    num_prompts: Annotated[
        int | None,
        typer.Option(
            "--num-prompts",
            "-n",
            min=1,
            help="Prompts evaluated; default: eval.num_prompts (a --data file: all).",
            show_default=False,
        ),
    ] = None,
    samples: Annotated[int, typer.Option(min=1, help="Responses per prompt (> 1 samples).")] = 1,
    k: Annotated[
        list[int] | None,
        typer.Option(
            "--k", help="pass@k to report (repeatable); default 1 and --samples.", show_default=False
        ),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(
            help="0 is greedy; default: greedy, or rollout.temperature with --samples > 1.",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Sampling seed; default: the run's.", show_default=False)
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help="Rollout engine: torch (embedded KV cache) or hf (HF generate); default: the run's.",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="Config of an HF model directory (task, verifiers).", show_default=False
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder of eval.json / eval_samples.jsonl; default: RUN/evals/step_N-<how>.",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Evaluate a checkpoint: greedy accuracy, or pass@k with --samples N --k K; writes eval.json."""
    with user_errors():
        from entrepot.grpo.evaluation.standalone import prepare

        plan = prepare(
            path, step=step, data=data, num_prompts=num_prompts, samples=samples, ks=k or (),
            temperature=temperature, seed=seed, engine=engine, config_file=config, out_dir=out,
        )  # fmt: skip
        _run(plan, quiet)


def _run(plan: Any, quiet: bool) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from entrepot.cli._eval.report import print_result
    from entrepot.grpo.evaluation.standalone import run

    console = Console()
    total = len(plan.data.samples)
    progress = Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, disable=quiet)  # fmt: skip
    with progress:
        task = progress.add_task("prompts", total=total)
        result = run(plan, on_progress=lambda done: progress.update(task, completed=done))
    print_result(console, plan, result)


@eval_app.command("compare")
def compare(
    evaluations: Annotated[
        list[Path],
        typer.Argument(help="eval.json files, or folders holding one (two or more).", show_default=False),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            help="The plot's PNG; default: RUN/eval_compare.png of the first evaluation's run.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Compare evaluations: each one's figures and its difference from the first with a standard error."""
    with user_errors():
        from rich.console import Console

        from entrepot.cli._eval.compare import compare_evaluations, print_comparison
        from entrepot.cli._eval.plot import write_comparison_plot

        table = compare_evaluations(evaluations)
        console = Console()
        print_comparison(console, table)
        console.print(f"plot: {write_comparison_plot(table, out)}", soft_wrap=True)
