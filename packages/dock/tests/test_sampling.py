"""Balanced sampler and per-DP-rank index ranges."""

from __future__ import annotations

import pytest
import torch

from entrepot.dock import ExperienceDock, InvalidArgumentError, Sampler, dp_range_indexes


def test_balanced_sampler_equalises_tokens_across_ranks():
    dock = ExperienceDock(16, columns=["x"], consumers=["c"], n_samples_per_prompt=2)
    lengths = [n for g in (200, 180, 20, 10, 150, 160, 30, 40) for n in (g // 2, g // 2)]
    dock.put({"x": [torch.zeros(n) for n in lengths]}, range(16))
    fifo_parts = [sum(lengths[i * 4 : i * 4 + 4]) for i in range(4)]
    batch = dock.get("c", ["x"], 16, sampler=Sampler(kind="balanced", num_ranks=4), groups=True)
    parts = [int(part.lengths["x"].sum()) for part in batch.split(4)]
    assert sum(parts) == sum(lengths) and sorted(batch.indexes.tolist()) == list(range(16))
    assert max(parts) - min(parts) < max(fifo_parts) - min(fifo_parts)
    for part in batch.split(4):  # prompt groups stay whole on one rank
        rows = part.indexes.tolist()
        assert {r // 2 for r in rows} == {r // 2 for r in rows[::2]}


def test_dp_range_indexes_split_global_batch():
    assert dp_range_indexes(16, 4, dp_size=2, dp_rank=1) == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert dp_range_indexes(8, 2, dp_size=2, dp_rank=0, start=8) == [[8, 9], [10, 11]]
    with pytest.raises(InvalidArgumentError, match="multiple"):
        dp_range_indexes(10, 4, dp_size=2, dp_rank=0)
    with pytest.raises(InvalidArgumentError, match="dp_rank"):
        dp_range_indexes(8, 2, dp_size=2, dp_rank=2)


def test_guarantee_order_with_dp_ranges():
    dock = ExperienceDock(8, columns=["x"], consumers=["c"])
    dock.put({"x": torch.arange(8.0)}, range(8))
    seen = []
    for rank in range(2):
        for chunk in dp_range_indexes(8, 2, dp_size=2, dp_rank=rank):
            seen.append(dock.get("c", ["x"], len(chunk), indexes=chunk).data["x"].tolist())
    assert seen == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
