"""Benchmark: TP2 x PP2 -> TP1 resharding of a ~0.5 GB Llama-style model on 4 gloo processes (CPU).

Compares, in one run and on the same training shards:

* ``bucketed``: ``Resharder`` (one all-to-all per bucket of ``--bucket-mb``),
* ``per-tensor``: the naive baseline, one TP all-gather plus one PP broadcast per tensor,
* ``all-gather bound``: one plain ``all_gather`` of the same bytes (no packing,
  no layout conversion): the communication floor for this move,
* ``memcpy bound``: copying the output bytes once inside one process.

Every rank ends with the full model (inference TP = 1), so "GB/s" is output bytes per rank
divided by the slowest rank's time. Peak extra memory is the largest RSS growth of a rank
during the bucketed reshard (sampled every 2 ms), next to the inference copy and bucket sizes.

Two shapes of the same bytes are measured: ``wide`` (hidden 1024, ~110 tensors) and ``deep``
(hidden 256, ~1,800 tensors), where the per-tensor baseline pays collective latency per tensor.

Run: ``python bench_resharding.py [--size-mb 512] [--bucket-mb 64] [--repeats 3] [--shapes wide,deep]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from entrepot.resharding import ParallelLayout, Resharder, get_adaptor

WORLD = 4
TRAIN = ParallelLayout(tp=2, pp=2)
INFER = ParallelLayout(tp=1)


# Two shapes of the same bytes: few large tensors, and many small ones (where per-tensor
# collectives pay their latency hundreds of times over).
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
    target = size_mb * 2**20 // dtype.itemsize
    layers = max(2, 2 * round(max(0, target - fixed) / per_layer / 2))
    return SimpleNamespace(
        num_hidden_layers=layers, head_dim=64, vocab_size=vocab, tie_word_embeddings=False, **dims
    )


def _local_shard(adaptor, config: SimpleNamespace, rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """This rank's training shard, built directly (no full model is materialised)."""
    hidden, inter, vocab, kv = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
        config.num_key_value_heads * 64,
    )
    full_shapes = {
        "embedding.word_embeddings.weight": (vocab, hidden),
        "output_layer.weight": (vocab, hidden),
        "decoder.final_layernorm.weight": (hidden,),
    }
    for i in range(config.num_hidden_layers):
        p = f"decoder.layers.{i}."
        full_shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "self_attention.linear_qkv.weight": (hidden + 2 * kv, hidden),
            p + "self_attention.linear_proj.weight": (hidden, hidden),
            p + "pre_mlp_layernorm.weight": (hidden,),
            p + "mlp.linear_fc1.weight": (2 * inter, hidden),
            p + "mlp.linear_fc2.weight": (hidden, inter),
        }
    coords = TRAIN.coords(rank, WORLD)
    local: dict[str, torch.Tensor] = {}
    generator = torch.Generator().manual_seed(rank)
    for name, shape in full_shapes.items():
        if adaptor.stage_of(name, TRAIN) != coords.pp_rank:
            continue
        spec = adaptor.param_spec(name)
        local_shape = list(shape)
        if spec.tp_dim is not None:
            local_shape[spec.tp_dim] //= TRAIN.tp
        local[name] = torch.empty(local_shape, dtype=dtype).uniform_(-1, 1, generator=generator)
    return local


