"""Thread, kernel and allocator settings for every torch process of a run.

On a small shared machine OpenMP's default busy-wait made a tiny model 5-10x slower, so every
process sets `OMP_WAIT_POLICY` before torch loads (Ray workers get it from the job's environment,
see `entrepot.grpo.run.ray_start`) and
caps torch's intra- and inter-op threads. `engine.deterministic` asks for deterministic kernels here too.
Each process also fixes glibc's mmap threshold (`entrepot.grpo.embedded.host_allocator`).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from entrepot.grpo.embedded.host_allocator import tune_host_allocator

if TYPE_CHECKING:
    from entrepot.grpo.config import ThreadsConfig

__all__ = ["configure_threads", "use_deterministic_kernels", "worker_env"]


def worker_env(config: ThreadsConfig) -> dict[str, str]:
    """Environment variables a worker process needs before it imports torch."""
    threads = str(config.torch_threads)
    return {
        "OMP_WAIT_POLICY": config.omp_wait_policy,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "TOKENIZERS_PARALLELISM": "false",
    }


def configure_threads(config: ThreadsConfig, *, interop: bool = False) -> None:
    """Set torch's thread counts (and the env for children) and glibc's allocator; interop only in
    fresh processes."""
    for key, value in worker_env(config).items():
        os.environ.setdefault(key, value)
    tune_host_allocator()  # before the model: the threshold applies to blocks allocated from now on
    import torch

    torch.set_num_threads(config.torch_threads)
    if interop:
        # Raises once set or after parallel work started in this process; then the first value holds.
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(config.interop_threads)


def use_deterministic_kernels() -> None:
    """Kernels that give the same bits on every run (no atomics-ordered sums), before any GPU work.

    cuBLAS reads its workspace setting when its first handle is made, so this runs before the model.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.use_deterministic_algorithms(True)
