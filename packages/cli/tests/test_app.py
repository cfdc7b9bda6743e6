"""The `rl` app: sub-apps are registered, shell completion works, nothing heavy loads for --help."""

from __future__ import annotations

import os
import subprocess
import sys

from typer.testing import CliRunner

from entrepot.cli.app import app

_MAIN = "from entrepot.cli.app import main; main()"


def test_help_lists_the_sub_apps(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "160"})
    assert result.exit_code == 0
    for name in ("grpo", "dock", "batching", "version", "doctor"):
        assert name in result.stdout


def test_help_imports_no_heavy_package() -> None:
    probe = (
        "import sys; sys.argv = ['rl', '--help']\n"
        "from entrepot.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'ray', 'transformers', 'matplotlib', 'entrepot.grpo', 'entrepot.dock',"
        " 'entrepot.batching') if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "HEAVY []" in done.stdout


def test_shell_completion_completes_sub_commands() -> None:
    env = {**os.environ, "_RL_COMPLETE": "complete_bash", "COMP_WORDS": "rl grpo con", "COMP_CWORD": "2"}
    done = subprocess.run([sys.executable, "-c", _MAIN], capture_output=True, text=True, env=env)
    assert "config" in done.stdout.split()
