"""One rank of the dispatch test: `python dispatch_worker.py RANK WORLD INIT_FILE OUT_DIR`.

Rank 0 owns an in-process dock; every rank calls dispatch_get until it returns None, counts the
collectives it took, and saves what it received to OUT_DIR/rank{RANK}.pt.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as dist

from entrepot.dock import ColumnSpec, ExperienceDock, Padding, dispatch_get

NUM_ROWS = 24
COLUMNS = ["ids", "lp", "score", "mask"]


def build_dock() -> ExperienceDock:
    dock = ExperienceDock(
        NUM_ROWS,
        columns={
            "ids": ColumnSpec(torch.int32),
            "lp": ColumnSpec(torch.bfloat16),
            "score": ColumnSpec(scalar=True),
            "mask": ColumnSpec(),
        },
        consumers=["train"],
    )
    lengths = [i % 7 + 1 for i in range(NUM_ROWS)]
    dock.put(
        {"ids": [torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)]}, range(NUM_ROWS)
    )
    dock.put(
        {"lp": [torch.full((n,), i / 4, dtype=torch.bfloat16) for i, n in enumerate(lengths)]},
        range(NUM_ROWS),
    )
    dock.put({"score": torch.arange(NUM_ROWS, dtype=torch.float64)}, range(NUM_ROWS))
    dock.put({"mask": [torch.ones(n, dtype=torch.bool) for n in lengths]}, range(NUM_ROWS))
    return dock


def main(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    calls = {"broadcast": 0, "broadcast_object_list": 0}
    for name in calls:
        original = getattr(dist, name)

        def counted(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kwargs)

        setattr(dist, name, counted)
    dock = build_dock() if rank == 0 else None
    received = []
    padding = Padding(multiple=2)
    while (batch := dispatch_get(dock, "train", COLUMNS, 5, min_count=1, src=0, padding=padding)) is not None:
        received.append({"indexes": batch.indexes, "lengths": batch.lengths, **batch.data.to_dict()})
    torch.save({"batches": received, "calls": calls}, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
