"""Every ```python block of the README and of its docs/*.md pages runs on its own in a fresh
interpreter, as a reader would paste it (the runner is the repository's tests/readme_blocks.py, shared
by every package), and every ```yaml block there is a config the loader accepts."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
from readme_blocks import Runs, check_block, package_pages, readme_blocks, started_blocks

pytestmark = pytest.mark.integration  # each block runs in a fresh interpreter (subprocess)

PKG = Path(__file__).parents[1]

started = started_blocks(__file__)


@pytest.mark.parametrize(("needs", "code"), [p for page in package_pages(PKG) for p in readme_blocks(page)])
def test_readme_block_runs_alone(
    needs: str | None, code: str, request: pytest.FixtureRequest, started: Runs, tmp_path: Path
) -> None:
    check_block(needs, code, request, started, tmp_path)


YAML = re.compile(r"```yaml\n(.*?)^```", re.M | re.S)


def yaml_blocks(page: Path) -> list[object]:
    """One `pytest.param(text)` per yaml block of `page`, named by the page and the block's line."""
    text = page.read_text()
    prefix = "" if page.name == "README.md" else f"{page.stem}-"
    return [
        pytest.param(m[1], id=f"{prefix}yaml-block-{i}-line-{text.count(chr(10), 0, m.start(1))}")
        for i, m in enumerate(YAML.finditer(text))
    ]


@pytest.mark.parametrize("text", [p for page in package_pages(PKG) for p in yaml_blocks(page)])
def test_readme_yaml_block_is_a_valid_config(text: str) -> None:
    """Each ```yaml block of the README and its docs pages is (part of) a config the loader accepts."""
    import yaml

    from entrepot.grpo.config import config_from_dict

    config_from_dict(yaml.safe_load(text))
