"""Weights from the trainer to the rollout: published versions in shared memory, checked when loaded.

The trainer publishes each update's weights (inference layout, as the resharder gives them) as a
`PublishedWeights`: the tensors copied into a few flat buckets of one dtype each, with a checksum per
bucket (`entrepot.resharding.checksums`). A published version is never written again, so the rollout
reads it while the trainer already trains the next one; the rollout verifies the buckets' checksums
before it loads them, and a mismatch or a load past the timeout is a `WeightSyncError` naming both
ranks. In one process the buckets are ordinary tensors both threads see; between processes they go
over a signed socket (`weight_channel.WeightChannel`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from entrepot.grpo.errors import WeightSyncError
from entrepot.resharding import checksums

__all__ = ["BUCKET_BYTES", "PublishedWeights", "WeightMailbox", "publish"]

BUCKET_BYTES = 64 << 20
"""Largest bucket: tensors of one dtype are laid end to end up to this many bytes (one alone if larger)."""


@dataclass(frozen=True)
class PublishedWeights:
    """One policy version's weights: buckets, their checksums, and each tensor's place in them.

    Attributes:
        version: the policy version (updates trained).
        buckets: flat 1-D tensors, one dtype each.
        sums: int64 [len(buckets)] checksum of each bucket at publication.
        places: name -> (bucket, offset, shape).
        seconds: how long the copy and checksums took.
    """

    version: int
    buckets: tuple[torch.Tensor, ...]
    sums: torch.Tensor
    places: Mapping[str, tuple[int, int, torch.Size]]
    seconds: float

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buckets)

    def verified(self, source: str, target: str) -> dict[str, torch.Tensor]:
        """The named tensors (views of the buckets) once every bucket's checksum matches."""
        now = checksums(list(self.buckets))
        bad = (now != self.sums).nonzero().flatten().tolist()
        if bad:
            names = [n for n, (b, _, _) in self.places.items() if b in bad][:3]
            raise WeightSyncError(source, target, self.version,
                                  f"checksum mismatch in bucket(s) {bad} (holding {names}...)")  # fmt: skip
        return {
            name: self.buckets[b][offset : offset + shape.numel()].view(shape)
            for name, (b, offset, shape) in self.places.items()
        }


def publish(version: int, weights: Mapping[str, torch.Tensor]) -> PublishedWeights:
    """Copy `weights` into fresh buckets (so training may change its tensors at once) and checksum them."""
    t0 = time.perf_counter()
    plan: list[tuple[torch.dtype, list[str], int]] = []  # (dtype, names, elements) per bucket
    for name, tensor in weights.items():
        size = tensor.numel()
        last = next((b for b in reversed(plan) if b[0] == tensor.dtype), None)
        if last is None or (last[2] + size) * tensor.element_size() > BUCKET_BYTES:
            plan.append((tensor.dtype, [], 0))
            last = plan[-1]
        index = plan.index(last)
        plan[index] = (last[0], [*last[1], name], last[2] + size)
    places: dict[str, tuple[int, int, torch.Size]] = {}
    buckets: list[torch.Tensor] = []
    for b, (dtype, names, elements) in enumerate(plan):
        device = weights[names[0]].device
        bucket = torch.empty(elements, dtype=dtype, device=device)
        offset = 0
        for name in names:
            tensor = weights[name].detach()
            bucket[offset : offset + tensor.numel()].copy_(tensor.reshape(-1))
            places[name] = (b, offset, tensor.shape)
            offset += tensor.numel()
        buckets.append(bucket)
    sums = checksums(buckets)
    return PublishedWeights(version, tuple(buckets), sums, places, time.perf_counter() - t0)


class WeightMailbox:
    """The newest published version, shared by the trainer (who publishes) and the rollout (who loads).

    Args:
        source: the publishing rank's name, for errors.
        timeout: seconds `wait_newer` may wait.
    """

    def __init__(self, source: str = "actor rank 0", timeout: float = 300.0) -> None:
        self.source, self.timeout = source, timeout
        self._latest: PublishedWeights | None = None
        self._cond = threading.Condition()

    def put(self, weights: PublishedWeights) -> None:
        """Make `weights` the newest version (versions only go up)."""
        with self._cond:
            if self._latest is not None and weights.version <= self._latest.version:
                raise ValueError(f"version {weights.version} is not newer than {self._latest.version}")
            self._latest = weights
            self._cond.notify_all()

    def latest(self) -> PublishedWeights | None:
        with self._cond:
            return self._latest

    def wait_newer(self, version: int, target: str, stop: threading.Event | None = None) -> PublishedWeights:
        """The newest version above `version`, waiting up to the timeout (or until `stop` is set)."""
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while self._latest is None or self._latest.version <= version:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WeightSyncError(self.source, target, version + 1,
                                          f"nothing newer published within {self.timeout:g} s")  # fmt: skip
                if stop is not None and stop.is_set():
                    raise InterruptedError("stopped")
                self._cond.wait(min(left, 0.1))
            return self._latest
