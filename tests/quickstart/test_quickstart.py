"""The quickstart as a user meets it: the `rl` command of a venv built by the root README's command 1.

The `quickstart` nox session builds that venv (torch and the five packages from their folders, no
extras) and runs this file with its python; every check runs `rl` as a subprocess from the
repository root, where the README's commands and every install hint are run. A config that needs
an extra this venv lacks must be refused in one line that says what to install.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "packages" / "cli" / "configs").glob("*.yaml"))
RL = Path(sys.executable).with_name("rl")  # the venv's console script, as `pip install` made it
# A hint names a checkout folder and says where to run it (packages/cli/tests/test_install_hints.py).
INSTALL_HINT = re.compile(
    r'pip install[^;]*"\./packages/[a-z]+\[[a-z0-9,-]+\]"[^;]*\(from the repository root\)'
)


def _rl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [str(RL), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_rl_help_lists_the_commands() -> None:
    result = _rl("--help")
    assert result.returncode == 0, result.stderr
    assert "grpo" in result.stdout and "doctor" in result.stdout


def test_rl_doctor_reports_on_this_machine() -> None:
    result = _rl("doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Memory estimate" in result.stdout


@pytest.mark.parametrize("config", CONFIGS, ids=[config.name for config in CONFIGS])
def test_every_shipped_config_validates_or_is_refused_in_one_line(config: Path) -> None:
    result = _rl("grpo", "config", "validate", str(config.relative_to(ROOT)))
    output = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode in (0, 2), "\n".join(output)
    assert len(output) == 1, "\n".join(output)
    if result.returncode == 2:
        assert output[0].startswith("error: "), output[0]
        if "not installed" in output[0]:
            assert INSTALL_HINT.search(output[0]), f"no working install command in: {output[0]}"


def test_a_config_needing_an_extra_is_refused_with_its_install_command() -> None:
    """megatron-core is not in the README's install: the megatron config names the extra to add."""
    result = _rl("grpo", "config", "validate", "packages/cli/configs/megatron-tp2.yaml")
    assert result.returncode == 2
    assert 'pip install "./packages/grpo[megatron]" (from the repository root)' in result.stderr


def test_a_three_step_training_run_writes_its_metrics_and_checkpoint(tmp_path: Path) -> None:
    result = _rl("grpo", "train", "--max-steps", "3", "-o", str(tmp_path), "-q", "eval.every=0", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = tmp_path.iterdir()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2, 3]
    assert (run_dir / "checkpoints" / "step_000003").is_dir()
