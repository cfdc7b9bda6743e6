"""Contiguous per-dtype weight storage whose views survive ``destroy()`` / ``rebuild()``.

A ``MemoryBuffer`` packs many named tensors into one flat tensor per dtype, each starting at a
byte offset that is a multiple of ``alignment_bytes`` for every dtype (integer and bool ones
too; the upstream helper only padded floating dtypes). The layout is fixed at construction, so
the storage can be released between uses and re-allocated later:

* ``get(name)`` hands out one tensor object per name that aliases the flat storage.
* ``destroy()`` frees the flat storages and re-points every handed-out tensor at an empty
  ``[0]`` tensor, so a stale reference fails with a shape error instead of reading freed memory.
* ``rebuild()`` re-allocates the same layout and re-points the same tensor objects at it.

``ModelWeightBuffer`` adds what one model (one training pipeline stage) needs on top:
``copy_by_name`` and ``offload`` / ``onload`` to host memory (pinned on an accelerator).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from entrepot.resharding.errors import BufferStateError, ShapeMismatchError, UnknownWeightError

__all__ = ["DEFAULT_ALIGNMENT_BYTES", "MemoryBuffer", "ModelWeightBuffer", "TensorMeta"]

DEFAULT_ALIGNMENT_BYTES = 256  # a multiple of every dtype's itemsize and of 128-bit vector loads

TensorMeta = tuple[tuple[int, ...], torch.dtype]


@dataclass(frozen=True)
class _Slot:
    """Where one named tensor lives: its dtype's flat buffer, element offset and shape."""

    dtype: torch.dtype
    offset: int  # in elements of ``dtype``
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _validated_meta(meta: Mapping[str, TensorMeta]) -> dict[str, TensorMeta]:
    checked: dict[str, TensorMeta] = {}
    for name, entry in meta.items():
        if not isinstance(entry, tuple) or len(entry) != 2:
            raise ShapeMismatchError(f"meta[{name!r}] must be a (shape, dtype) pair, got {entry!r}")
        shape, dtype = entry
        if not isinstance(dtype, torch.dtype):
            raise ShapeMismatchError(f"meta[{name!r}] dtype must be a torch.dtype, got {dtype!r}")
        dims = tuple(shape)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise ShapeMismatchError(f"meta[{name!r}] shape must hold ints >= 0, got {shape!r}")
        checked[name] = (dims, dtype)
    return checked


