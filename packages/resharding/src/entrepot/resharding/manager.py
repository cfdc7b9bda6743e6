"""ShardingManager: the mode switches of a co-located actor (train <-> infer on one device).

Modes (one active at a time, ``idle`` in between)::

    idle --enter_infer_mode--> infer --exit_infer_mode--> idle
    idle --enter_forward_mode--> forward --exit_forward_mode--> idle
    idle --enter_train_mode--> train --exit_train_mode--> idle

Every transition runs in stages ordered to keep the device peak low (the next stage's memory
is acquired only after the previous stage's is released) and returns a ``TransitionRecord``
(time + peak memory), also kept in ``ShardingManager.history``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

from entrepot.resharding._memory import MemoryProbe, TransitionRecord
from entrepot.resharding.errors import LayoutError, ModeTransitionError
from entrepot.resharding.offload import Offloader
from entrepot.resharding.protocols import InferenceEngine, TrainingEngine, WeightResharder

__all__ = ["MODES", "LocalResharder", "ShardingManager", "TransitionRecord"]

MODES: tuple[str, ...] = ("idle", "infer", "forward", "train")


class LocalResharder:
    """A ``WeightResharder`` for TP = PP = EP = 1 on both sides: a local layout conversion.

    No collective is needed when every rank holds the whole model in both layouts, so one call
    of the weight adaptor is the whole resharding.

    Args:
        adaptor: a ``WeightAdaptor`` (``entrepot.resharding.get_adaptor(architecture)``).
        target: ``"infer"`` for the fused inference layout (vLLM-style names, via
            ``train_to_infer``) or ``"hf"`` for HF names (via ``train_to_hf``), which is what a
            ``TorchInferenceEngine`` over an HF module takes.
    """

    _METHODS: ClassVar[dict[str, str]] = {"infer": "train_to_infer", "hf": "train_to_hf"}

    def __init__(self, adaptor: Any, target: str = "infer") -> None:
        if target not in self._METHODS:
            raise LayoutError(f"LocalResharder target {target!r} is not one of {sorted(self._METHODS)}")
        method = self._METHODS[target]
        if not callable(getattr(adaptor, method, None)):
            raise LayoutError(f"{type(adaptor).__name__} has no {method}(named) method")
        self._convert = getattr(adaptor, method)
        self.target = target

    def reshard(self, local_train_params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The whole model's weights in the target layout."""
        return dict(self._convert(dict(local_train_params)))

    def destroy_buffers(self) -> None:
        """Nothing to free: the converted tensors die with the caller's last reference."""