def _per_tensor_baseline(adaptor, resharder: Resharder, local: dict[str, torch.Tensor], groups) -> dict:  # type: ignore[no-untyped-def]
    """One TP all-gather and one PP broadcast per tensor, then the layout conversion per tensor."""
    rank = dist.get_rank()
    coords = TRAIN.coords(rank, WORLD)
    tp_groups, pp_groups = groups
    out: dict[str, torch.Tensor] = {}
    assert resharder._plan is not None
    for name, param in resharder._plan.params.items():
        stage = adaptor.stage_of(name, TRAIN)
        spec = param.spec
        full = torch.empty(param.full_shape, dtype=param.dtype)
        if coords.pp_rank == stage:
            if spec.tp_dim is None:
                full.copy_(local[name])
            else:
                pieces = [torch.empty_like(local[name]) for _ in range(TRAIN.tp)]
                dist.all_gather(pieces, local[name], group=tp_groups[stage])
                chunks = [p.chunk(spec.fused_chunks, dim=spec.tp_dim) for p in pieces]
                full.copy_(
                    torch.cat([c[k] for k in range(spec.fused_chunks) for c in chunks], dim=spec.tp_dim)
                )
        src = stage * (WORLD // TRAIN.pp) + coords.tp_rank
        dist.broadcast(full, src=src, group=pp_groups[coords.tp_rank])
        out.update(adaptor.train_to_infer({name: full}))
    return out


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


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    dist.barrier()
    start = time.perf_counter()
    fn()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank decides
    return float(elapsed)


def _worker(rank: int, port: int, shape: str, args: argparse.Namespace, results: dict) -> None:  # type: ignore[type-arg]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    dtype = getattr(torch, args.dtype)
    config = _config(shape, args.size_mb, dtype)
    adaptor = get_adaptor("LlamaForCausalLM", config)
    local = _local_shard(adaptor, config, rank, dtype)
    groups = (
        [dist.new_group([0, 1]), dist.new_group([2, 3])],
        [dist.new_group([0, 2]), dist.new_group([1, 3])],
    )
    resharder = Resharder(adaptor, TRAIN, INFER, bucket_bytes=args.bucket_mb * 2**20)
    resharder.reshard(local)  # warm-up: plan and buffer layout
    resharder.destroy_buffers()

    local_bytes = torch.tensor([sum(t.numel() * t.element_size() for t in local.values())])
    dist.all_reduce(local_bytes, op=dist.ReduceOp.MAX)  # stages differ by a norm; pad to the largest
    output_bytes = resharder.stats.output_bytes

    def bucketed() -> float:
        nonlocal peak
        with _PeakRss() as rss:
            seconds = _timed(lambda: resharder.reshard(local))
        peak = max(peak, rss.peak - rss.start)
        resharder.destroy_buffers()
        return seconds

    def all_gather() -> float:
        send = torch.empty(int(local_bytes), dtype=torch.uint8).fill_(1)
        recv = list(torch.empty(WORLD * int(local_bytes), dtype=torch.uint8).chunk(WORLD))
        return _timed(lambda: dist.all_gather(recv, send))

    def memcpy() -> float:
        src = torch.empty(output_bytes, dtype=torch.uint8).fill_(1)
        dst = torch.empty(output_bytes, dtype=torch.uint8)
        return _timed(lambda: dst.copy_(src))

    methods = {
        "bucketed": bucketed,
        "per-tensor": lambda: _timed(lambda: _per_tensor_baseline(adaptor, resharder, local, groups)),
        "all-gather bound": all_gather,
        "memcpy bound": memcpy,
    }
    peak = 0
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):  # interleaved, so load changes on a shared machine hit all alike
        for name, method in methods.items():
            times[name].append(method())
    row = {name: min(values) for name, values in times.items()}
    peak_t = torch.tensor([peak], dtype=torch.int64)
    dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
    if rank == 0:
        stats = resharder.stats
        results.update(
            row,
            output_bytes=output_bytes,
            peak_extra=int(peak_t),
            scratch=stats.scratch_bytes,
            collectives=stats.num_collectives,
            rounds=stats.num_rounds,
            tensors=len(resharder._plan.params),
            layers=config.num_hidden_layers,
        )
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _report(shape: str, res: dict, args: argparse.Namespace) -> None:  # type: ignore[type-arg]
    gb = res["output_bytes"] / 1e9
    print(
        f"\n[{shape}] TP2xPP2 -> TP1, {WORLD} gloo ranks, {args.dtype}, {res['layers']} layers, "
        f"{res['tensors']} tensors, {gb:.3f} GB out per rank, bucket {args.bucket_mb} MB, "
        f"best of {args.repeats}"
    )
    print(f"{'method':<18} {'seconds':>8} {'GB/s':>7} {'time vs bucketed':>17}")
    for method in ("bucketed", "per-tensor", "all-gather bound", "memcpy bound"):
        seconds = res[method]
        print(f"{method:<18} {seconds:8.3f} {gb / seconds:7.2f} {seconds / res['bucketed']:16.2f}x")
    print(
        f"bucketed: {res['collectives']} exchanges in {res['rounds']} rounds for {res['tensors']} tensors; "
        f"{res['per-tensor'] / res['bucketed']:.2f}x faster than per-tensor; "
        f"{100 * res['all-gather bound'] / res['bucketed']:.0f}% of the all-gather bound's speed"
    )
    peak, out = res["peak_extra"] / 2**20, res["output_bytes"] / 2**20
    print(
        f"peak extra memory (max rank RSS growth): {peak:.0f} MB = inference copy {out:.0f} MB "
        f"+ {peak - out:.0f} MB (arena: {res['scratch'] / 2**20:.0f} MB, bucket {args.bucket_mb} MB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=512, help="model size in MB")
    parser.add_argument("--bucket-mb", type=int, default=64, help="Resharder bucket size in MB")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per method (best is reported)")
    parser.add_argument("--shapes", default="wide,deep", help=f"comma-separated, from {sorted(SHAPES)}")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for shape in args.shapes.split(","):
        with mp.Manager() as manager:
            results = manager.dict()
            mp.start_processes(
                _worker, args=(_free_port(), shape, args, results), nprocs=WORLD, start_method="spawn"
            )
            _report(shape, dict(results), args)


if __name__ == "__main__":
    main()
