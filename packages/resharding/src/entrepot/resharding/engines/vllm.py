"""vLLM as an ``InferenceEngine``: resharded weights loaded into a running ``vllm.LLM`` in place.

Weights arrive in the inference layout (vLLM's own parameter names, fused ``qkv_proj`` /
``gate_up_proj``). vLLM's ``load_weights`` expects checkpoint names instead (it fuses
``q_proj``/``k_proj``/``v_proj`` itself, and would mangle an already fused name), so fused
tensors are split back along dim 0 with the sizes the model's own fused layers declare
(``output_sizes``) and the model's ``packed_modules_mapping``. The split tensors are views: no
copy is made before vLLM's loader writes them into its parameters. Loading goes through vLLM's
in-place reload (``reload_weights``), which also re-runs the per-backend weight processing
(on CPU, oneDNN packing of linear weights).

Memory: on an accelerator (cuda; npu through vllm-ascend) the engine must be built with
``enable_sleep_mode=True``: ``offload`` is ``sleep(level=2)`` (weights and KV cache released,
nothing copied: the weights are reloaded on the next ``enter_infer_mode``) and ``onload`` is
``wake_up`` per tag, so weights come back before the KV cache. vLLM's CPU backend has no
sleep mode; there ``offload`` releases the KV cache storages (the bulk of the engine's
memory) and ``onload(("kv_cache",))`` re-allocates them zeroed; the packed weights stay.

The engine core must run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, or a
co-located ``distributed_executor_backend="external_launcher"`` worker), since the weights are
handed over by reference.

Legend: V = vocab size, H = hidden size, Q/K = query/key-value output rows of a fused layer.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from entrepot.resharding.errors import EngineError, MissingExtraError
from entrepot.resharding.protocols import INFERENCE_TAGS

__all__ = ["VllmInferenceEngine", "require_vllm", "split_fused_weights"]


def require_vllm() -> None:
    """Raise ``MissingExtraError`` (naming the ``vllm`` extra) unless vLLM is importable."""
    if importlib.util.find_spec("vllm") is None:
        raise MissingExtraError("vllm", "vllm")


def split_fused_weights(
    weights: Mapping[str, torch.Tensor],
    packed_modules: Mapping[str, Sequence[str]],
    output_sizes: Mapping[str, Sequence[int]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Inference-layout weights -> checkpoint-named weights, splitting fused layers.

    Args:
        weights: name -> tensor; a name whose module is a key of ``packed_modules`` (e.g.
            ``model.layers.0.self_attn.qkv_proj.weight``) holds the fused rows ``[Q; K; K]``.
        packed_modules: fused module name -> the checkpoint module names it packs, in row
            order (vLLM's ``packed_modules_mapping``: ``qkv_proj -> [q_proj, k_proj, v_proj]``).
        output_sizes: fused module path (``model.layers.0.self_attn.qkv_proj``) -> the row
            counts of its parts (vLLM's ``output_sizes`` of that layer).

    Yields:
        ``(checkpoint_name, tensor)``; split parts are views of the fused tensor.

    Raises:
        EngineError: a fused tensor whose row count is not the sum of its parts' sizes.
    """
    for name, tensor in weights.items():
        module_path, _, param = name.rpartition(".")
        parent, _, module = module_path.rpartition(".")
        parts = packed_modules.get(module)
        if parts is None:
            yield name, tensor
            continue
        sizes = list(output_sizes.get(module_path, ()))
        if len(sizes) != len(parts) or sum(sizes) != tensor.shape[0]:
            raise EngineError(
                f"fused weight {name!r} has {tensor.shape[0]} rows; the engine's {module_path} "
                f"packs {list(parts)} with sizes {sizes}"
            )
        prefix = f"{parent}." if parent else ""
        for part, chunk in zip(parts, torch.split(tensor, sizes, dim=0), strict=True):
            yield f"{prefix}{part}.{param}", chunk


