"""Benchmark: ``Resharder`` on gloo CPU ranks against a baseline and this machine's memcpy, in one run.

Three reshards of a Llama-style bf16 model (~512 MB), each timed against a baseline on the same
training shards:

==================  =====  ==================================================================
reshard             ranks  baseline
==================  =====  ==================================================================
TP2 x PP2 -> TP1    4      per-tensor: one TP all-gather and one PP broadcast per tensor
TP2 -> TP2          2      local ``train_to_infer`` of the rank's own shard (no communication)
TP1 -> TP1 (local)  1      local ``train_to_infer`` (what ``LocalResharder`` does)
==================  =====  ==================================================================

For each it prints seconds (slowest rank, best of ``--repeats`` interleaved runs), the bytes
each rank ends with ("out": its inference shard), the bytes the ``Resharder`` moved (sent to
other ranks and copied locally, summed over ranks), the bytes a method writes per rank (a local
``train_to_infer`` returns renamed tensors as they are and writes only the re-laid-out QKV),
GB/s = written bytes per rank / seconds, and that as a fraction of this machine's memcpy GB/s,
measured in the same run in the parent process: one single-threaded ``copy_`` of ``--size-mb``
(best of 5; every rank runs one thread too), into a destination written before and into freshly
allocated memory (each reshard allocates its output anew, so it pays the page faults). Peak
extra memory of the ``Resharder`` is reported against its design target, one bucket plus one
inference copy: as accounted (``ReshardStats.scratch_bytes + output_bytes``) and as measured
(the largest RSS growth of a rank, sampled every 2 ms).

The cost of ``verify=True`` is measured in the same runs: the same reshard with verification
(position-mixed checksums of every slice at both ends, round trips of the layout conversions),
printed as a ratio to ``verify=False``; and the checksum's own GB/s next to a ``copy_`` of the
same bytes (one thread, bf16 and fp32; on CUDA too when there is one).

Where slices cross ranks (TP2 x PP2 -> TP1) the ``Resharder`` runs twice: with its default
transport (shared-memory arenas, the ranks being on one host) and ``shared_memory=False``
("over gloo": the exchanges through gloo's TCP sockets, what ranks on two hosts do).

Two shapes of the same bytes: ``wide`` (hidden 1024, ~110 tensors) and ``deep`` (hidden 256,
~2,000 tensors, where per-tensor collectives pay their latency each time).

Run: ``python bench_resharding.py [--size-mb 512] [--bucket-mb 64] [--repeats 3] [--shapes wide,deep]
[--scenarios 0,1,2]`` (indices into ``SCENARIOS``)
(about 2.5 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from entrepot.resharding import ParallelLayout, Resharder, WeightAdaptor, get_adaptor
from entrepot.resharding._checksum import checksum

MB = 2**20


@dataclass(frozen=True)
class Scenario:
    """One reshard: ranks, the two layouts and the baseline it is compared with."""

    name: str
    world: int
    train: ParallelLayout
    infer: ParallelLayout
    baseline: str  # "per-tensor" or "local train_to_infer"


SCENARIOS = (
    Scenario("TP2xPP2 -> TP1", 4, ParallelLayout(tp=2, pp=2), ParallelLayout(tp=1), "per-tensor"),
    Scenario("TP2 -> TP2", 2, ParallelLayout(tp=2), ParallelLayout(tp=2), "local train_to_infer"),
    Scenario("TP1 -> TP1 (local)", 1, ParallelLayout(), ParallelLayout(), "local train_to_infer"),
)

# Two shapes of the same bytes: few large tensors, and many small ones.
SHAPES = {
    "wide": dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=4),
    "deep": dict(hidden_size=256, intermediate_size=704, num_attention_heads=4, num_key_value_heads=2),
}


def _config(shape: str, size_mb: int, dtype: torch.dtype) -> SimpleNamespace:
    """A Llama-style config (head dim 64) whose weights take about ``size_mb`` MB in ``dtype``."""
    dims = SHAPES[shape]
    hidden, inter, vocab = dims["hidden_size"], dims["intermediate_size"], 32000
    kv = dims["num_key_value_heads"] * 64
    per_layer = (hidden + 2 * kv) * hidden + hidden * hidden + 3 * inter * hidden + 2 * hidden
    fixed = 2 * vocab * hidden + hidden
    target = size_mb * MB // dtype.itemsize
    layers = max(2, 2 * round(max(0, target - fixed) / per_layer / 2))
    return SimpleNamespace(
        num_hidden_layers=layers, head_dim=64, vocab_size=vocab, tie_word_embeddings=False, **dims
    )


def _full_shapes(config: SimpleNamespace) -> dict[str, tuple[int, ...]]:
    hidden, inter, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    kv = config.num_key_value_heads * 64
    shapes: dict[str, tuple[int, ...]] = {
        "embedding.word_embeddings.weight": (vocab, hidden),
        "output_layer.weight": (vocab, hidden),
        "decoder.final_layernorm.weight": (hidden,),
    }
    for i in range(config.num_hidden_layers):
        p = f"decoder.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "self_attention.linear_qkv.weight": (hidden + 2 * kv, hidden),
            p + "self_attention.linear_proj.weight": (hidden, hidden),
            p + "pre_mlp_layernorm.weight": (hidden,),
            p + "mlp.linear_fc1.weight": (2 * inter, hidden),
            p + "mlp.linear_fc2.weight": (hidden, inter),
        }
    return shapes


def _local_shard(
    adaptor: WeightAdaptor, config: SimpleNamespace, sc: Scenario, rank: int, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """This rank's training shard, built directly (no full model is materialised)."""
    coords = sc.train.coords(rank, sc.world)
    local: dict[str, torch.Tensor] = {}
    for name, shape in _full_shapes(config).items():
        if adaptor.stage_of(name, sc.train) != coords.pp_rank:
            continue
        spec = adaptor.param_spec(name)
        local_shape = list(shape)
        if spec.tp_dim is not None:
            local_shape[spec.tp_dim] //= sc.train.tp
        local[name] = torch.full(local_shape, rank + 1.0, dtype=dtype)  # values do not affect timing
    return local


