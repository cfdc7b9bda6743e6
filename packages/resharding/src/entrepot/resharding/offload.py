"""Move training state (params, grads, optimizer state) to host memory and back, in place.

The tensors a module and an optimizer hold keep their identity: offloading copies each
underlying *storage* to a host buffer and then resizes the device storage to zero bytes;
onloading resizes it back and copies the bytes in. Every ``nn.Parameter``, every view into a
flat buffer (Megatron's DDP param/grad buffers), every optimizer state tensor stays the same
Python object, so nothing needs rebuilding, the same trick MindSpeed-RL and FSDP use.

Working per storage rather than per tensor matters: tied embeddings, views into one flat
buffer and ``main_grad`` aliases are each moved exactly once.

On an accelerator the host buffers are pinned (page-locked) so the copies run at full DMA
speed; pinned buffers are kept between cycles because pinning is the slow part. On CPU the
"device" storage is the module's own storage and the host copy a separate CPU tensor, which
runs the very same code path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import torch
from torch import nn

from entrepot.resharding.errors import OffloadStateError

__all__ = ["Component", "Offloader", "OptimizerState", "device_synchronize"]


class Component(StrEnum):
    """The three kinds of training state an ``Offloader`` moves independently."""

    PARAMS = "params"
    GRADS = "grads"
    OPTIMIZER = "optimizer"


# Attributes holding gradients: autograd's ``grad`` and Megatron DDP's fp32 ``main_grad``.
_GRAD_ATTRIBUTES = ("grad", "main_grad")


def device_synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (``torch.cuda``/``torch.npu``/``torch.cpu`` alike)."""
    torch.get_device_module(device).synchronize()


@dataclass
class _Slot:
    """One offloaded storage: the live (emptied) device storage and its host copy."""

    storage: torch.UntypedStorage
    nbytes: int
    host: torch.Tensor | None  # [nbytes] uint8; None when the contents were dropped


def _byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over the whole storage (shape [nbytes])."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class OptimizerState(Protocol):
    """What the offloader reads of an optimizer, laid out as torch.optim's (any optimizer with these)."""

    @property
    def state(self) -> Mapping[Any, Mapping[str, Any]]:
        """Per-parameter state: name -> tensor (``exp_avg`` ...) or value."""
        ...

    @property
    def param_groups(self) -> Sequence[Mapping[str, Any]]:
        """Groups whose ``params`` may hold tensors that are not model parameters (fp32 masters)."""
        ...


