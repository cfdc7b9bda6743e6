"""`rl eval` on a short default run trained once for the module: the table and files, `rl grpo eval` as its
old name, `compare` with its plot, and each bad input as one line with exit 2 before a model loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrepot.cli._eval.compare import difference
from entrepot.cli.app import app


def test_difference_is_paired_on_the_same_prompts_and_unpaired_otherwise() -> None:
    a = {0: ("p0", 0.0), 1: ("p1", 1.0), 2: ("p2", 0.0)}
    b = {0: ("p0", 1.0), 1: ("p1", 1.0), 2: ("p2", 0.0)}
    diff, se, paired = difference(a, b)
    assert paired and diff == pytest.approx(1 / 3) and se == pytest.approx((1 / 3) ** 0.5 / 3**0.5)
    other = {0: ("q0", 1.0), 1: ("q1", 1.0)}
    diff, se, paired = difference(a, other)
    assert not paired and diff == pytest.approx(2 / 3) and se == pytest.approx((1 / 3 / 3) ** 0.5)


def _one_line_error(result: object, expected: str) -> None:
    assert getattr(result, "exit_code", None) == 2, getattr(result, "output", "")
    lines = getattr(result, "stderr", "").strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from entrepot.grpo import train
    from entrepot.grpo.config import config_from_dict

    run = tmp_path_factory.mktemp("eval") / "run"
    config = {"max_steps": 10, "eval": {"every": 5, "num_prompts": 32}, "logging": {"samples_every": 0},
              "checkpoint": {"save_every": 5, "keep_last": 0}}  # fmt: skip
    train(config_from_dict(config), run)
    return run


@pytest.mark.integration
def test_eval_writes_its_files_and_compare_plots(run_dir: Path, runner: CliRunner) -> None:
    greedy = runner.invoke(app, ["eval", str(run_dir), "--step", "5", "-q"])
    assert greedy.exit_code == 0, greedy.output
    assert "accuracy" in greedy.output and "end_reason/" in greedy.output
    sampled = runner.invoke(
        app, ["grpo", "eval", str(run_dir), "--samples", "4", "--k", "2", "-q", "-n", "16"]
    )
    assert sampled.exit_code == 0, sampled.output
    doc = json.loads((run_dir / "evals" / "step_000010-t1-n4" / "eval.json").read_text())
    assert doc["model"]["step"] == 10 and "pass@2" in doc["metrics"] and doc["settings"]["num_samples"] == 4
    compared = runner.invoke(
        app,
        [
            "eval",
            "compare",
            str(run_dir / "evals" / "step_000005-greedy"),
            str(run_dir / "evals" / "step_000010-t1-n4"),
        ],
    )
    assert compared.exit_code == 0, compared.output
    assert "unpaired" in compared.output  # 32 prompts against 16: not the same set
    assert (run_dir / "eval_compare.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.integration
def test_bad_inputs_are_one_line_and_exit_2(run_dir: Path, runner: CliRunner, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run_dir / "run.json", bare / "run.json")
    _one_line_error(runner.invoke(app, ["eval", str(bare)]), "has no checkpoints")
    damaged = tmp_path / "damaged"
    shutil.copytree(run_dir, damaged)
    weights = damaged / "checkpoints" / "step_000010" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    _one_line_error(runner.invoke(app, ["eval", str(damaged)]), "model.safetensors does not match its sha256")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "12345678=", "answer": "87654321"}\n{"prompt": "what is 2+2?", "answer": "4"}\n'
    )
    _one_line_error(
        runner.invoke(app, ["eval", str(run_dir), "--data", str(prompts)]),
        "record 1: its prompt does not fit the task",
    )
    _one_line_error(
        runner.invoke(app, ["eval", str(run_dir), "--samples", "2", "--k", "4"]), "--k 4 is larger than"
    )
    _one_line_error(runner.invoke(app, ["eval", str(run_dir), "--engine", "vllm"]), "--engine vllm")


def test_live_display_warns_when_the_audit_flags() -> None:
    from entrepot.cli._live import hacking_line

    assert hacking_line({"step": 3, "hacking/flagged": 0.0}) is None
    line = hacking_line({"hacking/format_explained": 1.0, "hacking/flag/format_explained": 1.0,
                         "hacking/first_flag_step": 2.0})  # fmt: skip
    assert line is not None and line.startswith(
        "reward hacking? format_explained 1.000 (first flagged at step 2)"
    )


@pytest.mark.integration
def test_an_export_evaluates_like_its_checkpoint_on_both_engines(
    run_dir: Path, runner: CliRunner, tmp_path: Path
) -> None:
    from entrepot.grpo.run.export import export_checkpoint

    _one_line_error(
        runner.invoke(app, ["eval", str(run_dir), "--engine", "hf"]), "--engine hf runs HF generate"
    )
    export = export_checkpoint(run_dir, 10)
    responses = {}
    for name, path, engine in [("ckpt", run_dir, "torch"), ("torch", export, "torch"), ("hf", export, "hf")]:
        done = runner.invoke(
            app, ["eval", str(path), "-q", "-n", "16", "--engine", engine, "--out", str(tmp_path / name)]
        )
        assert done.exit_code == 0, done.output
        responses[name] = (
            (tmp_path / name / "eval_samples.jsonl").read_text().splitlines()[1:]
        )  # past the header
    assert len(responses["ckpt"]) == 16 and responses["ckpt"] == responses["torch"] == responses["hf"]
    prompts = tmp_path / "test.jsonl"
    prompts.write_text(
        '{"prompt": "12345678=", "answer": "87654321"}\n{"prompt": "31415926=", "answer": "62951413"}\n'
    )
    done = runner.invoke(
        app,
        ["eval", str(export), "--data", str(prompts), "--engine", "hf", "-q", "--out", str(tmp_path / "d")],
    )
    assert done.exit_code == 0, done.output
    data = json.loads((tmp_path / "d" / "eval.json").read_text())["data"]
    assert data["source"] == str(prompts) and data["prompts"] == 2 and len(data["sha256"]) == 64