class VllmInferenceEngine:
    """A running ``vllm.LLM`` (in-process engine core) as an ``InferenceEngine``.

    Args:
        llm: the engine, built with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (and
            ``enable_sleep_mode=True`` on an accelerator).

    Example:
        >>> os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        >>> engine = VllmInferenceEngine(vllm.LLM(model=path, enable_sleep_mode=True))
        >>> engine.load_weights(resharder.reshard(train_engine.named_train_parameters()))
    """

    def __init__(self, llm: Any) -> None:
        require_vllm()
        self.llm = llm
        worker = getattr(getattr(llm.llm_engine.model_executor, "driver_worker", None), "worker", None)
        if worker is None:
            raise EngineError(
                "the vLLM engine core runs in another process; build the LLM with "
                "VLLM_ENABLE_V1_MULTIPROCESSING=0 (or the external_launcher backend) so weights "
                "can be handed over in place"
            )
        self._runner = worker.model_runner
        self.model = self._runner.get_model()
        self.device = torch.device(self.llm.llm_engine.vllm_config.device_config.device)
        self._sleep_mode = self.device.type != "cpu"
        self._kv_slots: list[tuple[torch.UntypedStorage, int]] = []

    # ------------------------------------------------------------------ weights
    def _param_names(self) -> set[str]:
        return {name for name, _ in self.model.named_parameters()}

    def _output_sizes(self) -> dict[str, list[int]]:
        packed = getattr(self.model, "packed_modules_mapping", {})
        return {
            path: list(module.output_sizes)
            for path, module in self.model.named_modules()
            if path.rpartition(".")[2] in packed and hasattr(module, "output_sizes")
        }

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load every parameter of the model from inference-layout ``weights``, in place.

        Raises:
            EngineError: an unknown name or a parameter left without a weight (checked
                before vLLM is touched).
        """
        known = self._param_names()
        unknown = sorted(
            name for name in weights if name not in known and not name.endswith("lm_head.weight")
        )
        if unknown:
            raise EngineError(
                f"{len(unknown)} weight names are not parameters of {type(self.model).__name__}: "
                f"{unknown[:5]}; expected e.g. {sorted(known)[:5]}"
            )
        missing = sorted(known - set(weights))
        if missing:
            raise EngineError(f"no weight given for vLLM parameters {missing[:5]} (of {len(missing)})")
        packed = getattr(self.model, "packed_modules_mapping", {})
        checkpoint = list(split_fused_weights(weights, packed, self._output_sizes()))
        self._runner.reload_weights(weights_iterator=checkpoint, is_checkpoint_format=True)
        self._reprocess_tied_modules()
        # Cached prefixes were computed with the old weights.
        self.llm.reset_prefix_cache()

    def _reprocess_tied_modules(self) -> None:
        """Re-run the weight processing of modules whose weight is another module's (a tied LM head).

        vLLM's reload processes a module once its own weights are loaded; a tied LM head shares the
        embedding's parameter and is never loaded itself, so on CPU it would keep the kernel-packed
        copy of the weights of the first load.
        """
        loaded = dict(self.model.named_parameters())  # a shared parameter is listed once
        for path, module in self.model.named_modules():
            method = getattr(module, "quant_method", None)
            names = [f"{path}.{name}" if path else name for name in module._parameters]
            if method is not None and any(name not in loaded for name in names):
                method.process_weights_after_loading(module)

    # ------------------------------------------------------------------ memory
    def resident_bytes(self) -> int:
        """Bytes of the model's reachable parameters and of the KV cache now."""
        params = {
            p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in self.model.parameters()
        }
        return sum(params.values()) + self.kv_cache_bytes()

    def kv_cache_bytes(self) -> int:
        """Bytes the KV cache occupies now."""
        return sum(storage.nbytes() for storage in self._kv_storages())

    def _kv_storages(self) -> list[torch.UntypedStorage]:
        seen: set[int] = set()
        storages = []
        for tensor in self._runner.kv_caches:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in seen and storage.nbytes() > 0:
                seen.add(storage.data_ptr())
                storages.append(storage)
        return storages

    def offload(self) -> None:
        """Release weights and KV cache (accelerator: sleep level 2; CPU: the KV cache)."""
        if self._sleep_mode:
            self.llm.sleep(level=2)
            return
        if self._kv_slots:
            return  # already released
        self._kv_slots = [(storage, storage.nbytes()) for storage in self._kv_storages()]
        for storage, _ in self._kv_slots:
            storage.resize_(0)

    def onload(self, tags: Sequence[str] = INFERENCE_TAGS) -> None:
        """Re-acquire memory for ``tags``: weights first, then the KV cache."""
        unknown = sorted(set(tags) - set(INFERENCE_TAGS))
        if unknown:
            raise EngineError(f"unknown onload tags {unknown}; allowed: {list(INFERENCE_TAGS)}")
        ordered = [tag for tag in INFERENCE_TAGS if tag in tags]
        if self._sleep_mode:
            if self.llm.llm_engine.is_sleeping():
                for tag in ordered:
                    self.llm.wake_up(tags=[tag])
            return
        if "kv_cache" in ordered and self._kv_slots:
            for storage, nbytes in self._kv_slots:
                storage.resize_(nbytes)
                torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).zero_()
            self._kv_slots = []
            self.llm.reset_prefix_cache()
