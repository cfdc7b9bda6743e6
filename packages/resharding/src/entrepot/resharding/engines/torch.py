"""Plain-PyTorch engines: an HF-named ``nn.Module`` as training engine or inference engine.

``TorchTrainingEngine`` presents a single-process HF model (e.g. the GRPO default's GPT-2) in
training layout through its weight adaptor, so it plugs into the same ``ShardingManager`` as
a megatron-core model. ``TorchInferenceEngine`` is a generation copy of the model whose
weights are overwritten in place on every ``load_weights``; its memory is released with the
storage-resize trick of ``Offloader`` (values dropped: they are reloaded anyway).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from entrepot.resharding.errors import EngineError
from entrepot.resharding.layout import ParallelLayout
from entrepot.resharding.offload import Offloader
from entrepot.resharding.protocols import INFERENCE_TAGS

__all__ = ["TorchInferenceEngine", "TorchTrainingEngine", "copy_weights_in_place"]


class TorchTrainingEngine:
    """A single-process HF model as a ``TrainingEngine`` (layout TP=PP=EP=1).

    Args:
        module: the HF-named model being trained.
        adaptor: its ``WeightAdaptor`` (``get_adaptor(type(module).__name__)``), whose
            ``hf_to_train`` gives the training-layout names.
    """

    def __init__(self, module: nn.Module, adaptor: Any) -> None:
        self.module = module
        self.adaptor = adaptor
        self._layout = ParallelLayout()

    @property
    def layout(self) -> ParallelLayout:
        """Always TP=PP=EP=1: the whole model lives in this process."""
        return self._layout

    @property
    def device(self) -> torch.device:
        """The device of the module's first parameter."""
        return next(self.module.parameters()).device

    def named_train_parameters(self) -> dict[str, torch.Tensor]:
        """The module's weights converted to training-layout names (detached)."""
        hf_state = {name: p.detach() for name, p in self.module.named_parameters(remove_duplicate=False)}
        return dict(self.adaptor.hf_to_train(hf_state))


def copy_weights_in_place(
    targets: Mapping[str, torch.Tensor],
    weights: Mapping[str, torch.Tensor],
    *,
    required: Collection[str] | None = None,
) -> None:
    """Copy ``weights`` into the tensors ``targets`` by name, validating everything first.

    Args:
        targets: every name a weight may have -> the tensor it is copied into.
        weights: name -> new value (same shape as the target).
        required: names that must be given (default: all of ``targets``); a tied weight has
            two names in ``targets`` but only one needs a value.

    Raises:
        EngineError: a name not in ``targets``, a shape that differs, or a required name
            left without a weight; nothing is copied then.
    """
    unknown = sorted(set(weights) - set(targets))
    if unknown:
        raise EngineError(
            f"unknown weight names {unknown[:5]} (of {len(unknown)}); known e.g. {sorted(targets)[:5]}"
        )
    for name, weight in weights.items():
        if tuple(weight.shape) != tuple(targets[name].shape):
            expected = tuple(targets[name].shape)
            raise EngineError(f"weight {name!r} has shape {tuple(weight.shape)}; engine expects {expected}")
    missing = sorted(set(targets if required is None else required) - set(weights))
    if missing:
        raise EngineError(f"no weight given for {missing[:5]} (of {len(missing)} engine parameters)")
    with torch.no_grad():
        for name, weight in weights.items():
            targets[name].copy_(weight, non_blocking=True)


def _in_owned_memory(module: nn.Module) -> nn.Module:
    """`module` with every parameter in memory this process owns, tied parameters still one tensor.

    ``from_pretrained`` maps a safetensors file: those storages cannot be resized, and `offload`
    frees weights by resizing their storages to 0. Such a parameter gets a copy in process memory
    (once: the mapped pages are the page cache's, dropped with the mapping).
    """
    with torch.no_grad():
        for param in module.parameters():  # each distinct parameter once (a tied head is the embedding)
            if not param.untyped_storage().resizable():
                param.data = param.data.clone()
    return module


class TorchInferenceEngine:
    """An ``nn.Module`` used for generation, as an ``InferenceEngine``.

    Its parameter names are the inference layout it accepts (an HF module takes HF names: pair
    it with ``LocalResharder(adaptor, target="hf")``).

    Args:
        module: the generation model; its weights are overwritten by ``load_weights``.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = _in_owned_memory(module)
        # Tied weights (lm_head = embedding) answer to both names; one of them is enough.
        self._params = dict(module.named_parameters(remove_duplicate=False))
        self._required = [name for name, _ in module.named_parameters()]
        self._offloader = Offloader(module)

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy ``weights`` (every distinct parameter of the module, by name) in place."""
        if self._offloader.is_offloaded("params"):
            raise EngineError("the engine's weights are offloaded; call onload(('weights',)) first")
        copy_weights_in_place(self._params, weights, required=self._required)

    def offload(self) -> None:
        """Free the weight storages (values dropped); generation allocates its own KV cache."""
        if not self._offloader.is_offloaded("params"):
            self._offloader.offload_params(keep=False)

    def onload(self, tags: Sequence[str] = INFERENCE_TAGS) -> None:
        """Re-allocate the weight storages (zeros until ``load_weights``)."""
        unknown = sorted(set(tags) - set(INFERENCE_TAGS))
        if unknown:
            raise EngineError(f"unknown onload tags {unknown}; allowed: {list(INFERENCE_TAGS)}")
        if "weights" in tags and self._offloader.is_offloaded("params"):
            self._offloader.onload_params()

    def resident_bytes(self) -> int:
        """Bytes the engine's weights occupy now."""
        return self._offloader.resident_bytes()
