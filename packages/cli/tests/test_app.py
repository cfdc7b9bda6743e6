"""The `rl` app: sub-apps are registered, shell completion works, nothing heavy loads for quick answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrepot.cli.app import app

_MAIN = "from entrepot.cli.app import main; main()"


def test_help_lists_the_sub_apps(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "160"})
    assert result.exit_code == 0
    for name in ("grpo", "dock", "batching", "version", "doctor"):
        assert name in result.stdout


HEAVY = ("torch", "ray", "transformers", "matplotlib")


@pytest.mark.integration  # a fresh interpreter per case (subprocess)
@pytest.mark.parametrize(
    ("args", "not_loaded"),
    [
        (["--help"], (*HEAVY, "entrepot.grpo", "entrepot.dock", "entrepot.batching")),
        (["batching", "plan", "-f", "missing.txt"], HEAVY),  # a missing file is said before torch loads
        (["grpo", "config", "validate", "{configs}/default.yaml"], HEAVY),
    ],
    ids=["help", "batching-plan-missing-file", "validate"],
)
def test_quick_answers_import_no_heavy_package(args: list[str], not_loaded: tuple[str, ...]) -> None:
    argv = [a.format(configs=Path(__file__).resolve().parents[1] / "configs") for a in args]
    probe = (
        f"import sys; sys.argv = ['rl', *{argv!r}]\n"
        "from entrepot.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY', [m for m in {not_loaded!r} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "HEAVY []" in done.stdout, done.stdout + done.stderr


@pytest.mark.integration  # a fresh interpreter (subprocess)
def test_shell_completion_completes_sub_commands() -> None:
    env = {**os.environ, "_RL_COMPLETE": "complete_bash", "COMP_WORDS": "rl grpo con", "COMP_CWORD": "2"}
    done = subprocess.run([sys.executable, "-c", _MAIN], capture_output=True, text=True, env=env)
    assert "config" in done.stdout.split()
