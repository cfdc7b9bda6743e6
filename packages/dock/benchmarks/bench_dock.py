"""Benchmark: the GRPO experience flow through the dock vs the seed's TransferDock design.

Workload: 1,024 prompts x 8 samples (8,192 rows); prompt 64-256 tokens, prompt + response uniform
in 512-4,096 tokens. Phases in GRPO order, 256 rows per put, inputs padded as model outputs are:
prompts (fan-out); responses + response_length + input_ids; ref and old log-probs (float32);
advantages (one float32 per response). Then `actor_train` pulls 256-row padded batches of 7
columns until all consumed. Run against (a) the seed's design implemented literally
(seed_baseline.py), (b) our ExperienceDock in-process (first and third iteration of a reused dock,
and a fourth whose gets are packed, the layout entrepot.grpo's stages read), (c) the same through
the Ray actor (first and third iteration); then the per-call cost of `get` at
1,000,000 rows capacity vs 8,192. GB/s counts valid (unpadded) bytes.

Bounds, measured in the same run (see CopyBound): after every put and get of (b) and (c), a
`torch.Tensor.copy_` of as many bytes; in-process put and get are reported as fractions of that
copy bandwidth, the padded get also against the copy of its valid bytes plus a fill of its padding
bytes (what any padded layout must write), and the minor page faults taken during the timed calls.

One iteration's ratio moves by a few hundredths between runs on a shared machine, so the goal table
takes `--steady N` more steady-state iterations of each layout (padded, packed, alternating) and of
the Ray actor, and prints each ratio's median and range over them, against the goals: put and
packed get >= 0.6 of the copy, padded get >= 0.75 of copy + fill, Ray put >= 1 GB/s, Ray get >= 1.5
GB/s (padded gets, and packed: the layout entrepot.grpo's stages read). The Ray client moves its
puts and gets through its same-node channel and socket (entrepot.dock._channel, _link); beside it,
interleaved, a client of the same actor with `channel=False` (everything through Ray). Then the
same table with a CPU-bound neighbour (one process per core spinning in Python, neighbour.py): a
call made of many small ops shows there what contention does to it.

Then "ours vs baseline": the seed's design in-process and as a Ray actor against ours in-process,
as a Ray actor and sharded over 1 and 2 shard actors (ShardedDockClient on this node), each with
the load when it was measured. Last, the in-process ratios again with 64, 256 and 1,024 rows per
put and per get (the same bytes in all): what a call costs apart from what its bytes cost.

    python bench_dock.py [--small] [--no-ray] [--no-neighbour] [--steady N]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).parent))
from neighbour import cpu_bound_neighbour
from seed_baseline import SeedTransferDock

from entrepot.dock import GRPO_COLUMNS, GRPO_CONSUMERS, ColumnSpec, GRPODock

N_SAMPLES = 8
EXTRA_COLUMNS = {"input_ids": ColumnSpec(scalar=False)}
"""Prompt + response tokens, as a trainer that stores its model inputs would put them (the GRPO
preset has no such column: entrepot.grpo builds model inputs from prompts and responses)."""
SEED_COLUMNS = [*GRPO_COLUMNS, *EXTRA_COLUMNS]
CHUNK = 256
TRAIN_COLUMNS = [
    "input_ids",
    "responses",
    "prompt_length",
    "response_length",
    "old_log_prob",
    "ref_log_prob",
    "advantages",
]


@dataclass
class Phase:
    """One put call: column -> padded [B, L] (+ lengths) or scalar [B], for rows [start, start + B)."""

    start: int
    padded: dict[str, tuple[torch.Tensor, torch.Tensor]]
    scalars: dict[str, torch.Tensor]
    nbytes: int  # valid bytes


@dataclass
class Workload:
    prompts: list[torch.Tensor]
    phases: list[Phase]
    prompt_bytes: int
    chunk: int = CHUNK  # rows per put and per get


def _print_table(header: str, rows: list[str]) -> None:
    """A markdown table: `header`, a separator as wide as each header cell, then `rows`."""
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    print("\n".join(rows))


def make_workload(num_prompts: int, seed: int = 0, chunk: int = CHUNK) -> Workload:
    gen = torch.Generator().manual_seed(seed)
    num_rows = num_prompts * N_SAMPLES
    prompt_len = torch.randint(64, 257, (num_prompts,), generator=gen)
    prompts = [torch.randint(0, 50_000, (int(n),), generator=gen) for n in prompt_len]
    total_len = torch.randint(512, 4097, (num_rows,), generator=gen)
    resp_len = total_len - prompt_len.repeat_interleave(N_SAMPLES)
    phases: list[Phase] = []

    def padded_of(lengths: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (lengths.numel(), int(lengths.max()))
        if dtype.is_floating_point:
            return torch.randn(shape, generator=gen).to(dtype), lengths
        return torch.randint(0, 50_000, shape, generator=gen), lengths

    def nbytes(lengths: torch.Tensor, dtype: torch.dtype) -> int:
        return int(lengths.sum()) * torch.empty(0, dtype=dtype).element_size()

    for start in range(0, num_rows, chunk):
        rl, tl = resp_len[start : start + chunk], total_len[start : start + chunk]
        phases.append(
            Phase(
                start,
                {"responses": padded_of(rl, torch.int64), "input_ids": padded_of(tl, torch.int64)},
                {"response_length": rl.clone()},
                nbytes(rl, torch.int64) + nbytes(tl, torch.int64) + 8 * rl.numel(),
            )
        )
    for column in ("ref_log_prob", "old_log_prob"):
        for start in range(0, num_rows, chunk):
            rl = resp_len[start : start + chunk]
            phases.append(Phase(start, {column: padded_of(rl, torch.float32)}, {}, nbytes(rl, torch.float32)))
    for start in range(0, num_rows, chunk):  # GRPO advantages: one float32 per response
        rows = min(chunk, num_rows - start)
        phases.append(Phase(start, {}, {"advantages": torch.randn(rows, generator=gen)}, 4 * rows))
    prompt_bytes = int(prompt_len.sum()) * 8 * N_SAMPLES
    return Workload(prompts, phases, prompt_bytes, chunk)


class CopyBound:
    """This machine's copy bandwidth for the same bytes, measured beside the dock calls.

    After each dock call, one `torch.Tensor.copy_` of as many bytes as the call moved, from a
    source into a preallocated (already touched) destination; sources and destinations rotate over
    `slots` buffers that together exceed the last-level cache, as the dock's data does. Measured
    interleaved with the calls, so load from other jobs on a shared machine hits both alike.
    """

    def __init__(self, slots: int = 6) -> None:
        self.slots = slots
        self.src: list[torch.Tensor] = []
        self.dst: list[torch.Tensor] = []
        self.turn = 0

    def copy_s(self, nbytes: int) -> float:
        """Seconds one copy_ of `nbytes` takes (buffers grown, untimed, when a call needs more)."""
        self._grow(nbytes)
        self.turn = (self.turn + 1) % self.slots
        src = self.src[self.turn].narrow(0, 0, nbytes)
        dst = self.dst[(self.turn + self.slots // 2) % self.slots].narrow(0, 0, nbytes)
        start = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - start

    def fill_s(self, nbytes: int) -> float:
        """Seconds one `zero_` of `nbytes` takes in a rotating destination (a padded get's tail fill)."""
        self._grow(nbytes)
        self.turn = (self.turn + 1) % self.slots
        dst = self.dst[self.turn].narrow(0, 0, nbytes)
        start = time.perf_counter()
        dst.zero_()
        return time.perf_counter() - start

    def _grow(self, nbytes: int) -> None:
        if not self.src or self.src[0].numel() < nbytes:
            size = max(nbytes, 1 << 20)
            self.src = [torch.full((size,), 7, dtype=torch.uint8) for _ in range(self.slots)]
            self.dst = [torch.zeros(size, dtype=torch.uint8) for _ in range(self.slots)]


@dataclass
class Timings:
    put_s: list[float] = field(default_factory=list)
    get_s: list[float] = field(default_factory=list)
    put_bytes: int = 0
    get_bytes: int = 0
    held_bytes: int = 0  # memory the store keeps allocated / alive once everything is put
    stored_bytes: int = 0  # valid bytes the store holds
    put_copy_s: float = 0.0  # the copy bound for the same bytes (see CopyBound)
    get_copy_s: float = 0.0
    get_fill_s: float = 0.0  # a fill of the padding bytes the gets wrote (see CopyBound.fill_s)
    put_faults: int = 0  # minor page faults of this process during the timed puts / gets
    get_faults: int = 0


def minor_faults() -> int:
    """Minor page faults this process has taken so far (first touches of fresh pages, among others)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _load() -> str:
    """The 1, 5 and 15-minute load averages, for the record of a run on a shared machine."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def timed(fn: Callable[[], Any], into: list[float]) -> Any:
    start = time.perf_counter()
    out = fn()
    into.append(time.perf_counter() - start)
    return out


def run_ours(
    dock: Any, work: Workload, num_rows: int, bound: CopyBound | None = None, layout: str = "padded"
) -> Timings:
    """GRPO phases and actor_train gets through a DockClient (in-process dock or Ray client).

    With `bound`, each call is followed by a copy_ of its bytes (t.put_copy_s / t.get_copy_s) and
    each get also by a fill of its padding bytes (t.get_fill_s). `layout` is the gets' layout:
    "padded" as MindSpeed-RL's consumers read, "packed" as entrepot.grpo's stages read.
    """
    t = Timings(put_bytes=work.prompt_bytes)
    faults = minor_faults()
    timed(lambda: dock.put_prompts(work.prompts, N_SAMPLES), t.put_s)
    t.put_faults += minor_faults() - faults
    if bound is not None:
        t.put_copy_s += bound.copy_s(work.prompt_bytes)
    for phase in work.phases:
        rows = torch.arange(phase.start, phase.start + work.chunk)
        data: dict[str, Any] = {**{k: v for k, (v, _) in phase.padded.items()}, **phase.scalars}
        lengths = {k: lens for k, (_, lens) in phase.padded.items()}
        faults = minor_faults()
        timed(lambda data=data, rows=rows, lengths=lengths: dock.put(data, rows, lengths=lengths), t.put_s)
        t.put_faults += minor_faults() - faults
        t.put_bytes += phase.nbytes
        if bound is not None:
            t.put_copy_s += bound.copy_s(phase.nbytes)
    metrics = dock.metrics()
    t.held_bytes, t.stored_bytes = int(metrics["dock/bytes_allocated"]), int(metrics["dock/bytes_stored"])
    while True:
        faults = minor_faults()
        batch = timed(lambda: dock.get("actor_train", TRAIN_COLUMNS, work.chunk, layout=layout), t.get_s)
        t.get_faults += minor_faults() - faults
        if batch is None:
            t.get_s.pop()  # the final "all consumed" call moves no data
            break
        nbytes = sum(
            int(batch.lengths[c].sum()) * batch.data[c].element_size()
            if c in batch.lengths and layout == "padded"
            else batch.data[c].nbytes  # packed: flat, valid bytes only
            for c in TRAIN_COLUMNS
        )
        padded_bytes = sum(batch.data[c].nbytes for c in TRAIN_COLUMNS)
        t.get_bytes += nbytes
        del batch  # a consumer drops each batch before it gets the next one
        if bound is not None:
            t.get_copy_s += bound.copy_s(nbytes)
            t.get_fill_s += bound.fill_s(padded_bytes - nbytes)
    assert t.get_bytes and len(t.get_s) == num_rows // work.chunk
    return t


def run_baseline(work: Workload, num_prompts: int, remote: bool = False) -> Timings:
    """The same flow through the seed's design (its producers hand over padded TensorDicts).

    With `remote`, the seed's dock runs as a Ray actor, as the seed deploys it (`.remote(...)`).
    """
    if remote:
        import ray

        dock: Any = _RemoteCalls(
            ray.remote(SeedTransferDock)
            .options(num_cpus=0.25)
            .remote(num_prompts, N_SAMPLES, SEED_COLUMNS, list(GRPO_CONSUMERS))
        )
        dock.all_consumed("actor_train")  # wait for the actor to start, not timed
    else:
        dock = SeedTransferDock(num_prompts, N_SAMPLES, SEED_COLUMNS, list(GRPO_CONSUMERS))
    t = Timings(put_bytes=work.prompt_bytes)
    timed(lambda: dock.put_prompts_experience(work.prompts), t.put_s)
    for phase in work.phases:
        entries: dict[str, torch.Tensor] = {}
        for key, (padded, lengths) in phase.padded.items():
            entries[key], entries[f"{key}__length"] = padded, lengths
        for key, values in phase.scalars.items():
            ones = torch.ones_like(values, dtype=torch.int64)  # slice bounds must be integers
            entries[key], entries[f"{key}__length"] = values[:, None], ones
        data = TensorDict(entries, batch_size=[work.chunk])
        indexes = list(range(phase.start, phase.start + work.chunk))
        timed(lambda data=data, indexes=indexes: dock.put_experience(data, indexes), t.put_s)
        t.put_bytes += phase.nbytes
    t.held_bytes, t.stored_bytes = dock.held_bytes(), t.put_bytes
    while not dock.all_consumed("actor_train"):
        batch, _ = timed(lambda: dock.get_experience("actor_train", TRAIN_COLUMNS, work.chunk), t.get_s)
        t.get_bytes += sum(int(batch[f"{c}__length"].sum()) * batch[c].element_size() for c in TRAIN_COLUMNS)
    return t


class _RemoteCalls:
    """Blocking method calls on a Ray actor handle (ray.get(handle.method.remote(...)))."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __getattr__(self, name: str) -> Callable[..., Any]:
        import ray

        method = getattr(self.handle, name)
        return lambda *args, **kwargs: ray.get(method.remote(*args, **kwargs))


def ray_put_cost(nbytes: int, repeats: int = 20) -> tuple[float, float, int]:
    """Median seconds of one `ray.put` of an `nbytes` array and of a copy of it, and the put's minor
    page faults: what the Ray actor's channel takes off a call (needs Ray initialised)."""
    import numpy as np
    import ray

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    puts: list[float] = []
    copies: list[float] = []
    faults: list[int] = []
    refs: list[Any] = []
    for _ in range(repeats):
        before = minor_faults()
        refs = [*refs[-3:], timed(lambda: ray.put(src), puts)]  # freed objects' memory is reused
        faults.append(minor_faults() - before)
        timed(lambda: np.copyto(dst, src), copies)
    return statistics.median(puts), statistics.median(copies), int(statistics.median(faults))


def tiny_get_cost(dock: GRPODock, calls: int = 64) -> float:
    """Median seconds of an 8-row, 1-scalar-column get (selection overhead, little data)."""
    out: list[float] = []
    for _ in range(calls):
        timed(lambda: dock.get("grpo_metrics", ["response_length"], N_SAMPLES), out)
    return statistics.median(out)


def fmt_row(name: str, t: Timings, baseline_total: float | None) -> str:
    """One table row; `vs base` is the baseline's put+get time over this one's (same deployment)."""
    put_total, get_total = sum(t.put_s), sum(t.get_s)
    total = put_total + get_total
    ratio = f"{baseline_total / total:7.1f}x" if baseline_total else "      -"
    put_p50, get_p50 = 1e3 * statistics.median(t.put_s), 1e3 * statistics.median(t.get_s)
    return (
        f"| {name:<26} | {put_total:7.3f} | {put_p50:7.2f} | {1e3 * max(t.put_s):7.2f} "
        f"| {t.put_bytes / put_total / 1e9:6.2f} | {get_total:7.3f} | {get_p50:7.2f} "
        f"| {1e3 * max(t.get_s):7.2f} | {t.get_bytes / get_total / 1e9:6.2f} | {total:7.3f} | {ratio} "
        f"| {t.stored_bytes / 1e6:6.0f} / {t.held_bytes / 1e6:6.0f} |"
    )


def fmt_bound(name: str, t: Timings, ray_target: float | None = None) -> str:
    """Put and get GB/s beside the copy bound of the same bytes; through Ray, get also vs `ray_target`."""
    put, get = t.put_bytes / sum(t.put_s) / 1e9, t.get_bytes / sum(t.get_s) / 1e9
    put_copy, get_copy = t.put_bytes / t.put_copy_s / 1e9, t.get_bytes / t.get_copy_s / 1e9
    target = f"get / {ray_target:.0f} GB/s = {get / ray_target:4.2f}" if ray_target else "-"
    return (
        f"| {name:<26} | {put:8.2f} | {put_copy:9.2f} | {put / put_copy:8.2f} | {get:8.2f} "
        f"| {get_copy:9.2f} | {get / get_copy:8.2f} | {target:<23} |"
    )


def fmt_beside(name: str, t: Timings) -> str:
    """The get against copy + padding fill, and the minor page faults (MB of 4 KiB pages) of the calls."""
    padded = (t.get_copy_s + t.get_fill_s) / sum(t.get_s)
    put_mb, get_mb = t.put_faults * 4096 / 1e6, t.get_faults * 4096 / 1e6
    return (
        f"| {name:<26} | {padded:15.2f} | {t.put_faults:10d} ({put_mb:5.0f} MB) "
        f"| {t.get_faults:10d} ({get_mb:5.0f} MB) |"
    )


@dataclass
class Steady:
    """Per-iteration ratios of the steady-state iterations (see `steady_table`)."""

    put: list[float] = field(default_factory=list)  # put / copy, from every in-process iteration
    packed: list[float] = field(default_factory=list)  # packed get / copy
    padded: list[float] = field(default_factory=list)  # padded get / copy
    padded_fill: list[float] = field(default_factory=list)  # padded get / (copy + fill of its padding)
    ray_gbps: list[float] = field(default_factory=list)  # Ray get GB/s (same-node channel)
    ray_packed_gbps: list[float] = field(default_factory=list)  # the same, packed gets
    ray_store_gbps: list[float] = field(default_factory=list)  # the same, replies through Ray's store
    ray_put_gbps: list[float] = field(default_factory=list)  # Ray put GB/s (same-node channel)
    ray_store_put_gbps: list[float] = field(default_factory=list)  # the same, through Ray's store

    def add(self, t: Timings, layout: str) -> None:
        self.put.append(t.put_copy_s / sum(t.put_s))
        gets = sum(t.get_s)
        if layout == "packed":
            self.packed.append(t.get_copy_s / gets)
        else:
            self.padded.append(t.get_copy_s / gets)
            self.padded_fill.append((t.get_copy_s + t.get_fill_s) / gets)


def steady_table(steady: Steady) -> list[str]:
    """Median and range of each goal ratio over the steady-state iterations."""

    def row(name: str, values: list[float], target: str) -> str:
        if not values:
            return f"| {name:<53} | {'-':>6} | {'-':>11} | {0:3d} | {target:<6} |"
        span = f"{min(values):.2f}-{max(values):.2f}"
        return (
            f"| {name:<53} | {statistics.median(values):6.2f} | {span:>11} | {len(values):3d} | {target:<6} |"
        )

    return [
        row("in-process put / copy", steady.put, ">= 0.6"),
        row("in-process packed get / copy (entrepot.grpo's stages)", steady.packed, ">= 0.6"),
        row("in-process padded get / copy (MindSpeed-RL's layout)", steady.padded, "-"),
        row("padded get / (copy + fill of its padding)", steady.padded_fill, ">= 0.75"),
        row("Ray actor get, GB/s (padded)", steady.ray_gbps, ">= 1.5"),
        row("Ray actor get, GB/s (packed: entrepot.grpo's stages)", steady.ray_packed_gbps, ">= 1.5"),
        row("Ray actor get, GB/s, no channel (Ray's object store)", steady.ray_store_gbps, "-"),
        row("Ray actor put, GB/s", steady.ray_put_gbps, ">= 1"),
        row("Ray actor put, GB/s, no channel (Ray's object store)", steady.ray_store_put_gbps, "-"),
    ]


def call_size_table(num_prompts: int, sizes: tuple[int, ...], iterations: int) -> list[str]:
    """In-process steady ratios with `sizes` rows per put and per get (the same bytes in all).

    A call has a fixed cost (validation, bookkeeping, the cold caches its first ops run from after
    the previous call's copy); the bytes it moves grow with its rows. The put's ratio follows that
    cost; the padded get's stops growing where its bytes, not its calls, bound it.
    """
    lines = []
    for size in sizes:
        work = make_workload(num_prompts, chunk=size)
        dock, bound = GRPODock(num_prompts, N_SAMPLES, extra_columns=EXTRA_COLUMNS), CopyBound()
        steady = Steady()
        for turn in range(2 + 2 * iterations):  # two iterations to warm up, then the layouts in turn
            dock.clear()
            layout = "padded" if turn % 2 == 0 else "packed"
            timings = run_ours(dock, work, num_prompts * N_SAMPLES, bound, layout=layout)
            if turn >= 2:
                steady.add(timings, layout)
        cells = [f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for v in (
            steady.put, steady.padded, steady.packed)]  # fmt: skip
        lines.append(f"| {size:13,d} | {cells[0]:>17} | {cells[1]:>17} | {cells[2]:>17} |")
    return lines


def in_process_goal(dock: GRPODock, work: Workload, num_rows: int, iterations: int, goal: Steady) -> None:
    """`iterations` steady iterations of each layout, alternating, into `goal` (in-process ratios)."""
    bound = CopyBound()
    for _ in range(iterations):
        for layout in ("padded", "packed"):
            dock.clear()
            goal.add(run_ours(dock, work, num_rows, bound, layout=layout), layout)


def ray_goal(clients: list[tuple[Any, list[float], list[float], str]], work: Workload, num_rows: int,
             iterations: int) -> None:  # fmt: skip
    """`iterations` interleaved runs of each (client, get GB/s, put GB/s, get layout), appending to
    those lists."""
    for _ in range(iterations):
        for client, gets, puts, layout in clients:
            client.clear()
            t = run_ours(client, work, num_rows, layout=layout)
            gets.append(t.get_bytes / sum(t.get_s) / 1e9)
            puts.append(t.put_bytes / sum(t.put_s) / 1e9)


@dataclass
class Versus:
    """One row of the "ours vs baseline" table: both put+get totals (steady medians) and the load."""

    deployment: str
    baseline: str
    baseline_s: float
    ours: Timings
    load: str

    def line(self) -> str:
        ours_s = sum(self.ours.put_s) + sum(self.ours.get_s)
        put = self.ours.put_bytes / sum(self.ours.put_s) / 1e9
        get = self.ours.get_bytes / sum(self.ours.get_s) / 1e9
        return (
            f"| {self.deployment:<22} | {self.baseline:<22} | {self.baseline_s:10.3f} | {ours_s:8.3f} "
            f"| {self.baseline_s / ours_s:7.1f}x | {put:8.2f} | {get:8.2f} | {self.load:<14} |"
        )


def steady_run(
    client: Any, work: Workload, num_rows: int, iterations: int = 3, bound: CopyBound | None = None
) -> Timings:
    """The last of `iterations` runs through `client` (the earlier ones fault in its memory)."""
    for _ in range(iterations):
        client.clear()
        last = run_ours(client, work, num_rows, bound)
    return last


def baseline_s(work: Workload, num_prompts: int, remote: bool, iterations: int = 3) -> float:
    """Median put+get seconds of the seed's design over `iterations` runs (a fresh dock each)."""
    runs = [run_baseline(work, num_prompts, remote=remote) for _ in range(iterations)]
    return statistics.median(sum(t.put_s) + sum(t.get_s) for t in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="128 prompts instead of 1,024 (a quick check)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray actor and sharded runs")
    parser.add_argument("--steady", type=int, default=5, help="steady iterations per layout and of Ray")
    parser.add_argument(
        "--no-neighbour", action="store_true", help="skip the runs beside a CPU-bound neighbour"
    )
    args, _ = parser.parse_known_args()  # nox passes its posargs through
    if args.steady < 1:
        parser.error(f"--steady must be >= 1, got {args.steady}")
    torch.set_num_threads(1)
    num_prompts = 128 if args.small else 1024
    num_rows = num_prompts * N_SAMPLES
    work = make_workload(num_prompts)
    puts = len(work.phases) + 1
    print(f"workload: {num_prompts} prompts x {N_SAMPLES} samples = {num_rows} rows, {puts} puts")

    bound = CopyBound()
    baseline = run_baseline(work, num_prompts)
    base_total = sum(baseline.put_s) + sum(baseline.get_s)
    small_dock = GRPODock(num_prompts, N_SAMPLES, extra_columns=EXTRA_COLUMNS)
    ours = run_ours(small_dock, work, num_rows, bound)
    rows = [
        fmt_row("seed design, in-process", baseline, None),
        fmt_row("ExperienceDock in-process", ours, base_total),
    ]
    bounds = [fmt_bound("ExperienceDock in-process", ours)]
    beside = [fmt_beside("ExperienceDock in-process", ours)]
    # A training loop reuses its dock every iteration: the third iteration shows the steady state
    # (our clear() recycles the segments, so no fresh memory is faulted in).
    for _ in range(2):
        steady_base = run_baseline(work, num_prompts)
        small_dock.clear()
        steady = run_ours(small_dock, work, num_rows, bound)
    steady_total = sum(steady_base.put_s) + sum(steady_base.get_s)
    rows.append(fmt_row("seed design, 3rd iteration", steady_base, None))
    rows.append(fmt_row("ExperienceDock, 3rd iter.", steady, steady_total))
    bounds.append(fmt_bound("ExperienceDock, 3rd iter.", steady))
    beside.append(fmt_beside("ExperienceDock, 3rd iter.", steady))
    versus = [Versus("in-process", "seed design", baseline_s(work, num_prompts, False), steady, _load())]
    # entrepot.grpo's stages read packed (remove padding): the same flow once more, gets packed.
    small_dock.clear()
    packed = run_ours(small_dock, work, num_rows, bound, layout="packed")
    bounds.append(fmt_bound("4th iter., packed gets", packed))
    goal = Steady()
    goal.add(steady, "padded")
    goal.add(packed, "packed")
    in_process_goal(small_dock, work, num_rows, args.steady - 1, goal)
    crowded = Steady()
    if not args.no_ray:
        import ray

        from entrepot.dock.ray import RayDockClient
        from entrepot.dock.sharded import ShardedDockClient

        ray.init(num_cpus=2, object_store_memory=1 << 30, include_dashboard=False, log_to_driver=False)
        try:
            remote_base = run_baseline(work, num_prompts, remote=True)
            remote_total = sum(remote_base.put_s) + sum(remote_base.get_s)
            client = RayDockClient.launch(
                GRPODock, prompts_num=num_prompts, n_samples_per_prompt=N_SAMPLES, extra_columns=EXTRA_COLUMNS
            )
            client.reset()  # waits for the actor to start, not timed
            remote = run_ours(client, work, num_rows, bound)
            remote_steady = steady_run(client, work, num_rows, 2, bound)  # its third iteration
            goal.ray_gbps.append(remote_steady.get_bytes / sum(remote_steady.get_s) / 1e9)
            goal.ray_put_gbps.append(remote_steady.put_bytes / sum(remote_steady.put_s) / 1e9)
            # Baseline: the same actor, every call through Ray's object store (no shared-memory
            # channel), iterations interleaved with the channel's.
            plain = RayDockClient(client.actor, channel=False)
            ray_goal([(plain, goal.ray_store_gbps, goal.ray_store_put_gbps, "padded")], work, num_rows, 1)
            ray_goal([(client, goal.ray_packed_gbps, goal.ray_put_gbps, "packed")], work, num_rows, 1)
            both = [
                (client, goal.ray_gbps, goal.ray_put_gbps, "padded"),
                (client, goal.ray_packed_gbps, goal.ray_put_gbps, "packed"),
                (plain, goal.ray_store_gbps, goal.ray_store_put_gbps, "padded"),
            ]
            ray_goal(both, work, num_rows, args.steady - 1)
            remote_seed_s = baseline_s(work, num_prompts, True)
            versus.append(
                Versus("Ray actor", "seed design, Ray actor", remote_seed_s, remote_steady, _load())
            )
            for shards in (1, 2):
                sharded = ShardedDockClient.launch(
                    GRPODock, shards=shards, prompts_num=num_prompts, n_samples_per_prompt=N_SAMPLES,
                    extra_columns=EXTRA_COLUMNS,
                )  # fmt: skip
                run = steady_run(sharded, work, num_rows)
                name = f"sharded, {shards} shard{'s' if shards > 1 else ''}"
                versus.append(Versus(name, "seed design, Ray actor", remote_seed_s, run, _load()))
            get_bytes = remote_steady.get_bytes // len(remote_steady.get_s)
            put_s, copy_s, put_faults = ray_put_cost(get_bytes)
            if not args.no_neighbour:
                with cpu_bound_neighbour() as spinners:
                    crowded_load = _load()
                    in_process_goal(small_dock, work, num_rows, args.steady, crowded)
                    crowded_clients = [
                        (client, crowded.ray_gbps, crowded.ray_put_gbps, "padded"),
                        (client, crowded.ray_packed_gbps, crowded.ray_put_gbps, "packed"),
                        (plain, crowded.ray_store_gbps, crowded.ray_store_put_gbps, "padded"),
                    ]
                    ray_goal(crowded_clients, work, num_rows, args.steady)
                    crowded_load += " -> " + _load()
        finally:
            ray.shutdown()
        rows.append(fmt_row("seed design, Ray actor", remote_base, None))
        rows.append(fmt_row("ExperienceDock Ray actor", remote, remote_total))
        rows.append(fmt_row("ExperienceDock Ray, iter 3", remote_steady, None))
        bounds.append(fmt_bound("ExperienceDock Ray actor", remote, ray_target=1.0))
        bounds.append(fmt_bound("ExperienceDock Ray, iter 3", remote_steady, ray_target=1.0))
        beside.append(fmt_beside("ExperienceDock Ray actor", remote))
        beside.append(fmt_beside("ExperienceDock Ray, iter 3", remote_steady))
    elif not args.no_neighbour:
        with cpu_bound_neighbour() as spinners:
            crowded_load = _load()
            in_process_goal(small_dock, work, num_rows, args.steady, crowded)
            crowded_load += " -> " + _load()

    header = (
        "| implementation             | put s   | p50 ms  | max ms  | GB/s   | get s   | p50 ms  | max ms  "
        "| GB/s   | total s | vs base | stored / held MB |"
    )
    _print_table(header, rows)
    print()
    print("Against the bounds (copy: torch copy_ of the same bytes per call, measured beside each call;")
    print("the goals are in the steady-state table below):")
    header = (
        "| run                        | put GB/s | copy GB/s | put/copy | get GB/s | copy GB/s | get/copy "
        "| Ray target              |"
    )
    _print_table(header, bounds)
    print()
    print("Beside the bounds, not instead: get / (copy_ of its valid bytes + zero_ of its padding bytes),")
    print("what a padded layout must write; minor page faults of this process during the timed calls:")
    header = (
        "| run                        | get/(copy+fill) | put minor faults      | get minor faults      |"
    )
    _print_table(header, beside)
    print()
    print("Goal 3, steady state: each ratio's median and range over the steady iterations (the 3rd and")
    print(f"{args.steady - 1} more of each layout, alternating; the put from all of them), load {_load()}:")
    header = f"| {'ratio':<53} | median | {'min-max':>11} | {'n':>3} | target |"
    _print_table(header, steady_table(goal))
    if not args.no_neighbour:
        print()
        print(f"The same with a CPU-bound neighbour: {spinners} processes spinning in Python, one per core")
        print(f"({args.steady} steady iterations of each; load {crowded_load}):")
        _print_table(header, steady_table(crowded) if not args.no_ray else steady_table(crowded)[:4])
    if not args.no_ray:
        print(
            f"What the channel skips: one ray.put of a {get_bytes / 1e6:.1f} MB array (a get's bytes) "
            f"took {1e3 * put_s:.2f} ms and {put_faults} minor faults ({get_bytes // 4096} pages of "
            f"4 KiB), a copy of it {1e3 * copy_s:.2f} ms: {put_s / copy_s:.1f}x (medians of 20)."
        )
    print()
    print("Ours vs baseline (the same GRPO flow; put+get seconds, steady state: our 3rd iteration on a")
    print("reused dock, the baseline's median of 3 runs; GB/s of ours; the load when each was measured):")
    header = (
        "| deployment             | baseline               | baseline s | ours s   | ours vs  "
        "| put GB/s | get GB/s | load           |"
    )
    _print_table(header, [row.line() for row in versus])

    print()
    print(f"In process, by rows per call (puts and gets; median (range) of {args.steady} steady")
    print(f"iterations per layout), load {_load()}:")
    header = "| rows per call | put / copy        | padded get / copy | packed get / copy |"
    _print_table(header, call_size_table(num_prompts, (64, CHUNK, 1024), args.steady))

    big_dock = GRPODock(1_000_000 // N_SAMPLES, N_SAMPLES, extra_columns=EXTRA_COLUMNS)
    big = run_ours(big_dock, work, num_rows)
    small_tiny, big_tiny = tiny_get_cost(small_dock), tiny_get_cost(big_dock)
    small_get, big_get = statistics.median(ours.get_s), statistics.median(big.get_s)
    print()
    print("| get per call (p50)                | capacity 8,192-class | capacity 1,000,000 | ratio |")
    print("|-----------------------------------|----------------------|--------------------|-------|")
    print(
        f"| 256 rows x 7 columns (actor_train) | {1e3 * small_get:17.2f} ms | {1e3 * big_get:15.2f} ms "
        f"| {big_get / small_get:5.2f} |"
    )
    print(
        f"| 8 rows x 1 scalar column           | {1e6 * small_tiny:17.1f} us | {1e6 * big_tiny:15.1f} us "
        f"| {big_tiny / small_tiny:5.2f} |"
    )


if __name__ == "__main__":
    main()
