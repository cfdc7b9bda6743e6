"""Host memory of a CPU run: glibc's allocator settings, and checkpoints that copy only what they must."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from entrepot.grpo import load_config
from entrepot.grpo.embedded import host_allocator
from entrepot.grpo.run.checkpoint import capture_state

# In a fresh interpreter: free an 8 MiB block (at glibc's defaults that raises the mmap threshold to
# 8 MiB), then take 2 MiB and report whether it was mapped apart (mallinfo2's hblkhd grew) or came
# from the heap, whose freed pages stay in the process.
_MAPPED_APART = """
import ctypes, sys
from entrepot.grpo.embedded.host_allocator import tune_host_allocator
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype = Info, ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
tuned = tune_host_allocator() if sys.argv[1] == "tune" else False
libc.free(libc.malloc(8 << 20))
before = libc.mallinfo2().hblkhd
block = libc.malloc(2 << 20)
print(tuned, libc.mallinfo2().hblkhd - before >= 2 << 20)
"""


def _run(script: str, *args: str) -> str:
    """`script`'s output in a fresh interpreter (glibc's settings are the process's)."""
    env = {"PATH": "", "PYTHONPATH": ":".join(sys.path)}  # no MALLOC_* of the caller's
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env=env, check=True, timeout=120)  # fmt: skip
    return done.stdout.strip()


@pytest.mark.skipif(host_allocator._glibc() is None, reason="glibc's allocator only")
def test_the_tuned_allocator_maps_a_block_of_a_mib_or_more_apart() -> None:
    assert _run(_MAPPED_APART, "defaults") == "False False"  # glibc's dynamic threshold: in the heap
    assert _run(_MAPPED_APART, "tune") == "True True"


_TRIMMED = """
import ctypes, os
from entrepot.grpo.embedded.host_allocator import release_host_memory
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
blocks = [libc.malloc(4000) for _ in range(50_000)]  # 200 MB of small blocks, from the heap
for block in blocks:
    ctypes.memset(block, 1, 4000)
for block in blocks[:-1]:  # the last one keeps the heap's top in use: free pages below it stay
    libc.free(block)
before = rss()
released = release_host_memory()
print(released, before - rss() > 100 << 20)
"""


@pytest.mark.skipif(host_allocator._glibc() is None, reason="glibc's allocator only")
def test_release_hands_the_heaps_free_pages_back() -> None:
    assert _run(_TRIMMED) == "True True"


def test_the_users_own_malloc_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert host_allocator.tune_host_allocator() is False
    assert host_allocator.release_host_memory() is False


def test_off_glibc_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    host_allocator._glibc.cache_clear()
    try:
        assert host_allocator._glibc() is None
        assert host_allocator.tune_host_allocator() is False
        assert host_allocator.release_host_memory() is False
    finally:
        host_allocator._glibc.cache_clear()


def _trained_policy(overrides: list[str]):  # type: ignore[no-untyped-def]
    """The default (embedded GPT-2) policy after one AdamW step, so that it has optimizer state."""
    from entrepot.grpo.engines.policy import build_policy

    policy = build_policy(load_config(None, overrides))
    trainer = policy.trainer
    with policy.manager.mode("train"):
        for p in trainer.named_parameters().values():
            p.grad = torch.ones_like(p)
        trainer.torch_optimizer.step()
    return policy


def test_a_cpu_checkpoint_writes_the_live_tensors_without_a_copy() -> None:
    policy = _trained_policy([])
    state = capture_state(policy)
    live = policy.trainer.named_parameters()
    assert state["model"].keys() == live.keys()
    assert all(state["model"][k].data_ptr() == p.data_ptr() for k, p in live.items())
    moments = [v for s in policy.trainer.torch_optimizer.state.values() for v in s.values() if v.numel() > 1]
    assert moments and {t.data_ptr() for t in moments} <= {t.data_ptr() for t in state["optimizer"].values()}


def test_state_that_is_offloaded_after_the_capture_is_copied() -> None:
    policy = _trained_policy(["engine.offload_params=true", "engine.offload_optimizer=true"])
    optimizer = policy.trainer.torch_optimizer
    with policy.manager.mode("train"):
        state = capture_state(policy)
        moments = [v for s in optimizer.state.values() for v in s.values() if v.numel() > 1]
        expected = [v.clone() for v in moments]
    # leaving train mode emptied the live moments' storages (offloaded); the captured ones hold their own
    assert moments and all(v.untyped_storage().nbytes() == 0 for v in moments)
    captured = [v for v in state["optimizer"].values() if v.numel() > 1]
    assert len(captured) == len(expected) and all(c.untyped_storage().nbytes() > 0 for c in captured)
    assert all(torch.equal(c, e) for c, e in zip(captured, expected, strict=True))


def test_a_view_is_copied_to_a_storage_of_its_own() -> None:
    from entrepot.grpo.run.checkpoint import _on_host

    flat = torch.randn(24)  # as megatron's or a fused layout's parameters share one buffer
    for view in (flat[:12].view(4, 3), flat[12:].view(4, 3), flat.view(6, 4).t()):
        copy = _on_host(view, copy=False)
        assert torch.equal(copy, view) and copy.is_contiguous()
        assert copy.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr()
        assert copy.untyped_storage().nbytes() == copy.numel() * copy.element_size()


def test_the_estimate_counts_a_checkpoints_copy_only_where_capture_state_makes_one() -> None:
    from entrepot.grpo.run.memory import estimate_memory

    on_cpu = estimate_memory(load_config(None, []))
    assert on_cpu.stages["checkpoint"][1] <= on_cpu.stages["update"][1]  # nothing beyond the update's host
    for overrides in (["engine.device=cuda"], ["engine.offload_optimizer=true"]):
        copied = estimate_memory(load_config(None, overrides))
        state = copied.params + copied.reference + copied.optimizer
        assert copied.stages["checkpoint"][1] >= state > 0, overrides
