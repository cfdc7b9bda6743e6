"""megatron-core on CPU: the supported CPU mode of the megatron adapter (gloo collectives, fp32).

megatron-core 0.16 assumes a GPU in a handful of places, none of which changes the arithmetic:

- ``torch.cuda.current_device()`` used as a device, ``torch.cuda.synchronize()``;
- the CUDA RNG state that its RNG tracker saves and restores around TP-sharded initialisation
  and dropout (``tensor_parallel.random``), and ``torch.cuda.manual_seed``;
- tensor factories called with ``device="cuda"`` (pipeline p2p buffers, DDP grad buffers, the
  gradient-norm accumulators of the optimizer) and ``tensor.cuda()``;
- the optimizer's gradient clipping asserts ``grad.type() == "torch.cuda.FloatTensor"``: on CPU
  the same scaling (``max_norm / (total_norm + 1e-6)`` when below 1) runs without that assert.

``enable_cpu_mode()`` points each of these at its CPU equivalent. The patches are process-wide, so
it is applied only when the training device is the CPU (``enable_cpu_mode("cuda")`` does
nothing), only for the megatron-core release whose call sites were checked (0.16.x; another
version is refused with a clear message), and once per process. Call it before building models.
The same training code then runs with gloo on CPU and NCCL on GPU.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._device

from entrepot.resharding.errors import EngineError, MissingExtraError

__all__ = ["SUPPORTED_MEGATRON", "enable_cpu_mode", "megatron_version"]

SUPPORTED_MEGATRON = "0.16"  # the release series whose CUDA-only call sites are handled below

_FACTORIES = (
    "empty", "zeros", "ones", "full", "arange", "tensor", "randn", "rand", "randint",
    "empty_like", "zeros_like", "ones_like",
)  # fmt: skip
_ENABLED_FLAG = "_entrepot_megatron_cpu_mode"


def megatron_version() -> str:
    """The installed megatron-core version (``MissingExtraError`` when it is not installed)."""
    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError as exc:
        raise MissingExtraError("megatron-core", "megatron") from exc


def _cuda_to_cpu(factory: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(factory)
    def on_cpu(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return on_cpu


def enable_cpu_mode(device: torch.device | str = "cpu") -> bool:
    """Make megatron-core run on the CPU of this process; True when the CPU mode is (now) on.

    Args:
        device: the training device; anything but a CPU leaves megatron-core untouched.

    Raises:
        MissingExtraError: megatron-core is not installed.
        EngineError: megatron-core is another release than the one this mode was checked on, or
            a CUDA device is visible (the mode would hide it from megatron-core).
    """
    if torch.device(device).type != "cpu":
        return False
    if getattr(torch.cuda, _ENABLED_FLAG, False):
        return True
    version = megatron_version()
    if not version.startswith(SUPPORTED_MEGATRON + "."):
        raise EngineError(
            f"the CPU mode of entrepot's megatron adapter supports megatron-core {SUPPORTED_MEGATRON}.x, "
            f"found {version}; install megatron-core>={SUPPORTED_MEGATRON}.1,<0.17 or train on a GPU"
        )
    if torch.cuda.is_available():
        raise EngineError(
            f"enable_cpu_mode({str(device)!r}) but CUDA is available: the CPU mode would hide the GPU "
            "from megatron-core; train on the GPU instead"
        )
    _patch_torch()
    _patch_megatron_rng()
    _patch_megatron_clip()
    setattr(torch.cuda, _ENABLED_FLAG, True)
    return True


def _patch_torch() -> None:
    # the CPU generator stands in for the GPU's (torch.manual_seed itself calls manual_seed_all)
    cuda_calls: dict[str, Callable[..., Any]] = {
        "current_device": lambda: torch.device("cpu"),
        "synchronize": lambda *args, **kwargs: None,
        "manual_seed": lambda seed: torch.default_generator.manual_seed(seed),
        "manual_seed_all": lambda seed: None,
        "get_rng_state": lambda device=None: torch.get_rng_state(),
        "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
    }
    for name, replacement in cuda_calls.items():
        setattr(torch.cuda, name, replacement)
    setattr(torch.cuda.random, "get_rng_state", cuda_calls["get_rng_state"])  # noqa: B010
    setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)  # noqa: B010
    # `with torch.device(...)` recognises factories by identity, in a set built (and cached) at its
    # first use: built after the patch it would hold the wrappers, and transformers' meta-device
    # `from_pretrained` would then leave RoPE's `inv_freq` buffer uninitialised (garbage rotations).
    torch.utils._device._device_constructors()
    for name in _FACTORIES:
        setattr(torch, name, _cuda_to_cpu(getattr(torch, name)))


def _patch_megatron_rng() -> None:
    """The RNG tracker swaps CUDA generator states; on CPU it swaps the CPU generator's."""
    import megatron.core.tensor_parallel.random as megatron_random

    megatron_random._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: (
        torch.get_rng_state()
    )
    megatron_random._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(
        new_state
    )


def _clip_grad_by_total_norm(parameters: Any, max_norm: float, total_norm: float,
                             use_decoupled_grad: bool = False) -> None:  # fmt: skip
    """megatron-core's ``clip_grad_by_total_norm_fp32`` minus its CUDA-type assert (same arithmetic)."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr) for p in params if getattr(p, attr, None) is not None]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0 and grads:
        torch._foreach_mul_([g.detach() for g in grads], clip_coeff)


def _patch_megatron_clip() -> None:
    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.optimizer as optimizer

    clip_grads.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm
    optimizer.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm
