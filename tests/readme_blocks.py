"""Every ```python block of a package's README, run on its own in a fresh interpreter, as a reader
would paste it: the one runner behind each package's tests/test_readme.py.

Each block gets its own interpreter and working directory; the blocks a session selected are started
up front, two at a time (most of a block's time is one core importing torch), and each test waits
for, and checks, its own block's exit. Blocks that use Ray run one at a time (each starts a Ray of
its own, as a reader's would be alone on the machine). A block after `<!-- snippet: needs MODULE -->`
is skipped where MODULE is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

BLOCK = re.compile(r"(?:<!-- snippet: needs ([\w.]+) -->\n)?```python\n(.*?)^```", re.M | re.S)
AT_ONCE = 2  # blocks running at the same time
ONE_RAY = threading.Lock()  # held while a block that uses Ray runs
USES_RAY = re.compile(r"^\s*(import ray|from ray)|\bRay\w*Client\b|use_ray", re.M)
TEST_NAME = "test_readme_block_runs_alone"

Runs = dict[str, "Future[subprocess.CompletedProcess[str]]"]


def readme_blocks(readme: Path) -> list[Any]:
    """One `pytest.param(needs, code)` per python block of `readme`, named by its index and line.

    A page other than README.md (a package's docs/*.md) adds its name to the id, so the blocks of a
    README and of its docs pages can be parametrized together.
    """
    text = readme.read_text()
    page = "" if readme.name == "README.md" else f"{readme.stem}-"
    return [
        pytest.param(m[1], m[2], id=f"{page}readme-block-{i}-line-{text.count(chr(10), 0, m.start(2))}")
        for i, m in enumerate(BLOCK.finditer(text))
    ]


def package_pages(package: Path) -> list[Path]:
    """A package's README.md and its docs/*.md pages, whose code blocks are all tested."""
    return [package / "README.md", *sorted((package / "docs").glob("*.md"))]


def run_alone(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    with ONE_RAY if USES_RAY.search(code) else contextlib.nullcontext():
        return subprocess.run(
            [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
        )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def started_blocks(test_file: str) -> Callable[..., Iterator[Runs]]:
    """A module fixture for `test_file`: the runs of its selected blocks, started in test order."""

    @pytest.fixture(scope="module")
    def started(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
        selected = [
            item for item in request.session.items
            if getattr(item, "originalname", None) == TEST_NAME and Path(str(item.path)) == Path(test_file)
        ]  # fmt: skip
        pool = ThreadPoolExecutor(max_workers=AT_ONCE)
        runs: Runs = {}
        for item in selected:
            needs, code = item.callspec.params["needs"], item.callspec.params["code"]
            if needs and not _installed(needs):
                continue  # the test skips it
            runs[item.callspec.id] = pool.submit(run_alone, code, tmp_path_factory.mktemp("readme-block"))
        yield runs
        for run in runs.values():
            run.cancel()
        pool.shutdown(wait=True)

    return started


def check_block(
    needs: str | None, code: str, request: pytest.FixtureRequest, started: Runs, cwd: Path
) -> None:
    """The block's run (started up front, else now) exited 0; skipped where `needs` is missing."""
    if needs:
        pytest.importorskip(needs)
    key = request.node.callspec.id
    run = started[key].result() if key in started else run_alone(code, cwd)
    assert run.returncode == 0, f"exit code {run.returncode}; stderr:\n{run.stderr}"
