"""Benchmark: put + get throughput through the sharded dock with 1, 2 and 4 shards vs one Ray dock actor.

Workload: 4,096 rows, one int64 sequence column of 512-2,048 tokens a row (~40 MB). Two producer
actors put their halves of the rows in 256-row calls while two consumer actors race to get 256-row
packed batches of the same consumer until every row is consumed (each row reaches one of them once).
GB/s counts the valid bytes put plus the bytes got, over the wall time of the whole exchange; each
configuration runs `--repeats` times (median reported) in the same process, interleaved, and the
ratio is against the single Ray dock actor (`RayDockClient`) measured in the same run.

Then the controller's limit: `--calls` one-row gets from 1 and 4 client actors at once (each get is
a controller call plus a shard read), so calls/s measured here x rows per call in a real run
projects where one controller saturates (printed at the end).

    python bench_sharded.py [--repeats 3] [--calls 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import ray
import torch

from entrepot.dock import ExperienceDock
from entrepot.dock.ray import RayDockClient
from entrepot.dock.sharded import ShardedDockClient

NUM_ROWS = 4096
CHUNK = 256  # rows per put and per get, as in bench_dock
GRPO_ROWS_PER_GET = 256  # a DP rank's micro-batch of GRPO rows, for the projection
GRPO_BYTES_PER_ROW = 8 * 2304  # int64 tokens of the mean row of bench_dock's GRPO workload (512-4,096)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote(num_cpus=0)
class Producer:
    """Puts its rows in CHUNK-row calls; the data is built before the clock starts."""

    def __init__(self, client: Any, rows: list[int], seed: int) -> None:
        torch.set_num_threads(1)
        self.client = client
        gen = torch.Generator().manual_seed(seed)
        self.calls = []
        for start in range(0, len(rows), CHUNK):
            chunk = torch.tensor(rows[start : start + CHUNK])
            lengths = torch.randint(512, 2049, (chunk.numel(),), generator=gen)
            self.calls.append(
                (chunk, torch.randint(0, 50_000, (int(lengths.sum()),), generator=gen), lengths)
            )

    def run(self) -> int:
        moved = 0
        for rows, flat, lengths in self.calls:
            self.client.put({"x": (flat, lengths)}, rows)
            moved += flat.numel() * 8
        return moved


@ray.remote(num_cpus=0)
class Consumer:
    """Gets CHUNK-row packed batches until the consumer has every row; or `count`-row gets, `calls` times."""

    def __init__(self, client: Any) -> None:
        torch.set_num_threads(1)
        self.client = client

    def drain(self, consumer: str) -> int:
        moved = 0
        while (
            batch := self.client.get(consumer, ["x"], CHUNK, min_count=1, layout="packed", timeout=300)
        ) is not None:
            moved += batch.data["x"].numel() * 8
        return moved

    def tiny_gets(self, consumer: str, calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            self.client.get(consumer, ["id"], 1, layout="packed", timeout=60)
        return time.perf_counter() - start


def launch(shards: int | None, consumers: list[str], capacity: int = NUM_ROWS) -> Any:
    kwargs: dict[str, Any] = {"capacity": capacity, "columns": ["x", "id"], "consumers": consumers}
    if shards is None:
        return RayDockClient.launch(ExperienceDock, num_cpus=0, **kwargs)
    return ShardedDockClient.launch(ExperienceDock, shards=shards, num_cpus=0, **kwargs)


def close(client: Any) -> None:
    if isinstance(client, ShardedDockClient):
        client.close()
    else:
        ray.kill(client.actor)


def exchange_gbps(shards: int | None, seed: int) -> float:
    """One put + get exchange (see the module docstring); GB/s of bytes put plus bytes got."""
    client = launch(shards, ["c"])
    client.put({"id": torch.arange(NUM_ROWS)}, torch.arange(NUM_ROWS))  # every row exists: consumers wait
    halves = torch.arange(NUM_ROWS).chunk(2)
    producers = [Producer.remote(client, half.tolist(), seed + i) for i, half in enumerate(halves)]
    consumers = [Consumer.remote(client) for _ in range(2)]
    ray.get([p.__ray_ready__.remote() for p in producers] + [c.__ray_ready__.remote() for c in consumers])
    start = time.perf_counter()
    got = [c.drain.remote("c") for c in consumers]
    put = [p.run.remote() for p in producers]
    moved = sum(ray.get(put)) + sum(ray.get(got))
    seconds = time.perf_counter() - start
    for actor in [*producers, *consumers]:
        ray.kill(actor)
    close(client)
    return moved / seconds / 1e9


def calls_per_s(shards: int, clients: int, calls: int) -> float:
    """One-row gets per second over `clients` concurrent client actors (distinct consumers)."""
    names = [f"c{i}" for i in range(clients)]
    client = launch(shards, names, capacity=calls)
    client.put({"id": torch.arange(calls)}, torch.arange(calls))
    actors = [Consumer.remote(client) for _ in names]
    ray.get([a.__ray_ready__.remote() for a in actors])
    start = time.perf_counter()
    ray.get([a.tiny_gets.remote(name, calls) for a, name in zip(actors, names, strict=True)])
    seconds = time.perf_counter() - start
    for actor in actors:
        ray.kill(actor)
    close(client)
    return clients * calls / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration (median reported)")
    parser.add_argument(
        "--calls", type=int, default=1000, help="one-row gets per client for the controller limit"
    )
    args, _ = parser.parse_known_args()  # the nox session passes its arguments to every benchmark
    torch.set_num_threads(1)
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    configs: list[tuple[str, int | None]] = [("one Ray dock actor", None), ("sharded, 1 shard", 1),
                                             ("sharded, 2 shards", 2), ("sharded, 4 shards", 4)]  # fmt: skip
    runs: dict[str, list[float]] = {name: [] for name, _ in configs}
    for r in range(args.repeats):  # interleaved, so load from other jobs hits every configuration alike
        for name, shards in configs:
            runs[name].append(exchange_gbps(shards, seed=r))
    base = statistics.median(runs[configs[0][0]])
    print(f"load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    print("| dock | put+get GB/s (median) | min-max | vs one actor |")
    print("|------|-----------------------|---------|--------------|")
    for name, _ in configs:
        values = runs[name]
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {min(values):.2f}-{max(values):.2f} | {median / base:.2f}x |")
    one = calls_per_s(2, 1, args.calls)
    many = calls_per_s(2, 4, args.calls)
    rows_per_s = many * GRPO_ROWS_PER_GET
    print()
    print("| controller (2 shards) | one-row gets/s |")
    print("|-----------------------|----------------|")
    print(f"| 1 client | {one:.0f} |")
    print(f"| 4 clients at once | {many:.0f} |")
    best = max(statistics.median(values) for values in runs.values())
    limit = rows_per_s * GRPO_BYTES_PER_ROW / 1e9
    print(
        f"\nprojection: at {many:.0f} calls/s and {GRPO_ROWS_PER_GET} rows per get, one controller hands out "
        f"{rows_per_s:,.0f} rows/s, {limit:.1f} GB/s of GRPO rows "
        f"({GRPO_BYTES_PER_ROW // 8} int64 tokens a row), {limit / best:.0f}x "
        f"the best put+get rate measured above ({best:.2f} GB/s)"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
