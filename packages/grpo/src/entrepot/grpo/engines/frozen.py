"""Frozen models of a co-located actor rank (reference, reward models): on the device only for their stage.

`FrozenOnDemand` wraps a frozen model's parameters in entrepot.resharding's `Offloader`: outside
`resident()` their device storages hold 0 bytes and a host copy keeps the values; the modules keep
their identity, so nothing is rebuilt. `device_bytes` is what per-phase memory records add up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

__all__ = ["FrozenOnDemand", "device_bytes"]


def device_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes the distinct storages of `tensors` hold on their device now (0 while offloaded).

    Called a dozen times a step by the per-phase memory records, hence one dict comprehension over
    the storages (keyed by address, so a shared storage counts once) rather than a Python loop.
    """
    storages = map(torch.Tensor.untyped_storage, tensors)
    return sum({storage.data_ptr(): storage.nbytes() for storage in storages}.values())


def _own_storages(params: list[torch.Tensor]) -> None:
    """Give parameters read from a memory-mapped file their own memory (an mmap cannot be freed in place)."""
    with torch.no_grad():
        for param in params:
            if not param.untyped_storage().resizable():
                param.data = param.data.clone()


class FrozenOnDemand:
    """A frozen model's parameters, resident only inside `resident()` when `offload` is set.

    Args:
        params: the model's parameters (tied ones may repeat: each storage moves once).
        offload: keep them in host memory outside `resident()`; False leaves them on the device.
    """

    def __init__(self, params: Iterable[torch.Tensor], *, offload: bool) -> None:
        from entrepot.resharding import Offloader

        self.params = list(params)
        if offload:
            _own_storages(self.params)
        self._offloader = Offloader(self.params) if offload and self.params else None
        if self._offloader is not None:
            self._offloader.offload_params()

    @property
    def offloads(self) -> bool:
        """Whether the parameters leave the device outside `resident()` (`offload` and any to move)."""
        return self._offloader is not None

    @property
    def offloaded(self) -> bool:
        """Whether the parameters are in host memory now."""
        return self._offloader is not None and self._offloader.is_offloaded("params")

    @contextlib.contextmanager
    def resident(self) -> Iterator[None]:
        """The parameters on the device inside the block (nested blocks onload once)."""
        if not self.offloaded:
            yield
            return
        assert self._offloader is not None  # offloaded implies an offloader
        self._offloader.onload_params()
        try:
            yield
        finally:
            self._offloader.offload_params()

    def device_bytes(self) -> int:
        """Bytes the parameters hold on the device now."""
        return device_bytes(self.params)
