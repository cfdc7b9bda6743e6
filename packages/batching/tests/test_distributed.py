"""Two gloo ranks agree on the number of micro-batches (one all-reduce MAX) without breaking caps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # two processes in a gloo world

WORKER = Path(__file__).parent / "support" / "distributed_worker.py"


def test_ranks_agree_on_micro_batch_count_over_gloo(tmp_path: Path) -> None:
    budget = 100
    per_rank = [[60, 30, 10, 50, 40], [90, 80, 70, 60, 20, 20, 10]]  # needs 2 vs 4 micro-batches
    init_file = tmp_path / "gloo.rendezvous"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), "2", str(init_file), json.dumps(lengths), str(budget)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank, lengths in enumerate(per_rank)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["local_count"] for r in results] == [2, 4]
    assert [len(r["micro_batches"]) for r in results] == [4, 4]
    for result, lengths in zip(results, per_rank, strict=True):
        assert sorted(i for part in result["micro_batches"] for i in part) == list(range(len(lengths)))
        assert max(result["token_counts"]) <= budget
        assert all(result["micro_batches"])  # rank 0 split its work rather than idling
    assert results[0]["idle_micro_batches"] == [[], [], [], []]
    assert len(results[1]["idle_micro_batches"]) == 4
