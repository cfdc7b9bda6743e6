"""`rl grpo export`: a missing run, step or manifest is one line on stderr and exit code 2.

The export itself (a trained run loaded by transformers and vLLM) is tested in entrepot-grpo's
tests/test_export.py; these need no training run.
"""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from entrepot.cli.app import app


def _fails_on_one_line(runner: CliRunner, args: list[str], expected: str) -> None:
    result = runner.invoke(app, ["grpo", "export", *args])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert expected in result.stderr


def test_export_errors_exit_2_on_one_line(runner: CliRunner, tmp_path: Path) -> None:
    _fails_on_one_line(runner, [str(tmp_path)], "is not a run directory")
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    _fails_on_one_line(runner, [str(tmp_path), "--step", "5"], "has no checkpoint of step 5; it has [2]")
    _fails_on_one_line(runner, [str(tmp_path)], "has no complete checkpoint")
    _fails_on_one_line(runner, [str(tmp_path), "--step", "2"], "has no manifest.json")


def test_export_is_listed_under_grpo(runner: CliRunner) -> None:
    result = runner.invoke(app, ["grpo", "export", "--help"])
    assert result.exit_code == 0
    assert "--step" in result.stdout and "--out" in result.stdout
