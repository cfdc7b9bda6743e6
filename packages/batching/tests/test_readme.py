"""Every ```python block of the README runs on its own in a fresh interpreter, as a reader would paste it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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


@pytest.mark.parametrize(("needs", "code"), BLOCKS)
def test_readme_block_runs_alone(needs: str | None, code: str, tmp_path: Path) -> None:
    if needs:
        pytest.importorskip(needs)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"exit code {run.returncode}; stderr:\n{run.stderr}"
