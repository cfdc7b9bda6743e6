"""The `rl` Typer application: sub-apps are registered here, their heavy imports stay inside commands.

`rl --help` must answer in well under a second, so this module and the sub-app modules import only
typer and the standard library; torch, ray, rich tables and the entrepot libraries load inside the
command that needs them.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Annotated

import typer

from entrepot.cli._batching import batching_app
from entrepot.cli._dock import dock_app
from entrepot.cli._errors import user_errors
from entrepot.cli._eval import eval_app
from entrepot.cli._export import export
from entrepot.cli._grpo import grpo_app
from entrepot.cli._grpo_config import ConfigOption, OverridesArgument, load_checked_config
from entrepot.cli._model import model_app
from entrepot.cli._samples import samples
from entrepot.cli.versions import ENTREPOT_DISTRIBUTIONS, STACK_DISTRIBUTIONS, installed_versions

app = typer.Typer(
    name="rl",
    help="Entrepot: RL post-training (GRPO) with an experience dock and co-located resharding.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_show_locals=False,
)
grpo_app.command("export")(export)
grpo_app.command("samples")(samples)
app.add_typer(grpo_app)
app.add_typer(eval_app)
app.add_typer(dock_app)
app.add_typer(batching_app)
app.add_typer(model_app)


def _print_versions(include_stack: bool) -> None:
    for name, version in installed_versions(ENTREPOT_DISTRIBUTIONS).items():
        typer.echo(f"{name} {version}")
    if include_stack:
        for name, version in installed_versions(STACK_DISTRIBUTIONS).items():
            typer.echo(f"{name} {version}")


def _version_callback(value: bool) -> None:
    if value:
        _print_versions(include_stack=True)
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_version_callback,
        is_eager=True,
        help="Print every installed entrepot package and the stack versions, then exit.",
    ),
) -> None:
    """Entrepot RL post-training."""


@app.command("version")
def version_command() -> None:
    """Print every installed entrepot package with its version, plus torch, ray, megatron-core, vllm."""
    _print_versions(include_stack=True)


@app.command("doctor")
def doctor(config: ConfigOption = None, overrides: OverridesArgument = None) -> None:
    """Report versions, devices, engine extras, Ray's address and auth, and a config's memory needs.

    The config is the embedded default unless a file or overrides say otherwise; the report always
    exits 0 (a config that does not fit this machine is a line of it), a bad config exits 2.
    """
    from entrepot.cli._doctor import build_report, render
    from entrepot.resharding import UnknownArchitectureError

    with user_errors(UnknownArchitectureError):
        sections = build_report(load_checked_config(config, overrides or []))
    render(sections)


@app.command("ray-clean")
def ray_clean(
    run_dir: Annotated[Path, typer.Argument(help="The run directory of a killed run.", show_default=False)],
) -> None:
    """Stop the Ray processes a killed run left behind: only that run's own Ray session.

    A run that starts a local Ray records it in its folder; other Rays on the machine are left alone
    (`ray stop --force` would stop them too). `rl grpo train --resume RUN` does this first by itself.
    """
    from entrepot.cli._ray_clean import clean_run

    with user_errors():
        clean_run(run_dir)


def main() -> None:
    """Console-script entry point; usage lines and completion say `rl` however the program starts."""
    try:
        app(prog_name="rl")
    finally:
        # The interpreter's exit would collect every object torch and its kin made (0.9 s after a
        # 2-step run on a loaded 2-core machine, 0.3 s frozen): frozen, they are left to the
        # process's end, so the summary's wall time stays the process's.
        gc.freeze()
