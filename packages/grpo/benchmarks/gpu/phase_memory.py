"""Section (c): peak device and host memory of each phase of a co-located GRPO step, offload on and off.

One actor rank of the torch engine (bf16 HF Qwen3, fp32 masters and AdamW moments, a frozen
reference, an HF rollout engine) runs the phases of a step through entrepot.resharding's
`ShardingManager`: rollout (reshard into the engine, generate), reference log-probs, old log-probs,
update. "offload on" sets every offload key of a co-located actor: engine.offload_params,
offload_grads, offload_optimizer (the manager's `Offloader`) and offload_reference (the reference's
own `Offloader`); there is no reward model here, so offload_reward_models has nothing to move.

The step runs twice and the second (steady-state: pinned host buffers and optimizer state exist)
is reported. Device peaks are the allocator's; host figures are the process's resident set (peak
reset before each phase where Linux allows it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from common import (
    PackedBatch,
    Shape,
    device_peak_bytes,
    device_peak_reset,
    grpo_internals,
    host_bytes,
    host_peak_reset,
)
from train_step import LR, MasterAdamW, build_hf_model, hf_logp, torch_train_step

from entrepot.resharding import LocalResharder, Offloader, ShardingManager
from entrepot.resharding.adaptors import get_adaptor
from entrepot.resharding.engines.torch import TorchTrainingEngine

PHASES = ("rollout", "reference", "old_logp", "update")


@contextlib.contextmanager
def _resident(offloader: Offloader | None) -> Iterator[None]:
    """The reference on the device inside the block when it is offloaded outside it."""
    if offloader is None:
        yield
        return
    offloader.onload_params()
    try:
        yield
    finally:
        offloader.offload_params()


def _in_mode(
    manager: ShardingManager, mode: str, body: Callable[[], object], device: torch.device
) -> int | None:
    """Run `body` in `mode`; the device peak over entering, the body and leaving.

    The manager resets the allocator's peak at the start of each transition (its own records), so
    the peak is read before leaving and combined with the leaving transition's record.
    """
    getattr(manager, f"enter_{mode}_mode")()
    body()
    inside = device_peak_bytes(device)
    leaving = getattr(manager, f"exit_{mode}_mode")()
    return None if inside is None else max(inside, leaving.peak_bytes)


def _measure(device: torch.device, run: Callable[[], int | None]) -> dict[str, Any]:
    device_peak_reset(device)
    host_peak_reset()
    peak = run()
    peak = device_peak_bytes(device) if peak is None else peak
    return {"device_peak": peak, **{f"host_{k}": v for k, v in host_bytes().items()}}


def bench_phase_memory(shape: Shape, batch: PackedBatch, device: torch.device, *, offload: bool,
                       num_prompts: int, new_tokens: int) -> dict[str, Any]:  # fmt: skip
    internals = grpo_internals()
    dtype = torch.bfloat16
    model = build_hf_model(shape, device, dtype)
    optimizer = MasterAdamW(list(model.parameters()), LR)
    reference = build_hf_model(shape, device, dtype).requires_grad_(False).eval()
    reference.load_state_dict(model.state_dict())
    reference_offloader = Offloader(list(reference.parameters())) if offload else None
    if reference_offloader is not None:
        reference_offloader.offload_params()
    engine = internals["HFRolloutEngine"](
        build_hf_model(shape, device, dtype, packed=False).requires_grad_(False).eval()
    )
    adaptor = get_adaptor("Qwen3ForCausalLM", model.config)
    manager = ShardingManager(
        TorchTrainingEngine(model, adaptor), engine, LocalResharder(adaptor, target="hf"),
        Offloader(list(model.parameters()), optimizer) if offload else None,
        offload_train_params=offload, offload_grads=offload, offload_optimizer=offload,
    )  # fmt: skip
    sampling = internals["SamplingParams"](temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
                                           stop_token_ids=())  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, shape.vocab, (shape.prompt,), generator=gen) for _ in range(num_prompts)]

    def rollout() -> int | None:
        return _in_mode(manager, "infer", lambda: engine.generate(prompts, sampling, pad_token_id=0), device)

    def reference_logp() -> None:
        with _resident(reference_offloader), torch.no_grad():
            hf_logp(reference, batch)

    def old_logp() -> int | None:
        with torch.no_grad():
            return _in_mode(manager, "forward", lambda: hf_logp(model, batch), device)

    def update() -> int | None:
        return _in_mode(manager, "train", lambda: torch_train_step(model, optimizer, batch), device)

    steps = dict(zip(PHASES, (rollout, reference_logp, old_logp, update), strict=True))
    phases: dict[str, Any] = {}
    for _ in range(2):
        phases = {name: _measure(device, run) for name, run in steps.items()}
    idle = {"device": torch.cuda.memory_allocated(device) if device.type == "cuda" else None,
            "host_rss": host_bytes()["rss"]}  # fmt: skip
    return {"offload": offload, "phases": phases, "idle_after_step": idle,
            "host_peak_reset": host_peak_reset()}  # fmt: skip
