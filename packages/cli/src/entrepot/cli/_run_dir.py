"""Run directories: `runs/<name>-<timestamp>/` holding config.yaml, metrics.jsonl, checkpoints, plot."""

from __future__ import annotations

import time
from pathlib import Path

from entrepot.cli._errors import CLIUsageError

CONFIG_FILE = "config.yaml"


def unused_run_dir(output_dir: Path, name: str, now: float | None = None) -> Path:
    """`output_dir/<name>-<YYYYmmdd-HHMMSS>` (a `-N` suffix if that already exists), not created here:
    `entrepot.grpo.train` creates it once the config's machine and input checks pass."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = output_dir / f"{name}-{stamp}"
    candidate, suffix = base, 1
    while candidate.exists():
        candidate = base.with_name(f"{base.name}-{suffix}")
        suffix += 1
    return candidate


def resume_config_path(run_dir: Path) -> Path:
    """The resolved config a run directory was started with; a clear error if it is not a run dir."""
    if not run_dir.is_dir():
        raise CLIUsageError(f"--resume {str(run_dir)!r}: no such run directory")
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise CLIUsageError(f"--resume {str(run_dir)!r}: not a run directory (it has no {CONFIG_FILE})")
    return path
