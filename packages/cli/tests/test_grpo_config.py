"""`rl grpo config show|validate|keys`: resolution, overrides and one-line user errors (exit 2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from entrepot.cli.app import app
from entrepot.grpo.config import GRPOConfig, config_to_dict, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = sorted(p.name for p in CONFIGS.glob("*.yaml"))


def test_show_without_arguments_prints_the_embedded_default(runner: CliRunner) -> None:
    result = runner.invoke(app, ["grpo", "config", "show"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout) == config_to_dict(GRPOConfig())


def test_show_applies_file_then_overrides(runner: CliRunner, tmp_path: Path) -> None:
    file = tmp_path / "run.yaml"
    file.write_text("algorithm:\n  kl_coef: 0.5\nrollout:\n  n_samples_per_prompt: 4\n")
    result = runner.invoke(app, ["grpo", "config", "show", "-c", str(file), "algorithm.kl_coef=0.01"])
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.stdout)
    assert shown["algorithm"]["kl_coef"] == 0.01
    assert shown["rollout"]["n_samples_per_prompt"] == 4
    assert shown["rollout"]["prompts_per_step"] == GRPOConfig().rollout.prompts_per_step


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["algorithm.kl_coeff=0.1"],
            "unknown key 'algorithm.kl_coeff' (did you mean 'algorithm.kl_coef'?); allowed keys here: kl_",
        ),
        (["rollout.n_samples_per_prompt=many"], "rollout.n_samples_per_prompt ('many') must be int"),
        (["algorithm.mini_batch_size=12"], "algorithm.mini_batch_size (12) must be a multiple of"),
        (["data.task=sorting"], "data.task ('sorting') must be one of"),
        (["model.max_positions=12"], "model.max_positions (12) must be >= 17 (prompt + response tokens"),
        (["-c", "missing.yaml"], "'missing.yaml' does not exist"),
        (["kl_coef"], "override 'kl_coef' must look like section.key=value"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(runner: CliRunner, args: list[str], expected: str) -> None:
    result = runner.invoke(app, ["grpo", "config", "show", *args])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.output


def test_invalid_yaml_is_reported_on_one_line(runner: CliRunner, tmp_path: Path) -> None:
    file = tmp_path / "broken.yaml"
    file.write_text("algorithm:\n  kl_coef: [0.1\n")
    result = runner.invoke(app, ["grpo", "config", "validate", str(file)])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "is not valid YAML" in result.stderr


@pytest.mark.parametrize("name", SHIPPED)
def test_validate_accepts_every_shipped_config(
    runner: CliRunner, configs_dir: Path, name: str, local_model_files: tuple[Path, Path]
) -> None:
    # That each one also trains is checked by test_example_configs.py::test_every_shipped_config_is_run.
    # A GPU example is refused on a machine without CUDA (test_example_configs.py checks that); the
    # rest of it must validate. A config naming the user's own model directory is refused until it
    # exists, then validates with it (and with its prompt files).
    import torch

    text = (configs_dir / name).read_text()
    overrides = ["engine.device=cpu"] if "device: cuda" in text and not torch.cuda.is_available() else []
    if (yaml.safe_load(text).get("model") or {}).get("path") is not None:
        refused = runner.invoke(app, ["grpo", "config", "validate", str(configs_dir / name), *overrides])
        assert refused.exit_code == 2 and "error: model.path (" in refused.stderr, refused.output
        model, data = local_model_files
        overrides += [f"model.path={model}", f"data.train_path={data}", f"data.eval_path={data}"]
    result = runner.invoke(app, ["grpo", "config", "validate", str(configs_dir / name), *overrides])
    assert result.exit_code == 0, f"{name}: {result.output}"
    assert ": ok (" in result.stdout


def test_shipped_default_config_equals_the_embedded_default(configs_dir: Path) -> None:
    assert load_config(configs_dir / "default.yaml") == GRPOConfig()


def test_validate_reports_an_impossible_combination(runner: CliRunner, tmp_path: Path) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text("rollout:\n  prompts_per_step: 3\nresources:\n  num_actor_workers: 2\n")
    result = runner.invoke(app, ["grpo", "config", "validate", str(file)])
    assert result.exit_code == 2
    expected = "rollout.prompts_per_step (3) must be divisible by resources.num_actor_workers (2)"
    assert expected in result.stderr


def test_keys_lists_dotted_keys_with_help(runner: CliRunner) -> None:
    result = runner.invoke(app, ["grpo", "config", "keys", "algorithm"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "algorithm.kl_coef" in result.stdout
    keys = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    keys = [key for key in keys if key]  # help texts may mention other sections' keys; rows may not
    assert keys and all(key.startswith("algorithm.") for key in keys), keys
    unknown = runner.invoke(app, ["grpo", "config", "keys", "algo"])
    assert unknown.exit_code == 2
    assert "unknown section 'algo'; allowed: algorithm" in unknown.stderr


def test_keys_shows_bracketed_types_literally(runner: CliRunner) -> None:
    result = runner.invoke(app, ["grpo", "config", "keys", "algorithm"], env={"COLUMNS": "200"})
    assert "tuple[float, float]" in result.stdout  # not eaten as rich markup


def _not_a_model(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "gpt2"}')  # a config, no tokenizer
    return tmp_path / "model"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (lambda tmp: [f"model.path={tmp}"], "must be a local HF model directory with config.json"),
        (lambda tmp: [f"model.path={_not_a_model(tmp)}"], "): its tokenizer is empty (no tokenizer files"),
        (lambda tmp: ["data.task=jsonl", f"data.train_path={tmp}/p.jsonl"], "model.path (None) must be"),
        (lambda tmp: ["reward.custom={x: nope:f}", "reward.verifiers={x: 1}"], "cannot be imported"),
        (lambda tmp: ["model.max_positions=12"], "model.max_positions (12) must be >= 17"),
        (lambda tmp: ["batching.update.max_tokens=4"], "batching.update.max_tokens (4) must be >= 17"),
    ],
    ids=[
        "not-a-directory-with-config",
        "no-tokenizer-files",
        "file-task-without-model",
        "custom-verifier",
        "positions-below-the-longest-sequence",
        "token-budget-below-the-longest-sequence",
    ],
)
def test_validate_refuses_configs_that_cannot_start(
    runner: CliRunner, tmp_path: Path, overrides: Callable[[Path], list[str]], expected: str
) -> None:
    file = tmp_path / "run.yaml"
    file.write_text("max_steps: 3\n")
    result = runner.invoke(app, ["grpo", "config", "validate", str(file), *overrides(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "reward.accuracy_verifier=mathh",
            "reward.accuracy_verifier ('mathh') is not a known verifier; known: ",
        ),
        (
            "reward.verifiers={mathh: 1.0}",
            "reward.verifiers.mathh ('mathh') is not a known verifier; known: ",
        ),
    ],
)
def test_validate_refuses_a_verifier_name_no_registry_knows(
    runner: CliRunner, override: str, expected: str
) -> None:
    """Issue 58: a misspelt name passed validate and failed only once the trainer and workers ran."""
    from entrepot.grpo.data.rewards import available_verifiers

    result = runner.invoke(app, ["grpo", "config", "validate", str(CONFIGS / "default.yaml"), override])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {expected}") and "exact_match" in line
    assert ", ".join(available_verifiers()) in line
