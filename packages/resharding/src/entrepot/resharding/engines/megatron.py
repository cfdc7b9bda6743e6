"""megatron-core as a ``TrainingEngine``: a ``GPTModel`` (one chunk per virtual stage) in training layout.

The training layout is megatron-core's own parameter naming with *global* indices, so that
names mean the same thing on every rank: a ``GPTModel`` numbers its decoder layers locally
(``decoder.layers.0`` is the first layer *of this stage*), while each ``TransformerLayer``
knows its global ``layer_number`` (1-based); experts are numbered locally too, and each
``MoELayer`` knows its ``local_expert_indices``. Transformer Engine's fused modules are named
back to the local-spec names (``linear_qkv.layer_norm_weight`` -> ``input_layernorm.weight``),
so one weight adaptor serves both specs.

The optimizer side plugs into ``Offloader``: pass the model chunks and the torch optimizer
inside Megatron's (``megatron_optimizer.optimizer``, which holds the fp32 master copies in
its ``param_groups``); DDP's ``main_grad`` buffers are found through the parameters.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from entrepot.resharding.errors import EngineError, MissingExtraError
from entrepot.resharding.layout import ParallelLayout

__all__ = ["MegatronTrainingEngine", "global_train_name", "layout_from_parallel_state", "require_megatron"]

# Transformer Engine spec name -> local spec name (the training layout's names).
_TE_RENAMES = (
    (".self_attention.linear_qkv.layer_norm_weight", ".input_layernorm.weight"),
    (".self_attention.linear_qkv.layer_norm_bias", ".input_layernorm.bias"),
    (".mlp.linear_fc1.layer_norm_weight", ".pre_mlp_layernorm.weight"),
    (".mlp.linear_fc1.layer_norm_bias", ".pre_mlp_layernorm.bias"),
)
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")
_GROUPED_EXPERT = re.compile(r"\.mlp\.experts\.(linear_fc[12])\.(weight|bias)(\d+)$")


def require_megatron() -> None:
    """Raise ``MissingExtraError`` (naming the ``megatron`` extra) unless megatron-core imports."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise MissingExtraError("megatron-core", "megatron")


def global_train_name(local_name: str, layer_numbers: Sequence[int], expert_indices: Sequence[int]) -> str:
    """One chunk's local parameter name -> its global training-layout name.

    Args:
        local_name: a name from the chunk's ``named_parameters()``.
        layer_numbers: the chunk's layers' global 0-based indices, by local position.
        expert_indices: this rank's experts' global indices, by local position (empty for a
            dense model).

    Raises:
        EngineError: a local layer or expert index the chunk does not have.
    """
    name = local_name
    for te_name, local_spec_name in _TE_RENAMES:
        if name.endswith(te_name):
            name = name[: -len(te_name)] + local_spec_name
    grouped = _GROUPED_EXPERT.search(name)
    if grouped:  # TEGroupedMLP: experts.linear_fc1.weight3 -> experts.local_experts.3.linear_fc1.weight
        linear, kind, expert = grouped.groups()
        name = f"{name[: grouped.start()]}.mlp.experts.local_experts.{expert}.{linear}.{kind}"
    layer = _LAYER.match(name)
    if layer:
        local = int(layer.group(1))
        if local >= len(layer_numbers):
            raise EngineError(
                f"{local_name!r}: local layer {local} but the chunk has {len(layer_numbers)} layers"
            )
        name = f"decoder.layers.{layer_numbers[local]}.{name[layer.end() :]}"
    expert_match = _LOCAL_EXPERT.search(name)
    if expert_match:
        local = int(expert_match.group(1))
        if local >= len(expert_indices):
            raise EngineError(
                f"{local_name!r}: local expert {local} but this rank has {len(expert_indices)} experts"
            )
        start, end = expert_match.span(1)
        name = f"{name[:start]}{expert_indices[local]}{name[end:]}"
    return name


