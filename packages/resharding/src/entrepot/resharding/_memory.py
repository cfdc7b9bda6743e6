"""Timing and peak-memory measurement of one ShardingManager transition."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from entrepot.resharding.offload import device_synchronize

__all__ = ["MemoryProbe", "TransitionRecord"]


@dataclass(frozen=True)
class TransitionRecord:
    """What one mode transition cost.

    Attributes:
        name: the transition, e.g. ``"enter_infer_mode"``.
        seconds: wall time, device work included (the device is synchronised at the end).
        peak_bytes: peak device memory during the transition. On cuda/npu the allocator's
            peak (``max_memory_allocated``); on CPU, where no allocator statistics exist, the
            largest total of bytes held by the tracked tensors (training params, grads,
            optimizer state, the resharded copy and the inference engine's weights and KV
            cache) sampled between stages.
        resident_bytes: the same measure at the end of the transition.
        memory_source: ``"allocator"`` or ``"tracked"``, saying which of the two it is.
        stages: the stages run, in order (e.g. ``("reshard", "offload_params", ...)``).
    """

    name: str
    seconds: float
    peak_bytes: int
    resident_bytes: int
    memory_source: str
    stages: tuple[str, ...]


class MemoryProbe:
    """Measures one transition on ``device``; ``tracked_bytes`` is the CPU fallback measure."""

    def __init__(self, device: torch.device, tracked_bytes: Callable[[], int]) -> None:
        self._device = device
        self._tracked_bytes = tracked_bytes
        module = torch.get_device_module(device)
        self._allocator = module if hasattr(module, "max_memory_allocated") else None
        self._start = 0.0
        self._peak = 0
        self._stages: list[str] = []

    def start(self) -> None:
        """Reset the peak counters and the clock."""
        self._stages = []
        if self._allocator is not None:
            device_synchronize(self._device)
            self._allocator.reset_peak_memory_stats(self._device)
        self._peak = self._tracked_bytes()
        self._start = time.perf_counter()

    def stage(self, name: str) -> None:
        """Mark the end of one stage and sample the tracked bytes."""
        self._stages.append(name)
        self._peak = max(self._peak, self._tracked_bytes())

    def finish(self, name: str) -> TransitionRecord:
        """Stop the clock and return the record of the transition."""
        device_synchronize(self._device)
        seconds = time.perf_counter() - self._start
        if self._allocator is not None:
            peak = int(self._allocator.max_memory_allocated(self._device))
            resident = int(self._allocator.memory_allocated(self._device))
            source = "allocator"
        else:
            resident = self._tracked_bytes()
            peak = max(self._peak, resident)
            source = "tracked"
        return TransitionRecord(
            name=name,
            seconds=seconds,
            peak_bytes=peak,
            resident_bytes=resident,
            memory_source=source,
            stages=tuple(self._stages),
        )
