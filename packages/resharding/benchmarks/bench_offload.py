"""Benchmark of Offloader and the ShardingManager's transitions, on this machine's device.

Run: ``python packages/resharding/benchmarks/bench_offload.py`` (or ``nox -s bench-resharding``).

Part 1 moves the params and the AdamW state of a stack of linear layers out and back with
``Offloader`` and compares each move with a bound measured in the same run: one ``copy_`` of
the same number of bytes between two preallocated flat buffers (a memcpy; on an accelerator,
pinned host <-> device). Part 2 runs two GRPO-like cycles (infer -> forward -> train) of the
``ShardingManager`` over an HF GPT-2 (the GRPO default's architecture, 124M parameters) and
prints each transition's time and memory record (on CPU the "tracked" measure: see
``TransitionRecord``).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable

import torch
from torch import nn

from entrepot.resharding import LocalResharder, Offloader, ShardingManager
from entrepot.resharding.adaptors import get_adaptor
from entrepot.resharding.engines import TorchInferenceEngine, TorchTrainingEngine
from entrepot.resharding.offload import device_synchronize

DEVICE = torch.device(os.environ.get("ENTREPOT_BENCH_DEVICE", "cuda" if torch.cuda.is_available() else "cpu"))
REPEATS = 3
MB = 2**20


def _best(fn: Callable[[], object], setup: Callable[[], object] | None = None) -> float:
    """Best wall time of ``REPEATS`` runs of ``fn`` (``setup`` runs untimed before each)."""
    times = []
    for _ in range(REPEATS):
        if setup is not None:
            setup()
        device_synchronize(DEVICE)
        start = time.perf_counter()
        fn()
        device_synchronize(DEVICE)
        times.append(time.perf_counter() - start)
    return min(times)


def _memcpy_bound(nbytes: int) -> tuple[float, float]:
    """Seconds for one device->host and one host->device copy of ``nbytes`` (flat buffers)."""
    pin = DEVICE.type != "cpu"
    device = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE).random_()
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    out = _best(lambda: host.copy_(device, non_blocking=pin))
    back = _best(lambda: device.copy_(host, non_blocking=pin))
    return out, back


def bench_offloader() -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(2048, 2048) for _ in range(8)]  # ~128 MiB of fp32 params
    model = nn.Sequential(*layers).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 2048, device=DEVICE)).sum().backward()
    optimizer.step()
    offloader = Offloader(model, optimizer)

    print(f"\nOffloader on {DEVICE} (best of {REPEATS}); bound = one copy_ of the same bytes")
    print(f"{'component':<10} {'MiB':>7} {'offload s':>10} {'GB/s':>7} {'vs bound':>9}"
          f" {'onload s':>9} {'GB/s':>7} {'vs bound':>9}")  # fmt: skip
    for component in ("params", "optimizer"):
        _bench_component(offloader, component)

    def restore_grads() -> None:
        if offloader.is_offloaded("grads"):
            offloader.onload_grads()

    dropped = _best(lambda: offloader.offload_grads(keep=False), setup=restore_grads)
    print(f"{'grads':<10} dropped (no copy): {dropped:.4f} s")


def _bench_component(offloader: Offloader, component: str) -> None:
    """Time offload and onload of one component against the memcpy bound; print one row."""
    offload = getattr(offloader, f"offload_{component}")
    onload = getattr(offloader, f"onload_{component}")

    def ensure_onloaded() -> None:
        if offloader.is_offloaded(component):
            onload()

    def ensure_offloaded() -> None:
        if not offloader.is_offloaded(component):
            offload()

    nbytes = offload()
    onload()
    t_out = _best(offload, setup=ensure_onloaded)
    t_in = _best(onload, setup=ensure_offloaded)
    bound_out, bound_in = _memcpy_bound(nbytes)
    print(
        f"{component:<10} {nbytes / MB:>7.0f} {t_out:>10.4f} {nbytes / t_out / 1e9:>7.2f} "
        f"{bound_out / t_out:>8.0%} {t_in:>9.4f} {nbytes / t_in / 1e9:>7.2f} {bound_in / t_in:>8.0%}"
    )


def bench_manager() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    policy = GPT2LMHeadModel(GPT2Config()).to(DEVICE)
    generator = copy.deepcopy(policy).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    adaptor = get_adaptor("GPT2LMHeadModel", policy.config)
    manager = ShardingManager(
        TorchTrainingEngine(policy, adaptor),
        TorchInferenceEngine(generator),
        LocalResharder(adaptor, target="hf"),
        Offloader(policy, optimizer),
    )
    tokens = torch.randint(0, policy.config.vocab_size, (2, 32), device=DEVICE)
    for _ in range(2):
        with manager.mode("infer"), torch.no_grad():
            generator(tokens)
        with manager.mode("forward"), torch.no_grad():
            policy(tokens)
        with manager.mode("train"):
            policy(tokens, labels=tokens).loss.backward()
            optimizer.step()
    num_params = sum(p.numel() for p in policy.parameters())
    print(f"\nShardingManager, GPT-2 ({num_params / 1e6:.0f}M params, fp32) on {DEVICE}; second cycle")
    print(f"{'transition':<20} {'seconds':>8} {'peak MiB':>9} {'resident MiB':>13} {'memory':>9}  stages")
    for record in manager.history[6:]:
        print(
            f"{record.name:<20} {record.seconds:>8.3f} {record.peak_bytes / MB:>9.0f} "
            f"{record.resident_bytes / MB:>13.0f} {record.memory_source:>9}  {', '.join(record.stages)}"
        )


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    bench_offloader()
    bench_manager()
