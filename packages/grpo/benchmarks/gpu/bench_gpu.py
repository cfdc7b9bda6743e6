"""GPU figures of Entrepot in one run: training throughput, weight sync, phase memory, time to first step.

Sections (each isolated: one that fails is recorded in the JSON and the others still run):

- train: one GRPO step (fwd + bwd + AdamW) on a 16k-token packed micro-batch of a Qwen3-0.6B-shaped
  model (bf16, random weights, built from its config), torch engine and megatron-core TP 1:
  tokens/s and MFU, against the datasheet peak and a bf16 matrix product measured in the same run.
  FLOPs = 6 N_body T + 6 V h R + 6 L H d sum_i s_i^2 (`common.train_flops`).
- sync: co-located weight sync, training layout -> rollout engine, `Resharder` verify off / on and
  the torch engine's local conversion, against a device-to-device copy of the same bytes; the
  checksum's device, agreement with the CPU and rate.
- memory: peak device and host memory of each phase of a co-located step, every offload key off
  and on.
- first_step: seconds from the start of `rl grpo train` to its first finished step on that model.

It also reports which packed-attention kernel ran and checks it against the portable SDPA path.
Without CUDA (or with --tiny) everything runs at tiny shapes on the CPU (about 20 s on 2 cores); CI does
that (packages/grpo/tests/test_bench_gpu.py; section (d), which runs the `rl` command, in
packages/cli/tests/test_bench_gpu_first_step.py), so the script cannot rot between GPU sessions.

The device command, as run on one H100 (2026-11-27), from the repository root, no network; megatron-core
0.16.1 carried as a cp312 wheel in .whl/ (the run tool's carry), our packages from their src folders:

    set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl && \
    export PYTHONPATH=/tmp/site:$(echo packages/{batching,dock,resharding,grpo,cli}/src | tr ' ' :) || exit 3
    OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1 timeout 330 python3 -W ignore \
        packages/grpo/benchmarks/gpu/bench_gpu.py --out $OUT/bench_gpu.json 2>&1 | tee $OUT/log.txt

It took 92 s there (the machine's start not counted).

Elsewhere: python packages/grpo/benchmarks/gpu/bench_gpu.py [--tiny] [--sections train sync ...]
"""

from __future__ import annotations

import os

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch starts OpenMP: spinning threads slow small jobs

import argparse
import datetime
import importlib.metadata
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))  # the section modules beside this file

from common import H100_BF16_PEAK_FLOPS, QWEN3_06B, TINY, Shape, make_batch, matmul_baseline
from report import goals, table

SECTIONS = ("train", "sync", "memory", "first_step")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _environment(device: torch.device) -> dict[str, Any]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "date": datetime.date.today().isoformat(), "device": name, "torch": torch.__version__,
        "megatron_core": _version("megatron-core"), "transformers": _version("transformers"),
        "python": sys.version.split()[0], "threads": torch.get_num_threads(),
    }  # fmt: skip


def _run_section(name: str, run: Callable[[], Any], results: dict[str, Any]) -> None:
    """Run one section; a failure is recorded (with its traceback's end) instead of ending the run."""
    start = time.perf_counter()
    print(f"[{name}] ...", flush=True)
    try:
        results[name] = run()
    except Exception as exc:  # one broken section must not cost the others' figures
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        print(results[name]["traceback"], file=sys.stderr, flush=True)
    from train_step import release

    release(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    results.setdefault("seconds", {})[name] = time.perf_counter() - start
    print(f"[{name}] {time.perf_counter() - start:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the default without CUDA)")
    parser.add_argument("--out", type=Path, default=Path("bench_gpu.json"), help="JSON file to write")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 2 tiny, 8 GPU)")
    parser.add_argument("--workdir", type=Path, default=None, help="where first_step writes (default: temp)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    cuda = torch.cuda.is_available()
    tiny = args.tiny or not cuda
    device = torch.device("cuda" if cuda and not tiny else "cpu")
    torch.set_num_threads(args.threads or (2 if tiny else 8))
    shape: Shape = TINY if tiny else QWEN3_06B
    warmup, repeat = (1, 2) if tiny else (2, 5)
    peak = (
        H100_BF16_PEAK_FLOPS
        if device.type == "cuda" and "H100" in torch.cuda.get_device_name(device)
        else None
    )
    batch = make_batch(shape).to(device)
    results: dict[str, Any] = {
        "shape": vars(shape), "environment": _environment(device), "datasheet_peak_flops": peak,
        "batch": {"lengths": batch.lengths, "tokens": shape.tokens, "scored": int(batch.scored.numel())},
    }  # fmt: skip

    import train_step
    from train_step import attention_check, bench_megatron, bench_torch

    _run_section("matmul", lambda: matmul_baseline(device, 512 if tiny else 8192), results)
    _run_section("attention", lambda: attention_check(device, tiny=tiny), results)
    if "error" in results["attention"]:  # the kernel `auto` picks is broken here: measure the portable path
        train_step.BACKEND["name"] = "sdpa"
    results["attention_backend"] = train_step.BACKEND["name"]
    if "train" in args.sections:
        kwargs = {"warmup": warmup, "repeat": repeat, "peak": peak}
        _run_section("train_torch", lambda: bench_torch(shape, batch, device, **kwargs), results)
        _run_section("train_megatron", lambda: bench_megatron(shape, batch, device, **kwargs), results)
    if "sync" in args.sections:
        from weight_sync import bench_weight_sync

        _run_section("sync", lambda: bench_weight_sync(shape, device, warmup=warmup, repeat=repeat), results)
    if "memory" in args.sections:
        from phase_memory import bench_phase_memory

        generation = {"num_prompts": 4, "new_tokens": 8} if tiny else {"num_prompts": 32, "new_tokens": 64}
        for offload in (False, True):
            _run_section(f"memory_offload_{'on' if offload else 'off'}",
                         lambda offload=offload: bench_phase_memory(shape, batch, device, offload=offload,
                                                                    **generation), results)  # fmt: skip
    if "first_step" in args.sections:
        from first_step import time_first_step

        small = ["rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=2", "rollout.max_new_tokens=8"]
        overrides = ["threads.torch_threads=2", *small] if tiny else []
        timeout_s = 120 if tiny else 240
        with tempfile.TemporaryDirectory() as temporary:
            workdir = args.workdir or Path(temporary)
            workdir.mkdir(parents=True, exist_ok=True)
            run = lambda: time_first_step(shape, workdir, device, overrides, timeout_s=timeout_s)  # noqa: E731
            _run_section("first_step", run, results)
    results["goals"] = goals(results) if not tiny else None
    results["total_seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print(table(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
