"""Every ```python block of the README runs on its own in a fresh interpreter, as a reader would paste
it (the runner is the repository's tests/readme_blocks.py, shared by every package)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
from readme_blocks import Runs, check_block, readme_blocks, started_blocks

pytestmark = pytest.mark.integration  # each block runs in a fresh interpreter (subprocess)

started = started_blocks(__file__)


@pytest.mark.parametrize(("needs", "code"), readme_blocks(Path(__file__).parents[1] / "README.md"))
def test_readme_block_runs_alone(
    needs: str | None, code: str, request: pytest.FixtureRequest, started: Runs, tmp_path: Path
) -> None:
    check_block(needs, code, request, started, tmp_path)


YAML = re.compile(r"```yaml\n(.*?)^```", re.M | re.S)


@pytest.mark.parametrize("text", YAML.findall((Path(__file__).parents[1] / "README.md").read_text()))
def test_readme_yaml_block_is_a_valid_config(text: str) -> None:
    """Each ```yaml block of the README is (part of) a config the loader accepts as it is."""
    import yaml

    from entrepot.grpo.config import config_from_dict

    config_from_dict(yaml.safe_load(text))