class Offloader:
    """Offload/onload params, grads and optimizer state of one model, per component.

    Args:
        model: The module (or an iterable of its parameters) whose state is moved.
        optimizer: Optional optimizer; its per-parameter state tensors (``exp_avg`` ...) and
            any master copies in ``param_groups`` that are not model parameters (fp32 masters of
            a mixed-precision optimizer) form the ``optimizer`` component.
        pin_memory: Pin host buffers; defaults to ``True`` for accelerator storages and
            ``False`` for CPU ones (pinning needs an accelerator runtime).

    Example:
        >>> offloader = Offloader(model, optimizer)
        >>> offloader.offload_optimizer(); offloader.offload_grads(keep=False)
        >>> offloader.offload_params()      # device storages now hold 0 bytes
        >>> offloader.onload_params(); offloader.onload_optimizer(); offloader.onload_grads()
    """

    def __init__(
        self,
        model: nn.Module | Iterable[torch.Tensor],
        optimizer: OptimizerState | None = None,
        *,
        pin_memory: bool | None = None,
    ) -> None:
        params = model.parameters() if isinstance(model, nn.Module) else model
        self._params: list[torch.Tensor] = list(params)
        self._optimizer = optimizer
        self._pin_memory = pin_memory
        self._slots: dict[Component, list[_Slot]] = {}
        # Pinned host buffers survive onload, keyed by (component, index in the slot list).
        self._pinned_cache: dict[tuple[Component, int], torch.Tensor] = {}

    # ------------------------------------------------------------------ public API
    def is_offloaded(self, component: Component | str) -> bool:
        """Whether ``component`` ("params", "grads", "optimizer") is currently offloaded."""
        return Component(component) in self._slots

    def offload_params(self, *, keep: bool = True) -> int:
        """Copy parameter storages to host and free them on the device; returns bytes freed.

        ``keep=False`` drops the values instead (they come back as zeros): for a copy of the
        weights that is overwritten after every onload, such as an inference engine's.
        """
        return self._offload(Component.PARAMS, keep=keep)

    def onload_params(self) -> int:
        """Re-allocate parameter storages on the device and copy the values back."""
        return self._onload(Component.PARAMS)

    def offload_grads(self, *, keep: bool = True) -> int:
        """Free gradient storages; with ``keep=False`` their values are dropped, not copied.

        Dropped gradients come back as zeros on ``onload_grads``, which is what a training
        step that starts with ``zero_grad`` expects, at no host-memory or copy cost.
        """
        return self._offload(Component.GRADS, keep=keep)

    def onload_grads(self) -> int:
        """Re-allocate gradient storages (restored values, or zeros if they were dropped)."""
        return self._onload(Component.GRADS)

    def offload_optimizer(self) -> int:
        """Copy optimizer state (and non-parameter master weights) to host, free the device."""
        return self._offload(Component.OPTIMIZER, keep=True)

    def onload_optimizer(self) -> int:
        """Re-allocate optimizer state storages on the device and copy the values back."""
        return self._onload(Component.OPTIMIZER)

    def storage_pointers(self, component: Component | str) -> set[int]:
        """Data pointers of the resident storages of ``component`` (to detect aliasing)."""
        return {storage.data_ptr() for storage in self._storages(Component(component))}

    def resident_bytes(self) -> int:
        """Bytes the tracked tensors currently occupy on their device (deduplicated by storage)."""
        return sum(
            storage.nbytes()
            for component in Component
            for storage in self._storages(component)
            if storage.device.type != "meta"
        )

    # ------------------------------------------------------------------ collection
    def _tensors(self, component: Component) -> Iterator[torch.Tensor]:
        if component is Component.PARAMS:
            yield from self._params
        elif component is Component.GRADS:
            for param in self._params:
                for attribute in _GRAD_ATTRIBUTES:
                    grad = getattr(param, attribute, None)
                    if isinstance(grad, torch.Tensor):
                        yield grad
        elif self._optimizer is not None:
            for state in self._optimizer.state.values():
                yield from (value for value in state.values() if isinstance(value, torch.Tensor))
            model_ids = {id(param) for param in self._params}
            for group in self._optimizer.param_groups:
                yield from (p for p in group["params"] if id(p) not in model_ids)

    def _storages(self, component: Component) -> list[torch.UntypedStorage]:
        """Distinct non-empty storages of ``component``, in a stable order."""
        seen: set[int] = set()
        storages = []
        for tensor in self._tensors(component):
            storage = tensor.untyped_storage()
            pointer = storage.data_ptr()
            if storage.nbytes() == 0 or pointer in seen:
                continue
            seen.add(pointer)
            storages.append(storage)
        return storages

    # ------------------------------------------------------------------ moves
    def _host_buffer(self, component: Component, index: int, storage: torch.UntypedStorage) -> torch.Tensor:
        pin = storage.device.type != "cpu" if self._pin_memory is None else self._pin_memory
        nbytes = storage.nbytes()
        if pin:
            cached = self._pinned_cache.get((component, index))
            if cached is not None and cached.numel() == nbytes:
                return cached
        host = torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=pin)
        if pin:
            self._pinned_cache[(component, index)] = host
        return host

    def _offload(self, component: Component, *, keep: bool) -> int:
        if component in self._slots:
            raise OffloadStateError(
                f"{component.value} are already offloaded; call onload_{component.value} first"
            )
        storages = self._storages(component)
        slots = []
        for index, storage in enumerate(storages):
            host = None
            if keep:
                host = self._host_buffer(component, index, storage)
                host.copy_(_byte_view(storage), non_blocking=host.is_pinned())
            slots.append(_Slot(storage=storage, nbytes=storage.nbytes(), host=host))
        # The copies must land before the device memory is released and possibly reused.
        for device in {storage.device for storage in storages}:
            device_synchronize(device)
        for slot in slots:
            slot.storage.resize_(0)
        self._slots[component] = slots
        return sum(slot.nbytes for slot in slots)

    def _onload(self, component: Component) -> int:
        slots = self._slots.get(component)
        if slots is None:
            raise OffloadStateError(f"{component.value} are not offloaded; nothing to onload")
        for slot in slots:
            slot.storage.resize_(slot.nbytes)
            device_bytes = _byte_view(slot.storage)
            if slot.host is None:
                device_bytes.zero_()
            else:
                device_bytes.copy_(slot.host, non_blocking=slot.host.is_pinned())
        for device in {slot.storage.device for slot in slots}:
            device_synchronize(device)
        del self._slots[component]
        return sum(slot.nbytes for slot in slots)
