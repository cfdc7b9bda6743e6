"""Every package's published dependencies name entrepot siblings by version range."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())

_spec = importlib.util.spec_from_file_location("wheel_metadata", ROOT / "tests" / "wheel_metadata.py")
assert _spec and _spec.loader
wheel_metadata = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheel_metadata)


def _all_requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return list(project.get("dependencies", [])) + [req for group in extras.values() for req in group]


def test_there_are_five_packages() -> None:
    assert [p.name for p in PACKAGE_DIRS] == ["batching", "cli", "dock", "grpo", "resharding"]


@pytest.mark.parametrize("package", PACKAGE_DIRS, ids=lambda p: p.name)
def test_siblings_are_version_ranges(package: Path) -> None:
    requirements = _all_requirements(package / "pyproject.toml")
    assert wheel_metadata.sibling_problems(requirements, package.name) == []


@pytest.mark.parametrize("package", PACKAGE_DIRS, ids=lambda p: p.name)
def test_layout_is_a_namespace_package(package: Path) -> None:
    src = package / "src" / "entrepot"
    assert not (src / "__init__.py").exists(), "entrepot is a namespace: no src/entrepot/__init__.py"
    assert (src / package.name / "_version.py").exists()
    for needed in ("README.md", "CHANGELOG.md", "tests", "benchmarks"):
        assert (package / needed).exists(), f"{package.name} lacks {needed}"


def test_checker_rejects_local_paths_and_pins() -> None:
    bad = [
        "entrepot-batching @ file:///work/packages/batching",
        "entrepot-dock==0.1.0",
        "entrepot-grpo",
    ]
    assert len(wheel_metadata.sibling_problems(bad, "demo")) == 3
    assert wheel_metadata.sibling_problems(["entrepot-dock[ray]>=0.1,<0.2", "torch>=2.4"], "demo") == []
