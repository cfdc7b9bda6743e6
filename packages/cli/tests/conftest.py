"""Shared fixtures: a CliRunner and the shipped configs folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def configs_dir() -> Path:
    return CONFIGS
