"""`rl grpo train --resume` goes by the run's newest checkpoint: finished, damaged, another run's, or
behind metrics.jsonl.

One two-step run (in this process, a checkpoint after each step) is copied and damaged per test.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrepot.cli.app import app

pytestmark = pytest.mark.integration  # a training run (module fixture), resumed

SMALL = ["eval.num_prompts=16", "logging.tensorboard=false", "checkpoint.keep_last=0", "eval.every=0",
         "resources.use_ray=false", "rollout.prompts_per_step=4", "checkpoint.save_every=1"]  # fmt: skip


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of max_steps=2 with checkpoints after steps 1 and 2 (and its config.yaml)."""
    from entrepot.grpo import load_config, train

    run = tmp_path_factory.mktemp("resume") / "run"
    train(load_config(None, [*SMALL, "max_steps=2"]), run)
    return run


@pytest.fixture
def run(two_steps: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(two_steps, tmp_path / "run"))


def _steps(run: Path) -> list[int]:
    from entrepot.grpo.run.metrics import read_metrics

    return [int(r["step"]) for r in read_metrics(run / "metrics.jsonl")]


def _one_line_error(result: object) -> str:
    assert getattr(result, "exit_code", None) == 2
    lines = getattr(result, "stderr", "").strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_resume_of_a_finished_run_asks_for_more_steps(runner: CliRunner, run: Path) -> None:
    line = _one_line_error(runner.invoke(app, ["grpo", "train", "--resume", str(run)]))
    assert "the run's newest checkpoint is at step 2 of max_steps (2); pass max_steps=N with N > 2" in line


def test_resume_goes_by_the_newest_checkpoint_not_by_metrics(runner: CliRunner, run: Path) -> None:
    shutil.rmtree(run / "checkpoints" / "step_000002")  # metrics.jsonl still claims step 2
    assert _steps(run) == [1, 2]
    result = runner.invoke(app, ["grpo", "train", "--resume", str(run), "-q"])
    assert result.exit_code == 0, result.output
    assert _steps(run) == [1, 2] and (run / "checkpoints" / "step_000002" / "manifest.json").is_file()


def test_resume_of_a_bit_flipped_checkpoint_fails_with_one_line(runner: CliRunner, run: Path) -> None:
    model = run / "checkpoints" / "step_000002" / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[random.Random(0).randrange(len(data))] ^= 0x04
    model.write_bytes(bytes(data))
    result = runner.invoke(app, ["grpo", "train", "--resume", str(run), "max_steps=3"])
    line = _one_line_error(result)
    assert "step_000002': model.safetensors does not match its sha256 in manifest.json (corrupt)" in line
    assert _steps(run) == [1, 2] and not (run / "checkpoints" / "step_000003").exists()


def test_resume_of_another_runs_checkpoints_fails_with_one_line(runner: CliRunner, run: Path) -> None:
    """The folder's run.json replaced by a new run's: its checkpoints are now another run's."""
    from entrepot.grpo import load_config
    from entrepot.grpo.run.identity import create_run, read_run

    old = read_run(run)
    (run / "run.json").unlink()
    new = create_run(run, load_config(None, [*SMALL, "max_steps=2"]))
    line = _one_line_error(runner.invoke(app, ["grpo", "train", "--resume", str(run), "max_steps=3"]))
    assert f"step_000002' belongs to another run: its manifest.json says run {old.run_id}" in line
    assert f"this run folder's run.json says run {new.run_id}" in line
    assert _steps(run) == [1, 2] and not (run / "checkpoints" / "step_000003").exists()


def test_resume_that_changes_a_fixed_key_fails_with_one_line(runner: CliRunner, run: Path) -> None:
    result = runner.invoke(app, ["grpo", "train", "--resume", str(run), "max_steps=3", "algorithm.lr=0.01"])
    line = _one_line_error(result)
    assert "would change what its checkpoints were trained with: algorithm.lr (0.001 -> 0.01)" in line
    assert _steps(run) == [1, 2]