class ShardingManager:
    """Switches one co-located actor between inference, forward-only and training modes.

    Args:
        train_engine: the training side (``TrainingEngine``).
        infer_engine: the inference side (``InferenceEngine``).
        resharder: a ``Resharder`` (any TP/PP/EP), a ``LocalResharder`` (TP=PP=EP=1), or a
            bare ``WeightAdaptor`` (wrapped in ``LocalResharder(adaptor)``); its
            buffers are destroyed as soon as the inference engine has loaded the weights.
        offloader: moves training params/grads/optimizer state to host; ``None`` keeps
            everything resident (then the ``offload_*`` flags must be off).
        offload_train_params: free the training params while the inference engine runs and
            after forward-only passes (onloaded again on the next forward/train entry).
        offload_grads: free gradients outside train mode.
        offload_optimizer: free optimizer state outside train mode.
        keep_grads: copy gradients to host instead of dropping them (dropped gradients come
            back as zeros, which is what a step that starts from ``zero_grad`` needs).

    The inference engine is offloaded on construction: it holds no memory until the first
    ``enter_infer_mode``.

    Example:
        >>> manager = ShardingManager(engine, infer, LocalResharder(adaptor), Offloader(model, opt))
        >>> record = manager.enter_infer_mode()   # reshard, offload train params, load weights
        >>> ...generate...
        >>> manager.exit_infer_mode()             # inference engine frees weights + KV cache
        >>> with manager.mode("train"):           # params, optimizer, grads onloaded in turn
        ...     ...update...
    """

    def __init__(
        self,
        train_engine: TrainingEngine,
        infer_engine: InferenceEngine,
        resharder: WeightResharder | Any,
        offloader: Offloader | None = None,
        *,
        offload_train_params: bool = True,
        offload_grads: bool = True,
        offload_optimizer: bool = True,
        keep_grads: bool = False,
    ) -> None:
        wants = {
            "offload_train_params": offload_train_params,
            "offload_grads": offload_grads,
            "offload_optimizer": offload_optimizer,
        }
        if offloader is None and any(wants.values()):
            flags = ", ".join(name for name, on in wants.items() if on)
            raise ModeTransitionError(
                f"{flags} set but no offloader given; pass an Offloader or set them False"
            )
        self.train_engine = train_engine
        self.infer_engine = infer_engine
        # A bare weight adaptor means TP=PP=EP=1 everywhere: a local layout conversion.
        self.resharder: WeightResharder = (
            resharder if isinstance(resharder, WeightResharder) else LocalResharder(resharder)
        )
        self.offloader = offloader
        self.offload_train_params = offload_train_params
        self.offload_grads = offload_grads
        self.offload_optimizer = offload_optimizer
        self.keep_grads = keep_grads
        self.history: list[TransitionRecord] = []
        self._mode = "idle"
        self._in_flight_bytes = 0  # the resharded copy held between reshard and load
        self._device = train_engine.device
        # Like MindSpeed-RL: the inference engine holds nothing until the first enter_infer_mode.
        infer_engine.offload()

    @property
    def current_mode(self) -> str:
        """One of ``MODES``."""
        return self._mode

    # ------------------------------------------------------------------ transitions
    def enter_infer_mode(self) -> TransitionRecord:
        """Reshard the training params into the inference engine and make it ready to generate.

        Stages: onload train params (if offloaded) -> reshard -> offload train params ->
        onload inference weights -> load weights (the resharded copy is then dropped) ->
        onload KV cache. When the resharded weights alias the training params (a
        ``LocalResharder`` passes unfused tensors through as views), the params are offloaded
        only after the weights are loaded, since offloading them would free those views too.
        """
        probe = self._begin("infer", entering=True)
        self._onload_params(probe)
        weights = self.resharder.reshard(self.train_engine.named_train_parameters())
        params = self.offloader.storage_pointers("params") if self.offloader is not None else set()
        unique = _unique_storages(weights)
        fresh = [t for t in unique if t.untyped_storage().data_ptr() not in params]
        self._in_flight_bytes = sum(t.untyped_storage().nbytes() for t in fresh)
        probe.stage("reshard")
        offload_after_load = len(fresh) < len(unique)
        if self.offload_train_params and not offload_after_load:
            self._offload("params", probe)
        self.infer_engine.onload(("weights",))
        probe.stage("onload_weights")
        self.infer_engine.load_weights(weights)
        del weights
        self.resharder.destroy_buffers()
        self._in_flight_bytes = 0
        probe.stage("load_weights")
        if self.offload_train_params and offload_after_load:
            self._offload("params", probe)
        self.infer_engine.onload(("kv_cache",))
        probe.stage("onload_kv_cache")
        return self._end("enter_infer_mode", probe, "infer")

    def exit_infer_mode(self) -> TransitionRecord:
        """The inference engine releases its weights and KV cache."""
        probe = self._begin("infer", entering=False)
        self.infer_engine.offload()
        probe.stage("offload_inference")
        return self._end("exit_infer_mode", probe, "idle")

    def enter_forward_mode(self) -> TransitionRecord:
        """Onload the training params for forward-only passes (log-probs, reference)."""
        probe = self._begin("forward", entering=True)
        self._onload_params(probe)
        return self._end("enter_forward_mode", probe, "forward")

    def exit_forward_mode(self) -> TransitionRecord:
        """Offload the training params again (when ``offload_train_params``)."""
        probe = self._begin("forward", entering=False)
        if self.offload_train_params:
            self._offload("params", probe)
        return self._end("exit_forward_mode", probe, "idle")

    def enter_train_mode(self) -> TransitionRecord:
        """Onload params, then optimizer state, then gradients (staged to keep the peak low)."""
        probe = self._begin("train", entering=True)
        self._onload_params(probe)
        for component in ("optimizer", "grads"):
            if self.offloader is not None and self.offloader.is_offloaded(component):
                getattr(self.offloader, f"onload_{component}")()
                probe.stage(f"onload_{component}")
        return self._end("enter_train_mode", probe, "train")

    def exit_train_mode(self) -> TransitionRecord:
        """Offload optimizer state and gradients; params stay for the next resharding."""
        probe = self._begin("train", entering=False)
        if self.offload_optimizer:
            self._offload("optimizer", probe)
        if self.offload_grads:
            self._offload("grads", probe)
        return self._end("exit_train_mode", probe, "idle")

    @contextmanager
    def mode(self, name: str) -> Iterator[TransitionRecord]:
        """``with manager.mode("infer"):`` enters ``name`` and always exits it."""
        if name not in MODES[1:]:
            raise ModeTransitionError(f"unknown mode {name!r}; allowed: {', '.join(MODES[1:])}")
        record = getattr(self, f"enter_{name}_mode")()
        try:
            yield record
        finally:
            getattr(self, f"exit_{name}_mode")()

    # ------------------------------------------------------------------ helpers
    def _begin(self, mode: str, *, entering: bool) -> MemoryProbe:
        expected = "idle" if entering else mode
        if self._mode != expected:
            action = "enter" if entering else "exit"
            raise ModeTransitionError(
                f"cannot {action} {mode} mode while in {self._mode!r} mode; allowed from {expected!r}"
            )
        probe = MemoryProbe(self._device, self._tracked_bytes)
        probe.start()
        return probe

    def _end(self, name: str, probe: MemoryProbe, new_mode: str) -> TransitionRecord:
        record = probe.finish(name)
        self._mode = new_mode
        self.history.append(record)
        return record

    def _onload_params(self, probe: MemoryProbe) -> None:
        if self.offloader is not None and self.offloader.is_offloaded("params"):
            self.offloader.onload_params()
            probe.stage("onload_params")

    def _offload(self, component: str, probe: MemoryProbe) -> None:
        assert self.offloader is not None  # guaranteed by the constructor check
        if self.offloader.is_offloaded(component):
            return
        if component == "grads":
            self.offloader.offload_grads(keep=self.keep_grads)
        else:
            getattr(self.offloader, f"offload_{component}")()
        probe.stage(f"offload_{component}")

    def _tracked_bytes(self) -> int:
        resident = self.offloader.resident_bytes() if self.offloader is not None else 0
        return resident + self._in_flight_bytes + self.infer_engine.resident_bytes()


def _unique_storages(weights: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """One tensor per distinct storage among ``weights`` (views into one buffer count once)."""
    seen: set[int] = set()
    unique = []
    for tensor in weights.values():
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in seen:
            seen.add(pointer)
            unique.append(tensor)
    return unique