def _per_tensor(
    adaptor: WeightAdaptor, resharder: Resharder, local: dict[str, torch.Tensor], sc: Scenario, groups: Any
) -> dict[str, torch.Tensor]:
    """The naive baseline: one TP all-gather and one PP broadcast per tensor, converted one by one."""
    coords = sc.train.coords(dist.get_rank(), sc.world)
    tp_groups, pp_groups = groups
    out: dict[str, torch.Tensor] = {}
    assert resharder._plan is not None
    for name, param in resharder._plan.params.items():
        stage = adaptor.stage_of(name, sc.train)
        spec = param.spec
        full = torch.empty(param.full_shape, dtype=param.dtype)
        if coords.pp_rank == stage:
            if spec.tp_dim is None:
                full.copy_(local[name])
            else:
                pieces = [torch.empty_like(local[name]) for _ in range(sc.train.tp)]
                dist.all_gather(pieces, local[name], group=tp_groups[stage])
                chunks = [p.chunk(spec.fused_chunks, dim=spec.tp_dim) for p in pieces]
                full.copy_(
                    torch.cat([c[k] for k in range(spec.fused_chunks) for c in chunks], dim=spec.tp_dim)
                )
        src = stage * (sc.world // sc.train.pp) + coords.tp_rank
        dist.broadcast(full, src=src, group=pp_groups[coords.tp_rank])
        out.update(adaptor.train_to_infer({name: full}))
    return out


def _pipeline_groups(sc: Scenario) -> Any:
    """(TP group of each stage, PP group of each TP rank) for the per-tensor baseline."""
    stage_size = sc.world // sc.train.pp
    tp_groups = [
        dist.new_group(list(range(s * stage_size, (s + 1) * stage_size))) for s in range(sc.train.pp)
    ]
    pp_groups = [dist.new_group(list(range(t, sc.world, stage_size))) for t in range(stage_size)]
    return tp_groups, pp_groups


class _PeakRss:
    """Samples this process's resident set size in a thread; ``peak - start`` is the extra memory."""

    def __init__(self) -> None:
        self.start = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


def _timed(fn: Callable[[], object]) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank decides
    return float(elapsed)


def _fresh_bytes(out: dict[str, torch.Tensor], local: dict[str, torch.Tensor]) -> int:
    """Bytes of ``out`` that do not alias the training shard (what a local conversion writes)."""
    shared = {t.untyped_storage().data_ptr() for t in local.values()}
    return sum(t.nbytes for t in out.values() if t.untyped_storage().data_ptr() not in shared)


def _worker(rank: int, port: int, sc: Scenario, shape: str, args: argparse.Namespace, results: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=sc.world)
    dtype = getattr(torch, args.dtype)
    config = _config(shape, args.size_mb, dtype)
    adaptor = get_adaptor("LlamaForCausalLM", config)
    local = _local_shard(adaptor, config, sc, rank, dtype)
    groups = _pipeline_groups(sc) if sc.baseline == "per-tensor" else None
    resharder = Resharder(adaptor, sc.train, sc.infer, bucket_bytes=args.bucket_mb * MB)
    over_gloo = Resharder(adaptor, sc.train, sc.infer, bucket_bytes=args.bucket_mb * MB, shared_memory=False)
    verifying = Resharder(adaptor, sc.train, sc.infer, bucket_bytes=args.bucket_mb * MB, verify=True)
    for warm in (resharder, over_gloo, verifying):  # warm-up: plan and buffer layout
        warm.reshard(local)
        warm.destroy_buffers()
    peak = 0

    def bucketed() -> float:
        nonlocal peak
        with _PeakRss() as rss:
            seconds = _timed(lambda: resharder.reshard(local))
        peak = max(peak, rss.peak - rss.start)
        resharder.destroy_buffers()
        return seconds

    def gloo() -> float:
        seconds = _timed(lambda: over_gloo.reshard(local))
        over_gloo.destroy_buffers()
        return seconds

    def verified() -> float:
        seconds = _timed(lambda: verifying.reshard(local))
        verifying.destroy_buffers()
        return seconds

    def baseline() -> float:
        if sc.baseline == "per-tensor":
            return _timed(lambda: _per_tensor(adaptor, resharder, local, sc, groups))
        return _timed(lambda: adaptor.train_to_infer(local))

    crosses = resharder.stats.transport != "local"  # slices cross ranks: the transports differ
    times: dict[str, list[float]] = {"Resharder": [], "verify=True": [], sc.baseline: []}
    if crosses:
        times["over gloo"] = []
    for _ in range(args.repeats):  # interleaved, so load changes on a shared machine hit all alike
        times["Resharder"].append(bucketed())
        if crosses:
            times["over gloo"].append(gloo())
        times["verify=True"].append(verified())
        times[sc.baseline].append(baseline())
    stats = resharder.stats
    # [max over ranks: peak RSS growth, scratch, output bytes] and [sum: sent, local copies]
    maxima = torch.tensor([peak, stats.scratch_bytes, stats.output_bytes], dtype=torch.int64)
    sums = torch.tensor([stats.bytes_sent, stats.bytes_local], dtype=torch.int64)
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    if rank == 0:
        results.update(
            {name: min(values) for name, values in times.items()},
            peak_rss=int(maxima[0]),
            scratch=int(maxima[1]),
            output_bytes=int(maxima[2]),
            sent=int(sums[0]),
            local_copies=int(sums[1]),
            baseline_fresh=_fresh_bytes(adaptor.train_to_infer(local), local),
            collectives=stats.num_collectives,
            rounds=stats.num_rounds,
            tensors=len(_full_shapes(config)),
            transport=stats.transport,
            layers=config.num_hidden_layers,
        )
    dist.destroy_process_group()


def _memcpy_gbps(nbytes: int, repeats: int = 5) -> tuple[float, float]:
    """This machine's single-threaded memcpy GB/s for ``nbytes``, best of ``repeats``.

    Returns ``(warm, fresh)``: a ``copy_`` into a destination already written once, and into a
    newly allocated one (the kernel maps its pages on first touch, as in every reshard, whose
    output buffer is allocated anew after ``destroy_buffers``).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    warm = fresh = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst = torch.empty(nbytes, dtype=torch.uint8)
        dst.copy_(src)
        middle = time.perf_counter()
        dst.copy_(src)
        fresh = min(fresh, middle - start)
        warm = min(warm, time.perf_counter() - middle)
        del dst
    torch.set_num_threads(threads)
    return nbytes / warm / 1e9, nbytes / fresh / 1e9


def _checksum_vs_copy(nbytes: int, dtype: torch.dtype, device: str, repeats: int = 5) -> tuple[float, float]:
    """``(checksum GB/s, copy_ GB/s)`` over the same ``nbytes`` of ``dtype``, best of ``repeats``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    src = torch.randn(nbytes // dtype.itemsize, device=device).to(dtype)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    best = {"checksum": float("inf"), "copy_": float("inf")}
    for _ in range(repeats):
        for name, fn in (("checksum", lambda: checksum(src)), ("copy_", lambda: dst.copy_(src))):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            best[name] = min(best[name], time.perf_counter() - start)
    torch.set_num_threads(threads)
    return nbytes / best["checksum"] / 1e9, nbytes / best["copy_"] / 1e9


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _report(
    sc: Scenario, shape: str, res: dict[str, Any], memcpy: tuple[float, float], args: argparse.Namespace
) -> None:
    out = res["output_bytes"]
    print(
        f"\n[{sc.name}, {shape}] {sc.world} gloo rank(s), {args.dtype}, {res['layers']} layers, "
        f"{res['tensors']} tensors; out per rank {out / MB:.0f} MB; Resharder moved "
        f"{(res['sent'] + res['local_copies']) / MB:.0f} MB (sent {res['sent'] / MB:.0f} + local copies "
        f"{res['local_copies'] / MB:.0f}, all ranks) in {res['collectives']} exchanges, "
        f"{res['rounds']} rounds; transport {res['transport']}"
    )
    print(
        f"{'method':<22} {'seconds':>8} {'MB written/rank':>16} {'GB/s':>7} {'vs memcpy':>10} "
        f"{'vs fresh memcpy':>16} {'time vs Resharder':>18}"
    )
    written = {
        "Resharder": out,
        "over gloo": out,
        "verify=True": out,
        "per-tensor": out,
        "local train_to_infer": res["baseline_fresh"],
    }
    for method in ("Resharder", "over gloo", "verify=True", sc.baseline):
        if method not in res:
            continue
        seconds = res[method]
        gbps = written[method] / seconds / 1e9
        print(
            f"{method:<22} {seconds:8.3f} {written[method] / MB:16.0f} {gbps:7.2f} {gbps / memcpy[0]:10.0%} "
            f"{gbps / memcpy[1]:16.0%} {seconds / res['Resharder']:17.2f}x"
        )
    print(f"verify=True / verify=False: {res['verify=True'] / res['Resharder']:.2f}x")
    target = args.bucket_mb * MB + out
    accounted = res["scratch"] + out
    print(
        f"peak extra memory vs target (bucket {args.bucket_mb} MB + inference copy {out / MB:.0f} MB = "
        f"{target / MB:.0f} MB): accounted {accounted / MB:.0f} MB (scratch {res['scratch'] / MB:.0f} MB) "
        f"= {accounted / target:.2f}x; measured RSS growth {res['peak_rss'] / MB:.0f} MB "
        f"= {res['peak_rss'] / target:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=512, help="model size in MB")
    parser.add_argument("--bucket-mb", type=int, default=64, help="Resharder bucket size in MB")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per method (best is reported)")
    parser.add_argument("--shapes", default="wide,deep", help=f"comma-separated, from {sorted(SHAPES)}")
    parser.add_argument(
        "--scenarios", default="all", help=f"indices into {[s.name for s in SCENARIOS]}, e.g. 0,2"
    )
    args, _ = parser.parse_known_args()  # nox passes the same posargs to every benchmark
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # One forkserver imports torch once; each reshard then forks its ranks instead of spawning
    # fresh interpreters (seconds each on a loaded 2-core machine).
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "entrepot.resharding"])
    start = time.perf_counter()
    memcpy = _memcpy_gbps(args.size_mb * MB)
    print(
        f"memcpy (1 thread, {args.size_mb} MB copy_, best of 5): {memcpy[0]:.2f} GB/s; "
        f"into freshly allocated memory: {memcpy[1]:.2f} GB/s"
    )
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        for dtype in (torch.bfloat16, torch.float32):
            ours, copy = _checksum_vs_copy(args.size_mb * MB, dtype, device)
            print(
                f"checksum ({device}, {dtype}, {args.size_mb} MB, best of 5): {ours:.2f} GB/s; copy_ of the "
                f"same bytes {copy:.2f} GB/s; checksum / copy_ time {copy / ours:.2f}x"
            )
    for shape in args.shapes.split(","):
        chosen = range(len(SCENARIOS)) if args.scenarios == "all" else map(int, args.scenarios.split(","))
        for sc in (SCENARIOS[i] for i in chosen):
            with mp.Manager() as manager:
                results = manager.dict()
                mp.start_processes(
                    _worker,
                    args=(_free_port(), sc, shape, args, results),
                    nprocs=sc.world,
                    start_method="spawn",
                )
                _report(sc, shape, dict(results), memcpy, args)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
