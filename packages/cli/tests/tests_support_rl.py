"""Running the real `rl` command in a subprocess, with this machine's thread settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def rl(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run `rl ARGS` to completion, capturing its output."""
    return subprocess.run(rl_command(*args), capture_output=True, text=True, timeout=timeout, env=rl_env())


def rl_command(*args: str) -> list[str]:
    """The argv of `rl ARGS`: the installed script, else this interpreter running the app."""
    script = Path(sys.executable).parent / "rl"
    head = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "from entrepot.cli.app import main; main()"]
    )
    return [*head, *args]


def rl_env() -> dict[str, str]:
    """The environment: one passive OpenMP thread (a shared 2-core machine), a fixed terminal width."""
    return {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "COLUMNS": "160"}


def metric_steps(run_dir: Path) -> list[int]:
    """The step of every line of a run's metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if line.strip()]
