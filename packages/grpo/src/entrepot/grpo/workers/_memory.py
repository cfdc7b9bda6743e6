"""Peak device memory of each stage of a step (rollout, reward model, reference, old log-probs, update).

On cuda / npu the allocator's peak over the stage. On CPU, where no allocator statistics exist, the
largest total of bytes the worker's model state holds on the "device" (training parameters, gradients,
optimizer state, rollout weights, reference, reward models: distinct storages) sampled at the stage's
start, while its models are onloaded, and at its end, and raised by the peak of each ShardingManager
transition inside it (its record, sampled between the transition's own steps, plus what the manager
does not track); activations are not in it.

At each stage's end the process's C heap hands its free pages back to the OS (`release_host_memory`:
glibc's malloc_trim), so what one stage freed is not still resident while the next one peaks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from entrepot.grpo.embedded.host_allocator import release_host_memory

__all__ = ["PhaseMemory", "Sample"]


class Sample(Protocol):
    """Sample the tracked bytes now; given a ShardingManager `TransitionRecord`, also its peak."""

    def __call__(self, transition: Any = None) -> None: ...


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
    def phase(self, name: str, stats: dict[str, float]) -> Iterator[Sample]:
        """Measure the block; it gets a `sample(transition=None)` to call while the stage's models are on."""
        if self._allocator is not None:
            self._allocator.synchronize(self.device)
            self._allocator.reset_peak_memory_stats(self.device)
        peak = self.tracked()

        def sample(transition: Any = None) -> None:
            nonlocal peak
            now = self.tracked()
            peak = max(peak, now)
            if transition is not None and transition.memory_source == "tracked":
                # the record ends now: what it does not track (reference, reward models, state without
                # an offloader) is the difference, and was held throughout the transition
                peak = max(peak, transition.peak_bytes + now - transition.resident_bytes)

        yield sample
        if self._allocator is not None:
            self._allocator.synchronize(self.device)
            peak = int(self._allocator.max_memory_allocated(self.device))
        else:
            sample()
        stats[f"memory/{name}_peak_bytes"] = float(peak)
        release_host_memory()
