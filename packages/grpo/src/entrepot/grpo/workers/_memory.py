"""Peak device memory of each stage of a step (rollout, reward model, reference, old log-probs, update).

On cuda / npu the allocator's peak over the stage. On CPU, where no allocator statistics exist, the
largest total of bytes the worker's model state holds on the "device" (training parameters, gradients,
optimizer state, rollout weights, reference, reward models: distinct storages) sampled at the stage's
start, after its models are onloaded, and at its end; activations are not in it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["PhaseMemory"]


class PhaseMemory:
    """Records `memory/<phase>_peak_bytes` into a stage's stats.

    Args:
        device: the worker's torch device.
        tracked: the CPU measure, bytes of model state resident now.
    """

    def __init__(self, device: str, tracked: Callable[[], int]) -> None:
        self.device = torch.device(device)
        self.tracked = tracked
        module: Any = torch.get_device_module(self.device) if self.device.type != "cpu" else None
        self._allocator = module if module is not None and hasattr(module, "max_memory_allocated") else None

    @property
    def source(self) -> str:
        """ "allocator" or "tracked": which measure the peaks are."""
        return "allocator" if self._allocator is not None else "tracked"

    @contextlib.contextmanager
    def phase(self, name: str, stats: dict[str, float]) -> Iterator[Callable[[], None]]:
        """Measure the block; it gets a `sample()` to call once the stage's models are onloaded."""
        if self._allocator is not None:
            self._allocator.synchronize(self.device)
            self._allocator.reset_peak_memory_stats(self.device)
        peak = self.tracked()

        def sample() -> None:
            nonlocal peak
            peak = max(peak, self.tracked())

        yield sample
        if self._allocator is not None:
            self._allocator.synchronize(self.device)
            peak = int(self._allocator.max_memory_allocated(self.device))
        else:
            sample()
        stats[f"memory/{name}_peak_bytes"] = float(peak)
