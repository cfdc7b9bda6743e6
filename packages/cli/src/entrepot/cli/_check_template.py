"""`rl grpo check-template MODEL_DIR`: is the model's chat template append-only for multi-turn rollouts?

Composes `entrepot.grpo.multiturn.template_check`; imports it (and transformers) inside the command
so that `rl --help` stays instant. Exit codes: 0 append-only, 1 not (the turn and tokens where the
renderings part are printed), 2 a directory or tokenizer that does not load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from entrepot.cli._errors import user_errors

NOT_APPEND_ONLY_EXIT_CODE = 1


def check_template(
    model_dir: Annotated[
        Path, typer.Argument(help="A local HF model directory (its tokenizer is read).", show_default=False)
    ],
    role: Annotated[
        str, typer.Option(help="The role of the environment's messages in the checked conversation.")
    ] = "tool",
) -> None:
    """Check that a model's chat template is append-only, as multi-turn rollouts need.

    A multi-turn rollout appends each turn's tokens, so the template must write earlier turns the same
    whatever follows them. Renders a calculator conversation turn by turn and whole; prints the turns
    and tokens checked (exit 0), or the first turn and tokens where the two renderings part (exit 1).
    """
    from entrepot.grpo.engines.models import load_tokenizer
    from entrepot.grpo.multiturn.template_check import check_template as check
    from entrepot.grpo.multiturn.template_check import default_conversation

    with user_errors():
        report = check(load_tokenizer(model_dir), default_conversation(role))
    if not report.ok:
        typer.echo(report.message)
        raise typer.Exit(NOT_APPEND_ONLY_EXIT_CODE)
    typer.echo(f"{report.message} ({model_dir})")
