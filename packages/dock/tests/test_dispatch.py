"""dispatch_get over 3 gloo processes: identical batches everywhere, a constant number of collectives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration  # three processes in a gloo world

WORKER = Path(__file__).parent / "support" / "dispatch_worker.py"
WORLD = 3


def test_dispatch_broadcasts_identical_batches(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    init_file = tmp_path / "init"
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(WORLD), str(init_file), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(WORLD)
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, output.decode()
    results = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD)]
    batches = results[0]["batches"]
    assert [len(b["indexes"]) for b in batches] == [5, 5, 5, 5, 4]
    rows = torch.cat([b["indexes"] for b in batches])
    assert torch.equal(rows, torch.arange(24))
    for b in batches:
        lengths = b["indexes"] % 7 + 1
        assert torch.equal(b["lengths"]["ids"], lengths)
        assert b["ids"].dtype == torch.int32 and b["ids"].shape[1] % 2 == 0
        assert torch.equal(b["ids"][:, 0], b["indexes"].to(torch.int32))
        assert b["lp"].dtype == torch.bfloat16 and b["mask"].dtype == torch.bool
        assert torch.equal(b["mask"].sum(1), lengths)
        assert torch.equal(b["score"], b["indexes"].to(torch.float64))
    for other in results[1:]:
        assert len(other["batches"]) == len(batches)
        for mine, theirs in zip(batches, other["batches"], strict=True):
            assert mine.keys() == theirs.keys()
            for key in ("indexes", "ids", "lp", "score", "mask"):
                assert torch.equal(mine[key], theirs[key]), key
    for result in results:
        # per batch: one object broadcast (the layout) and one tensor broadcast (all columns);
        # the final None costs one object broadcast
        assert result["calls"] == {"broadcast_object_list": len(batches) + 1, "broadcast": len(batches)}
