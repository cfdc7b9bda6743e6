"""One rank of the gloo test: plan micro-batches with a process group, print the plan as JSON.

Run as ``python distributed_worker.py RANK WORLD_SIZE INIT_FILE LENGTHS_JSON BUDGET``; the ranks meet
through INIT_FILE (a file rendezvous: no port to race another process for).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from entrepot.batching import plan_micro_batches


def main() -> None:
    rank, world_size, init_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    lengths, budget = json.loads(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        plan = plan_micro_batches(lengths, budget, group=dist.group.WORLD)
        local = plan_micro_batches(lengths, budget)
        # Rank 0 with nothing to do still runs as many (empty) micro-batches as rank 1.
        idle = plan_micro_batches([] if rank == 0 else lengths, budget, group=dist.group.WORLD)
        print(
            json.dumps(
                {
                    "micro_batches": plan.micro_batches,
                    "token_counts": plan.token_counts,
                    "local_count": local.num_micro_batches,
                    "idle_micro_batches": idle.micro_batches,
                }
            )
        )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