class MemoryBuffer:
    """Named tensors packed into one contiguous, aligned flat tensor per dtype.

    Args:
        meta: ``{name: (shape, dtype)}``; tensors are laid out in this order.
        device: where the flat tensors live.
        alignment_bytes: every tensor starts at a multiple of this many bytes from the start
            of its flat tensor; a power of two (the default 256 suits CUDA/NPU kernels).

    The flat tensors are allocated at construction (zero-filled).
    """

    def __init__(
        self,
        meta: Mapping[str, TensorMeta],
        device: torch.device | str = "cpu",
        alignment_bytes: int = DEFAULT_ALIGNMENT_BYTES,
    ) -> None:
        if alignment_bytes < 1 or alignment_bytes & (alignment_bytes - 1):
            raise ShapeMismatchError(f"alignment_bytes must be a power of two >= 1, got {alignment_bytes}")
        self.meta = _validated_meta(meta)
        self.device = torch.device(device)
        self.alignment_bytes = alignment_bytes
        self._slots: dict[str, _Slot] = {}
        self._numels: dict[torch.dtype, int] = {}
        for name, (shape, dtype) in self.meta.items():
            step = max(1, alignment_bytes // dtype.itemsize)  # elements per alignment unit
            start = -(-self._numels.get(dtype, 0) // step) * step
            self._slots[name] = _Slot(dtype, start, shape)
            self._numels[dtype] = start + math.prod(shape)
        self._flats: dict[torch.dtype, torch.Tensor] = {
            dtype: torch.zeros(numel, dtype=dtype, device=self.device)
            for dtype, numel in self._numels.items()
        }
        self._handed_out: dict[str, torch.Tensor] = {}
        self._allocated = True

    # -- layout ----------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """Tensor names in layout order."""
        return list(self._slots)

    @property
    def dtypes(self) -> list[torch.dtype]:
        """The dtypes that have a flat tensor."""
        return list(self._numels)

    @property
    def nbytes(self) -> int:
        """Bytes of all flat tensors (padding included), whether allocated or not."""
        return sum(numel * dtype.itemsize for dtype, numel in self._numels.items())

    @property
    def is_allocated(self) -> bool:
        """False between ``destroy()`` and ``rebuild()``."""
        return self._allocated

    def offset(self, name: str) -> tuple[torch.dtype, int, int]:
        """``(dtype, element offset, numel)`` of ``name`` inside its dtype's flat tensor."""
        slot = self._slot(name)
        return slot.dtype, slot.offset, slot.numel

    def _slot(self, name: str) -> _Slot:
        try:
            return self._slots[name]
        except KeyError:
            raise UnknownWeightError(
                f"{name!r} is not in this buffer; it holds {len(self._slots)} tensors, e.g. {self.names[:3]}"
            ) from None

    # -- access ----------------------------------------------------------------------------
    def get(self, name: str) -> torch.Tensor:
        """The tensor for ``name`` (shape and dtype from ``meta``), aliasing the flat storage.

        The same tensor object is returned on every call and stays valid across
        ``destroy()``/``rebuild()``: while destroyed it is an empty ``[0]`` tensor.
        """
        slot = self._slot(name)
        tensor = self._handed_out.get(name)
        if tensor is None:
            tensor = torch.empty(0, dtype=slot.dtype, device=self.device)
            if self._allocated:
                self._point(tensor, slot)
            self._handed_out[name] = tensor
        return tensor

    def flat(self, dtype: torch.dtype) -> torch.Tensor:
        """The flat tensor of ``dtype`` (shape ``[padded numel]``); raises while destroyed."""
        if not self._allocated:
            raise BufferStateError("the buffer is destroyed; call rebuild() before flat()")
        if dtype not in self._flats:
            raise UnknownWeightError(f"no tensor of dtype {dtype} in this buffer; dtypes: {self.dtypes}")
        return self._flats[dtype]

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, get(name))`` pairs in layout order."""
        return ((name, self.get(name)) for name in self._slots)

    def _point(self, tensor: torch.Tensor, slot: _Slot) -> None:
        storage = self._flats[slot.dtype].untyped_storage()
        tensor.set_(storage, slot.offset, slot.shape, torch.empty(slot.shape, device="meta").stride())

    # -- lifetime --------------------------------------------------------------------------
    def destroy(self) -> None:
        """Free the flat storages; handed-out tensors become empty ``[0]`` tensors."""
        if not self._allocated:
            return
        for name, tensor in self._handed_out.items():
            empty = torch.empty(0, dtype=self._slots[name].dtype, device=self.device)
            tensor.set_(empty.untyped_storage(), 0, (0,), (1,))
        for flat in self._flats.values():
            flat.untyped_storage().resize_(0)
        self._allocated = False

    def rebuild(self, zero: bool = False) -> None:
        """Re-allocate the same layout and re-point handed-out tensors at it.

        Args:
            zero: fill the new storage with zeros (otherwise its contents are undefined).
        """
        if self._allocated:
            return
        for dtype, flat in self._flats.items():
            flat.untyped_storage().resize_(self._numels[dtype] * dtype.itemsize)
            if zero:
                flat.zero_()
        self._allocated = True
        for name, tensor in self._handed_out.items():
            self._point(tensor, self._slots[name])


class ModelWeightBuffer:
    """The name -> tensor map of one model (or pipeline stage) backed by a ``MemoryBuffer``.

    Args:
        meta: ``{name: (shape, dtype)}`` of every weight.
        device: where the weights live while on-loaded.
        alignment_bytes: see ``MemoryBuffer``.
    """

    def __init__(
        self,
        meta: Mapping[str, TensorMeta],
        device: torch.device | str = "cpu",
        alignment_bytes: int = DEFAULT_ALIGNMENT_BYTES,
    ) -> None:
        self.buffer = MemoryBuffer(meta, device, alignment_bytes)
        self._host: dict[torch.dtype, torch.Tensor] | None = None

    @property
    def names(self) -> list[str]:
        """Weight names in layout order."""
        return self.buffer.names

    @property
    def nbytes(self) -> int:
        """Bytes of the device storage when allocated."""
        return self.buffer.nbytes

    @property
    def is_offloaded(self) -> bool:
        """True between ``offload()`` and ``onload()``."""
        return self._host is not None

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.buffer.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.buffer.meta

    def __len__(self) -> int:
        return len(self.buffer.meta)

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """``{name: tensor}`` for every weight (tensors alias the buffer)."""
        return dict(self.buffer.items())

    def copy_by_name(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """Copy tensors into the buffer slots of the same names.

        Every name and shape is checked before anything is copied, so a bad input leaves the
        buffer untouched. Dtypes are converted; a subset of the names may be given.
        """
        pairs = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        self._require_on_device("copy_by_name")
        for name, tensor in pairs:
            shape, _ = self.buffer.meta.get(name, (None, None))
            if shape is None:
                raise UnknownWeightError(f"copy_by_name got {name!r}, which is not in the buffer")
            if tuple(tensor.shape) != shape:
                raise ShapeMismatchError(
                    f"copy_by_name: {name!r} has shape {tuple(tensor.shape)}, buffer slot is {shape}"
                )
        for name, tensor in pairs:
            self.buffer.get(name).copy_(tensor, non_blocking=True)

    def offload(self) -> None:
        """Copy the weights to host memory and free the device storage (tensors stay valid)."""
        self._require_on_device("offload")
        pin = self.buffer.device.type != "cpu"
        self._host = {}
        for dtype in self.buffer.dtypes:
            flat = self.buffer.flat(dtype)
            host = torch.empty(flat.shape, dtype=dtype, device="cpu", pin_memory=pin)
            host.copy_(flat, non_blocking=pin)
            self._host[dtype] = host
        if pin:
            torch.get_device_module(self.buffer.device).synchronize()
        self.buffer.destroy()

    def onload(self) -> None:
        """Re-allocate the device storage and copy the host copy back."""
        if self._host is None:
            raise BufferStateError("onload() called but the weights are not offloaded")
        self.buffer.rebuild()
        for dtype, host in self._host.items():
            self.buffer.flat(dtype).copy_(host, non_blocking=True)
        self._host = None

    def destroy(self) -> None:
        """Free the device storage and drop the contents (and any host copy)."""
        self._host = None
        self.buffer.destroy()

    def rebuild(self, zero: bool = False) -> None:
        """Re-allocate the device storage after ``destroy()`` (contents undefined unless ``zero``)."""
        if self._host is not None:
            raise BufferStateError("rebuild() called on offloaded weights; call onload() to restore them")
        self.buffer.rebuild(zero=zero)

    def _require_on_device(self, action: str) -> None:
        if self._host is not None:
            raise BufferStateError(f"{action}() called on offloaded weights; call onload() first")
        if not self.buffer.is_allocated:
            raise BufferStateError(f"{action}() called on destroyed weights; call rebuild() first")
