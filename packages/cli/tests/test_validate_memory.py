"""`rl grpo config validate --memory`: the estimate's peak and its parts, from `estimate_memory`."""

from __future__ import annotations

from typer.testing import CliRunner

from entrepot.cli._doctor import size
from entrepot.cli.app import app
from entrepot.grpo import load_config
from entrepot.grpo.run.memory import estimate_memory


def test_validate_prints_the_estimate_by_part_when_asked(tmp_path: object) -> None:
    runner = CliRunner()
    overrides = ["engine.activation_checkpointing=true", "model.reference_dtype=bfloat16"]
    file = tmp_path / "run.yaml"  # type: ignore[operator]
    file.write_text("max_steps: 3\n")
    result = runner.invoke(app, ["grpo", "config", "validate", str(file), *overrides, "--memory"])
    assert result.exit_code == 0, result.output
    e = estimate_memory(load_config(file, overrides))
    assert (
        f"peak {size(e.peak_bytes + e.offloaded_bytes)} in host memory (engine.device=cpu)" in result.output
    )
    for part, value in (("reference", e.reference), ("activations", e.activations), ("KV cache", e.kv_cache)):
        assert f"{part} {size(value)}" in result.output
    quiet = runner.invoke(app, ["grpo", "config", "validate", str(file)])
    assert quiet.exit_code == 0 and "memory estimate" not in quiet.output
