"""Every ```python block of the README and of its docs/ pages runs on its own in a fresh interpreter, as
a reader would paste it (the runner is the repository's tests/readme_blocks.py, shared by every package)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
from readme_blocks import Runs, check_block, package_pages, readme_blocks, started_blocks

pytestmark = pytest.mark.integration  # each block runs in a fresh interpreter (subprocess)

started = started_blocks(__file__)
BLOCKS = [block for page in package_pages(Path(__file__).parents[1]) for block in readme_blocks(page)]


@pytest.mark.parametrize(("needs", "code"), BLOCKS)
def test_readme_block_runs_alone(
    needs: str | None, code: str, request: pytest.FixtureRequest, started: Runs, tmp_path: Path
) -> None:
    check_block(needs, code, request, started, tmp_path)
