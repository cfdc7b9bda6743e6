"""`rl grpo export RUN [--step N] [--out DIR]`: a checkpoint as an HF model directory.

Composes `entrepot.grpo.run.export`; imports it inside the command so that `rl --help` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from entrepot.cli._errors import user_errors


def export(
    run_dir: Annotated[Path, typer.Argument(help="The run directory.", show_default=False)],
    step: Annotated[
        int | None,
        typer.Option(
            min=0, help="The checkpoint's step; default: the newest complete one.", show_default=False
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Where to write; default: RUN/export/step_NNNNNN.", show_default=False
        ),
    ] = None,
) -> None:
    """Write a checkpoint as an HF model directory: config.json, safetensors, tokenizer and chat template.

    `AutoModelForCausalLM.from_pretrained`, `AutoTokenizer.from_pretrained` and vLLM load it. The
    checkpoint is verified against its manifest first; prints the directory written.
    """
    from entrepot.grpo.run.export import export_checkpoint

    with user_errors():
        typer.echo(export_checkpoint(run_dir, step, out))
