"""Engine adapters: plain torch (always), megatron-core, vLLM and vllm-ascend (optional extras).

Only the plain-torch engines are imported here; the others live in their own modules
(``entrepot.resharding.engines.megatron`` / ``.vllm`` / ``.npu``) and raise
``MissingExtraError`` naming the extra to install when their dependency is missing.
"""

from entrepot.resharding.engines.torch import TorchInferenceEngine, TorchTrainingEngine, copy_weights_in_place

__all__ = ["TorchInferenceEngine", "TorchTrainingEngine", "copy_weights_in_place"]