def layout_from_parallel_state() -> ParallelLayout:
    """The training layout megatron-core's ``parallel_state`` was initialised with."""
    require_megatron()
    from megatron.core import parallel_state as mpu

    vpp = mpu.get_virtual_pipeline_model_parallel_world_size()
    etp = mpu.get_expert_tensor_parallel_world_size()
    tp = mpu.get_tensor_model_parallel_world_size()
    return ParallelLayout(
        tp=tp,
        pp=mpu.get_pipeline_model_parallel_world_size(),
        ep=mpu.get_expert_model_parallel_world_size(),
        vpp=vpp if vpp and vpp > 1 else None,
        expert_tp=None if etp in (None, tp) else etp,
    )


def _unwrap(module: nn.Module) -> nn.Module:
    """Strip DDP / Float16Module wrappers (each keeps the wrapped model in ``.module``)."""
    while not hasattr(module, "decoder"):
        inner = getattr(module, "module", None)
        if not isinstance(inner, nn.Module):
            break
        module = inner
    if not hasattr(module, "decoder"):
        raise EngineError(f"{type(module).__name__} is not a megatron-core GPTModel (no .decoder)")
    return module


class MegatronTrainingEngine:
    """One rank's megatron-core ``GPTModel`` chunk(s) as a ``TrainingEngine``.

    Args:
        model: the ``GPTModel`` of this rank, or its list of virtual-pipeline chunks; DDP and
            Float16Module wrappers are looked through.
        layout: the training layout; default: read from ``megatron.core.parallel_state``.

    Example:
        >>> engine = MegatronTrainingEngine(model_chunks)
        >>> weights = Resharder(adaptor, engine.layout, ParallelLayout(tp=2)).reshard(
        ...     engine.named_train_parameters())
    """

    def __init__(self, model: nn.Module | Sequence[nn.Module], layout: ParallelLayout | None = None) -> None:
        require_megatron()
        wrapped = list(model) if isinstance(model, Sequence) else [model]
        if not wrapped:
            raise EngineError("MegatronTrainingEngine needs at least one model chunk, got none")
        self.chunks = [_unwrap(chunk) for chunk in wrapped]
        self._layout = layout_from_parallel_state() if layout is None else layout
        if len(self.chunks) != self._layout.num_chunks:
            raise EngineError(
                f"{len(self.chunks)} model chunks given but the layout has vpp={self._layout.vpp} "
                f"({self._layout.num_chunks} chunk(s) per stage)"
            )

    @property
    def layout(self) -> ParallelLayout:
        """The training parallel layout."""
        return self._layout

    @property
    def device(self) -> torch.device:
        """The device of the first chunk's parameters."""
        return next(self.chunks[0].parameters()).device

    def named_train_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's parameters under global training-layout names (no copies)."""
        named: dict[str, torch.Tensor] = {}
        for chunk in self.chunks:
            for name, param in _named_global(chunk):
                if name in named:
                    raise EngineError(f"two chunks hold a parameter named {name!r}")
                named[name] = param.detach()
        return named

    def train_meta(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Global name -> (local shape, dtype) of this rank's shard (a ``MemoryBuffer`` meta)."""
        return {name: (tuple(t.shape), t.dtype) for name, t in self.named_train_parameters().items()}


def _named_global(chunk: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    layers = list(getattr(chunk.decoder, "layers", []))
    layer_numbers = [int(layer.layer_number) - 1 for layer in layers]
    expert_indices: list[int] = []
    for layer in layers:
        indices = getattr(getattr(layer, "mlp", None), "local_expert_indices", None)
        if indices is not None:
            expert_indices = [int(i) for i in indices]
            break
    # With tied embeddings and PP > 1 the last stage holds a copy of the word embeddings as
    # `output_layer.weight` (megatron keeps the two equal); the first stage's is the weight.
    tied_copy = getattr(chunk, "share_embeddings_and_output_weights", False) and not chunk.pre_process
    for name, param in chunk.named_parameters():
        if tied_copy and name == "output_layer.weight":
            continue
        yield global_train_name(name, layer_numbers, expert_indices), param
