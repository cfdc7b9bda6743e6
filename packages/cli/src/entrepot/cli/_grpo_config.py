"""`rl grpo config ...`: print the fully resolved configuration, or check a file without running it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from entrepot.cli._errors import user_errors

if TYPE_CHECKING:
    from entrepot.grpo.config import GRPOConfig

config_app = typer.Typer(
    name="config",
    help="Print or check GRPO configurations (YAML files plus dotted KEY=VALUE overrides).",
    no_args_is_help=True,
)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="YAML file; missing keys take the embedded defaults.", show_default=False
    ),
]
OverridesArgument = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="KEY=VALUE",
        help="Dotted overrides such as algorithm.kl_coef=0.01 rollout.n_samples_per_prompt=4.",
        show_default=False,
    ),
]


def load_checked_config(path: Path | None, overrides: Sequence[str]) -> GRPOConfig:
    """`load_config` plus the checks of its sequence lengths (`entrepot.grpo.data.checks`), so that every
    command refuses a config whose prompt + response cannot fit before it does anything else."""
    from entrepot.grpo.config import load_config
    from entrepot.grpo.data.checks import check_task_fits

    config = load_config(path, overrides)
    check_task_fits(config)
    return config


@config_app.command("show")
def show(config: ConfigOption = None, overrides: OverridesArgument = None) -> None:
    """Print the fully resolved configuration as YAML (the embedded default when no file is given)."""
    from entrepot.grpo.config import dump_yaml

    with user_errors():
        resolved = load_checked_config(config, overrides or [])
    typer.echo(dump_yaml(resolved), nl=False)


@config_app.command("validate")
def validate(
    path: Annotated[Path, typer.Argument(help="YAML file to check.", show_default=False)],
    overrides: OverridesArgument = None,
    memory: Annotated[
        bool,
        typer.Option("--memory", "-m", help="Also print the memory estimate per actor rank (loads torch)."),
    ] = False,
) -> None:
    """Check a configuration without running it: keys, types, values, combinations, this machine, and
    the inputs (the model directory's config and tokenizer, every prompt of the prompt files)."""
    from entrepot.grpo.run.preflight import check_inputs, check_machine

    with user_errors():
        resolved = load_checked_config(path, overrides or [])
        check_machine(resolved)
        check_inputs(resolved, every_prompt=True)
        if memory:
            from entrepot.cli._doctor import memory_lines
            from entrepot.grpo.run.memory import estimate_memory

            lines = memory_lines(estimate_memory(resolved))
    typer.echo(
        f"{path}: ok ({resolved.max_steps} steps, {resolved.rollout.prompts_per_step} prompts x "
        f"{resolved.rollout.n_samples_per_prompt} samples, task {resolved.data.task})"
    )
    if memory:
        typer.echo(lines)


@config_app.command("keys")
def keys(
    section: Annotated[
        str | None, typer.Argument(help="Only this section, e.g. algorithm.", show_default=False)
    ] = None,
) -> None:
    """List every configuration key with its type, default and help text."""
    from entrepot.cli._config_keys import describe_keys, render_keys

    with user_errors():
        rows = describe_keys(section)
    render_keys(rows)
