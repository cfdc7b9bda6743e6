"""Section (d) of entrepot-grpo's GPU benchmark: `rl grpo train` on the benchmark's own model directory
and data, timed from the command's start to its first step. It needs the `rl` command, so it runs here,
where entrepot-cli is installed; packages/grpo/tests/test_bench_gpu.py runs the other sections."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "grpo" / "benchmarks" / "gpu" / "bench_gpu.py"


@pytest.mark.integration  # a subprocess, which itself starts `rl grpo train`
def test_first_step_section_runs_rl_grpo_train_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(BENCH), "--tiny", "--threads", "2", "--out", str(out),
         "--workdir", str(tmp_path / "work"), "--sections", "first_step"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(out.read_text())["first_step"]
    assert "error" not in first, first
    assert first["exit_code"] is not None and first["seconds_to_first_step"] > 0, first.get("log_tail")
    assert "(d) rl grpo train" in done.stdout
