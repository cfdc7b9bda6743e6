"""Samples of what the model generates (samples.jsonl), the start-up prompt lines, and W&B logging.

Unit tests need no training run; the one integration test trains two 2-step runs in this process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from entrepot.grpo.config import load_config
from entrepot.grpo.errors import GRPOConfigError
from entrepot.grpo.run.metrics import check_wandb, is_measured, read_metrics
from entrepot.grpo.run.samples import SamplesWriter, build_samples, pick_rows, read_samples, samples_due


def test_pick_rows_takes_one_response_per_prompt_first() -> None:
    rows = torch.arange(10, 22)  # 3 groups of 4
    assert pick_rows(rows, 4, 2).tolist() == [10, 14]
    assert pick_rows(rows, 4, 5).tolist() == [10, 14, 18, 11, 15]
    assert pick_rows(rows, 4, 50).tolist() == [10, 14, 18, 11, 15, 19, 12, 16, 20, 13, 17, 21]


def test_samples_are_due_at_the_first_step_then_every_n() -> None:
    """A 4-step run on the default (every 10) still writes the first step's samples."""
    assert [step for step in range(1, 4 + 1) if samples_due(step, 10)] == [1]
    assert [step for step in range(1, 31) if samples_due(step, 10)] == [1, 10, 20, 30]
    assert [step for step in range(1, 5) if samples_due(step, 1)] == [1, 2, 3, 4]
    assert not any(samples_due(step, 0) for step in range(1, 11))  # 0 = off


def test_build_samples_scores_each_verifier_part() -> None:
    records = build_samples(
        3, ["12="], ["21"], ["21"], [1.5], [1.0], {"exact_match": 0.5, "partial_credit": 1.0}
    )
    assert records == [{"step": 3, "prompt": "12=", "response": "21", "answer": "21", "reward": 1.5,
                        "parts": {"exact_match": 0.5, "partial_credit": 1.0}, "accuracy": 1.0}]  # fmt: skip


def test_samples_writer_appends_and_truncates_past_a_checkpoint(tmp_path: Path) -> None:
    writer = SamplesWriter(tmp_path)
    writer.truncate(5)  # nothing written yet: nothing to do
    for step in (2, 4, 6):
        writer.write(build_samples(step, ["a", "b"], ["x", "y"], ["x", "x"], [1.0, 0.0], [1.0, 0.0], {}))
    assert [r["step"] for r in read_samples(writer.path)] == [2, 2, 4, 4, 6, 6]
    writer.truncate(4)
    assert [r["step"] for r in read_samples(tmp_path / "samples.jsonl")] == [2, 2, 4, 4]


def test_logging_keys_are_checked() -> None:
    config = load_config(None, [])
    assert (config.logging.samples_every, config.logging.samples_per_step, config.logging.wandb) == (
        10,
        4,
        False,
    )
    with pytest.raises(GRPOConfigError, match=r"logging.samples_every \(-1\) must be >= 0"):
        load_config(None, ["logging.samples_every=-1"])
    with pytest.raises(GRPOConfigError, match=r"logging\.wandb_mode"):
        load_config(None, ["logging.wandb_mode=cloud"])


def test_missing_wandb_is_refused_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(None, ["logging.wandb=true"]).logging
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(
        GRPOConfigError, match=r"logging.wandb \(true\) needs wandb, which is not installed.*\[wandb\]"
    ):
        check_wandb(config)
    check_wandb(load_config(None, []).logging)  # off: nothing to check


def _train(run_dir: Path, *overrides: str) -> list[str]:
    from entrepot.grpo import train

    config = load_config(None, ["max_steps=2", "resources.use_ray=false", "logging.tensorboard=false",
                                "eval.every=0", "eval.num_prompts=8", "rollout.prompts_per_step=4",
                                *overrides])  # fmt: skip
    lines: list[str] = []
    train(config, run_dir, on_startup=lines.append)
    return lines


@pytest.mark.integration
def test_samples_and_wandb_leave_training_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # the run's own folder wins
    sampled, plain = tmp_path / "sampled", tmp_path / "plain"
    lines = _train(sampled, "logging.samples_every=1", "logging.samples_per_step=3", "logging.wandb=true")
    _train(plain, "logging.samples_every=0")

    assert "prompts: plain text (no chat template)" in lines
    assert any(line.startswith("first prompt as the model sees it: '") for line in lines)
    records = read_samples(sampled / "samples.jsonl")
    assert [r["step"] for r in records] == [1, 1, 1, 2, 2, 2]
    assert all(r["prompt"].endswith("=") and set(r["parts"]) == {"partial_credit"} for r in records)
    assert all(r["parts"]["partial_credit"] == pytest.approx(r["reward"]) for r in records)
    assert not (plain / "samples.jsonl").exists()
    # reading samples draws no random numbers: the same training, step for step
    with_samples, without = read_metrics(sampled / "metrics.jsonl"), read_metrics(plain / "metrics.jsonl")
    for a, b in zip(with_samples, without, strict=True):
        assert {k: v for k, v in a.items() if not is_measured(k)} == {
            k: v for k, v in b.items() if not is_measured(k)
        }
    # W&B offline: a run folder inside RUN/wandb. wandb >= 0.2x keeps the history and summary only in
    # its binary run file (no offline reader in Python): the last reward's JSON text is in it, and the
    # samples' tables are files of their own.
    (run_file,) = (sampled / "wandb").glob("offline-run-*/run-*.wandb")
    assert json.dumps(with_samples[-1]["reward_mean"]).encode() in run_file.read_bytes()
    tables = sorted(run_file.parent.glob("files/media/table/samples_*.table.json"))
    assert len(tables) == 2
    assert json.loads(tables[-1].read_text())["data"][0][:2] == [2, records[3]["prompt"]]
