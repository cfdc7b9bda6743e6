"""Ascend NPU: the vLLM adapter on vllm-ascend + torch_npu (device ``npu``).

Nothing in the weight path is device specific: ``VllmInferenceEngine`` splits fused weights
and reloads them through vLLM, ``Offloader`` pins host buffers for any non-CPU storage and
synchronises through ``torch.get_device_module(device)`` (``torch.npu`` once torch_npu is
imported), and vllm-ascend implements vLLM's sleep mode (weights and KV cache released with
``sleep(level=2)``, brought back per tag with ``wake_up``). This module adds the import
guard and the device check, so a missing extra fails early with the ``pip install`` to run.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from entrepot.resharding.engines.vllm import VllmInferenceEngine
from entrepot.resharding.errors import EngineError, MissingExtraError

__all__ = ["AscendVllmInferenceEngine", "require_npu"]

# import name -> distribution name, for the error message
_NPU_MODULES = {"torch_npu": "torch-npu", "vllm_ascend": "vllm-ascend"}


def require_npu() -> None:
    """Import torch_npu (it registers the ``npu`` device) or raise naming the ``npu`` extra."""
    missing = [dist for module, dist in _NPU_MODULES.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingExtraError(" and ".join(missing), "npu")
    importlib.import_module("torch_npu")


class AscendVllmInferenceEngine(VllmInferenceEngine):
    """A ``vllm.LLM`` running on Ascend NPUs through vllm-ascend, as an ``InferenceEngine``.

    Args:
        llm: the engine, built with ``enable_sleep_mode=True`` and
            ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (or the external_launcher backend).
    """

    def __init__(self, llm: Any) -> None:
        require_npu()
        super().__init__(llm)
        if self.device.type != "npu":
            raise EngineError(f"AscendVllmInferenceEngine needs an engine on device 'npu', got {self.device}")
