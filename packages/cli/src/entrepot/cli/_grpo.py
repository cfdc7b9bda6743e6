"""`rl grpo ...`: train, evaluate, and inspect configurations. Composes entrepot.grpo; no algorithm here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from entrepot.cli._check_template import check_template
from entrepot.cli._errors import user_errors
from entrepot.cli._eval.command import evaluate
from entrepot.cli._grpo_config import ConfigOption, OverridesArgument, config_app

grpo_app = typer.Typer(name="grpo", help="Train and evaluate with GRPO.", no_args_is_help=True)
grpo_app.add_typer(config_app)


@grpo_app.command("train")
def train(
    config: ConfigOption = None,
    overrides: OverridesArgument = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Continue the run in this directory from its last checkpoint.", show_default=False),
    ] = None,
    output_dir: Annotated[
        Path, typer.Option("--output-dir", "-o", help="Parent folder of new run directories.")
    ] = Path("runs"),
    name: Annotated[
        str | None, typer.Option(help="Run name (overrides the config's name).", show_default=False)
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed (overrides the config's seed).", show_default=False)
    ] = None,
    max_steps: Annotated[
        int | None, typer.Option(help="GRPO steps (overrides the config's max_steps).", show_default=False)
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No live display; print only the summary.")
    ] = False,
) -> None:
    """Train with GRPO: the embedded default (reverse 8 digits on CPU) or any YAML config.

    Writes runs/<name>-<timestamp>/ with config.yaml, metrics.jsonl, checkpoints and curves.png.
    Ctrl-C saves a checkpoint and exits; --resume RUN_DIR continues from it.
    """
    from entrepot.cli._train import TrainRequest, run_training

    request = TrainRequest(
        config=config,
        overrides=[*(overrides or []), *_flag_overrides(name, seed, max_steps)],
        resume=resume,
        output_dir=output_dir,
        quiet=quiet,
    )
    with user_errors():
        code = run_training(request)
    raise typer.Exit(code)


def _flag_overrides(name: str | None, seed: int | None, max_steps: int | None) -> list[str]:
    """The convenience flags as dotted overrides, so the config validates them like any other key."""
    flags = {"name": name, "seed": seed, "max_steps": max_steps}
    return [f"{key}={value}" for key, value in flags.items() if value is not None]


grpo_app.command("eval")(evaluate)  # `rl eval run` under its old name
grpo_app.command("check-template")(check_template)  # after train and eval in `rl grpo --help`
