"""The GPU benchmark (benchmarks/gpu/bench_gpu.py) runs end to end on CPU at tiny shapes, so it cannot rot
between the sessions that have a GPU; its FLOP count matches Qwen3-0.6B's published size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"


def _common():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    try:
        import common
    finally:
        sys.path.remove(str(BENCH))
    return common


def test_flop_count_of_the_qwen3_shape() -> None:
    common = _common()
    shape = common.QWEN3_06B
    assert shape.body_params() == 28 * (
        3 * 1024 * 2048 + 3 * 1024 * 3072
    )  # 0.44B, Qwen3-0.6B's non-embedding
    lengths = common.packed_lengths(shape)
    assert sum(lengths) == 16_384 and min(lengths) > shape.prompt
    flops = common.train_flops(shape, lengths, scored=1000)
    attention = 6 * 28 * 16 * 128 * sum(s * s for s in lengths)
    assert flops == 6 * shape.body_params() * 16_384 + 6 * 151_936 * 1024 * 1000 + attention


@pytest.mark.integration  # a subprocess
def test_bench_gpu_runs_on_cpu_at_tiny_shapes(tmp_path: Path) -> None:
    """Sections (a)-(c); (d) times the `rl` command, which entrepot-cli installs: its test is there
    (packages/cli/tests/test_bench_gpu_first_step.py)."""
    out = tmp_path / "bench.json"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_gpu.py"), "--tiny", "--threads", "2", "--out", str(out),
         "--workdir", str(tmp_path / "work"), "--sections", "train", "sync", "memory"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    failed = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and "error" in v}
    assert not failed, failed
    for engine in ("train_torch", "train_megatron"):
        assert results[engine]["tokens_per_s"] > 0
        assert results[engine]["attention_kernel"].startswith("sdpa")  # the portable path on CPU
    sync = results["sync"]
    assert [row["verify"] for row in sync["rows"]] == [False, True, False]
    assert sync["checksum"]["matches_cpu"] and sync["checksum"]["result_device"] == "cpu"
    for offload in ("off", "on"):
        phases = results[f"memory_offload_{offload}"]["phases"]
        assert list(phases) == ["rollout", "reference", "old_logp", "update"]
        assert all(p["host_rss"] > 0 for p in phases.values())
    assert "(a) training step" in done.stdout and "(c) peak memory" in done.stdout
