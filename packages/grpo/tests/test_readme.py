"""Every ```python block of the README runs on its own in a fresh interpreter, as a reader would paste it.

Each block gets its own interpreter and working directory, as before; the blocks this session selected
are started up front, two at a time (most of a block's time is one core importing torch), and each
test waits for, and checks, its own block's exit. Blocks that use Ray run one at a time (each starts
a Ray of its own, as a reader's would be alone on the machine).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # each block runs in a fresh interpreter (subprocess)

README = (Path(__file__).parents[1] / "README.md").read_text()
# A python block; with `<!-- snippet: needs MODULE -->` just before it, skipped where MODULE is missing.
BLOCK = re.compile(r"(?:<!-- snippet: needs ([\w.]+) -->\n)?```python\n(.*?)^```", re.M | re.S)
BLOCKS = [
    pytest.param(m[1], m[2], id=f"readme-block-{i}-line-{README.count(chr(10), 0, m.start(2))}")
    for i, m in enumerate(BLOCK.finditer(README))
]
AT_ONCE = 2  # blocks running at the same time
ONE_RAY = threading.Lock()  # held while a block that uses Ray runs
USES_RAY = re.compile(r"^\s*(import ray|from ray)|\bRay\w*Client\b|use_ray", re.M)


def _run_alone(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
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


@pytest.fixture(scope="module")
def started(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """The selected blocks' runs, started in test order (each in a fresh interpreter and directory)."""
    selected = [
        item for item in request.session.items
        if getattr(item, "originalname", None) == "test_readme_block_runs_alone"
        and Path(str(item.path)) == Path(__file__)
    ]  # fmt: skip
    pool = ThreadPoolExecutor(max_workers=AT_ONCE)
    runs: dict[str, Future[subprocess.CompletedProcess[str]]] = {}
    for item in selected:
        needs, code = item.callspec.params["needs"], item.callspec.params["code"]
        if needs and not _installed(needs):
            continue  # the test skips it
        runs[item.callspec.id] = pool.submit(_run_alone, code, tmp_path_factory.mktemp("readme-block"))
    yield runs
    for run in runs.values():
        run.cancel()
    pool.shutdown(wait=True)


@pytest.mark.parametrize(("needs", "code"), BLOCKS)
def test_readme_block_runs_alone(
    needs: str | None, code: str, request: pytest.FixtureRequest,
    started: dict[str, Future[subprocess.CompletedProcess[str]]], tmp_path: Path,
) -> None:  # fmt: skip
    if needs:
        pytest.importorskip(needs)
    key = request.node.callspec.id
    run = started[key].result() if key in started else _run_alone(code, tmp_path)
    assert run.returncode == 0, f"exit code {run.returncode}; stderr:\n{run.stderr}"
