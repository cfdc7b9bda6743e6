"""`rl grpo train|eval` argument handling: mistakes are caught before anything runs or is created."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrepot.cli.app import app


def _assert_one_line_error(result: object, expected: str) -> None:
    assert getattr(result, "exit_code", None) == 2
    stderr = getattr(result, "stderr", "")
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--max-steps", "0"], "max_steps (0) must be >= 1"),
        (["--name", "a/b"], "name ('a/b') must be a non-empty name without '/'"),
        (["algorithm.clip_low=1.5"], "algorithm.clip_low (1.5) must be in [0, 1)"),
        (["rollout.n_samples_per_prompt=1"], "rollout.n_samples_per_prompt (1) must be >= 2"),
        (["model.max_positions=12"], "model.max_positions (12) must be >= 17"),  # a data-wing check
        (["--config", "nowhere.yaml"], "'nowhere.yaml' does not exist"),
    ],
)
def test_train_rejects_bad_config_without_creating_a_run(
    runner: CliRunner, tmp_path: Path, args: list[str], expected: str
) -> None:
    result = runner.invoke(app, ["grpo", "train", "-o", str(tmp_path / "runs"), *args])
    _assert_one_line_error(result, expected)
    assert not (tmp_path / "runs").exists()


def test_resume_needs_a_run_directory(runner: CliRunner, tmp_path: Path) -> None:
    missing = runner.invoke(app, ["grpo", "train", "--resume", str(tmp_path / "nope")])
    _assert_one_line_error(missing, "no such run directory")
    not_a_run = runner.invoke(app, ["grpo", "train", "--resume", str(tmp_path)])
    _assert_one_line_error(not_a_run, "not a run directory (it has no config.yaml)")


def test_resume_and_config_are_exclusive(runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("max_steps: 3\n")
    result = runner.invoke(app, ["grpo", "train", "--resume", str(tmp_path), "--config", "x.yaml"])
    _assert_one_line_error(result, "--config and --resume cannot be combined")


def test_resume_validates_overrides_against_the_runs_config(runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("max_steps: 3\n")
    result = runner.invoke(app, ["grpo", "train", "--resume", str(tmp_path), "algorithm.lr=-1"])
    _assert_one_line_error(result, "algorithm.lr (-1.0) must be > 0")


def test_eval_of_a_missing_path_is_a_user_error(runner: CliRunner, tmp_path: Path) -> None:
    missing = runner.invoke(app, ["grpo", "eval", str(tmp_path / "nope")])
    _assert_one_line_error(
        missing, "does not exist (expected a run directory, a checkpoint or a model directory)"
    )
    empty = runner.invoke(app, ["grpo", "eval", str(tmp_path)])
    _assert_one_line_error(
        empty, "is neither a run directory, a checkpoint (state.json) nor an HF model directory"
    )


def test_flags_become_overrides() -> None:
    from entrepot.cli._grpo import _flag_overrides

    assert _flag_overrides("quick", 3, None) == ["name=quick", "seed=3"]
    assert _flag_overrides(None, None, None) == []
