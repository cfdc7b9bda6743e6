"""`rl doctor`: versions, devices, extras, Ray's address and auth, and a config's memory estimate."""

from __future__ import annotations

import importlib.util
import os
import platform
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import entrepot.grpo
from entrepot.cli._doctor import size
from entrepot.cli._install import EXTRA_COMMANDS
from entrepot.cli.app import app
from entrepot.grpo.config import load_config
from entrepot.grpo.run.memory import estimate_memory

WIDE = {"COLUMNS": "240"}  # one report row per line
NO_RAY_ENV = {"RAY_ADDRESS": None, "RAY_AUTH_MODE": None}


def _sections(output: str) -> dict[str, dict[str, str]]:
    """First word of each section title -> {label: value} of its rows (a label ends at two spaces)."""
    sections: dict[str, dict[str, str]] = {}
    rows: dict[str, str] = {}
    for line in output.splitlines():
        label, _, value = line.strip().partition("  ")
        if value:
            rows[label] = value.strip()
        elif label:  # a title
            rows = sections.setdefault(label.split()[0], {})
    return sections


def _doctor(runner: CliRunner, *args: str, **env: str | None) -> dict[str, dict[str, str]]:
    result = runner.invoke(app, ["doctor", *args], env={**WIDE, **NO_RAY_ENV, **env})
    assert result.exit_code == 0, result.output
    return _sections(result.stdout)


def test_the_report_names_python_and_the_stack(runner: CliRunner) -> None:
    report = _doctor(runner)
    assert list(report) == ["Versions", "Devices", "Engine", "Ray", "Memory"]
    rows = {**report["Versions"], **report["Devices"]}
    assert rows["python"] == platform.python_version()
    assert rows["torch"] == torch.__version__
    # the code that runs, wherever it was installed from (editable metadata can be stale)
    assert rows["entrepot-grpo"].startswith(f"{entrepot.grpo.__version__} (")
    assert rows["cpu cores"].endswith(f"of {os.cpu_count()}")
    assert " total, " in rows["host memory"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_missing_extra_says_not_installed_and_whether_the_config_uses_it(runner: CliRunner) -> None:
    report = _doctor(runner)
    assert report["Versions"]["vllm"] == "not installed"
    assert report["Engine"]["vllm"] == "not installed (engine.rollout=vllm)"
    report = _doctor(runner, "engine.rollout=vllm", COLUMNS="400")  # the install command is long
    assert report["Engine"]["vllm"] == (
        "not installed, this config uses it: the run is refused (engine.rollout=vllm); "
        f"to install it: {EXTRA_COMMANDS['vllm']}"
    )
    assert "kv_cache_memory_bytes" in report["Memory"]["KV cache"]


def test_the_estimate_follows_the_config_and_its_overrides(runner: CliRunner, tmp_path: Path) -> None:
    file = tmp_path / "run.yaml"
    file.write_text("model:\n  num_layers: 4\n")
    rows = _doctor(runner, "-c", str(file), "algorithm.kl_coef=0", "engine.offload_params=true")["Memory"]
    expected = estimate_memory(load_config(file, ["algorithm.kl_coef=0", "engine.offload_params=true"]))
    default = estimate_memory(load_config(None, []))
    assert expected.num_params > default.num_params
    assert rows["policy parameters"] == f"{expected.num_params:,} (exact)"
    assert rows["params"] == f"{size(expected.params)} (this rank's training shard)"
    assert rows["reference"] == "0 B (none (algorithm.kl_coef = 0))"
    device, host = expected.stages["generate"]
    assert rows["switch: generate"].startswith(f"{size(device)} on the device, {size(host)} in host memory")
    assert host == expected.params  # offloaded params wait in host memory while generating
    assert rows["verdict"].startswith("fits: needs ")


def test_a_config_larger_than_this_machine_does_not_fit_and_still_exits_0(runner: CliRunner) -> None:
    huge = ["model.hidden_size=8192", "model.num_heads=64", "model.num_layers=96"]  # ~77B parameters
    rows = _doctor(runner, *huge)["Memory"]
    assert rows["verdict"].startswith("does not fit: needs ")
    assert "GiB, has " in rows["verdict"]


def test_ray_address_and_auth_mode_come_from_the_config_and_environment(runner: CliRunner) -> None:
    rows = _doctor(runner, "resources.ray_address=10.0.0.7:6379")["Ray"]
    assert rows["address"] == "10.0.0.7:6379 (resources.ray_address)"
    assert rows["auth mode"].startswith("disabled on this side")
    rows = _doctor(runner, RAY_ADDRESS="10.0.0.8:6379", RAY_AUTH_MODE="token")["Ray"]
    assert rows["address"] == "10.0.0.8:6379 (RAY_ADDRESS)"
    assert rows["auth mode"] == "token (RAY_AUTH_MODE)"
    assert _doctor(runner, "resources.use_ray=false")["Ray"]["address"].startswith("not used")
    assert _doctor(runner)["Ray"]["address"] == "not used (auto: one worker per role: one process)"
    assert _doctor(runner, "resources.use_ray=true")["Ray"]["address"].startswith("none: rl grpo train")


def test_a_bad_key_exits_2_with_one_line(runner: CliRunner) -> None:
    result = runner.invoke(app, ["doctor", "engine.devise=cuda"])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("error: unknown key 'engine.devise'")


def test_a_missing_model_directory_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["doctor", f"model.path={tmp_path}"])
    assert result.exit_code == 2
    assert "must be a local HF model directory with config.json" in result.stderr


def test_sizes_use_binary_units() -> None:
    assert [size(n) for n in (0, 1023, 1024, 6_929_408, 3 * 2**30)] == [
        "0 B", "1023 B", "1.00 KiB", "6.61 MiB", "3.00 GiB",
    ]  # fmt: skip


def test_an_extra_whose_parent_package_is_missing_reads_as_not_installed() -> None:
    """`find_spec("megatron.core")` raises when `megatron` itself is absent; the report says not installed."""
    from entrepot.cli._doctor import _on_path

    assert not _on_path("entrepot_no_such_parent.core")
    assert _on_path("entrepot.cli")
