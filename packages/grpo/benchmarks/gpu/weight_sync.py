"""Section (b): co-located weight sync, training layout -> rollout engine, against a copy of the same bytes.

megatron-core's TP-1 model (bf16 on CUDA) is resharded by `entrepot.resharding.Resharder` into the
inference layout and loaded into the HF rollout engine on the same device, as a co-located
megatron actor does every step, with ``verify`` off and on (every slice checksummed at both ends,
every layout conversion round-tripped). The torch engine's sync (`LocalResharder` to HF names,
views of the training parameters, no checksum) is timed too. The bound is one device-to-device
copy of the inference weights' bytes, measured in the same run.

The checksum itself (`entrepot.resharding._checksum`) is probed: the device its result lives on,
its agreement with the CPU's value, and its rate on one large tensor next to a copy of it.
"""

from __future__ import annotations

from typing import Any

import torch
from common import Shape, copy_baseline, grpo_internals, median, timed
from train_step import build_hf_model, build_megatron, megatron_world, release

from entrepot.resharding import LocalResharder, ParallelLayout, Resharder
from entrepot.resharding._checksum import checksum
from entrepot.resharding.adaptors import get_adaptor
from entrepot.resharding.engines.megatron import MegatronTrainingEngine
from entrepot.resharding.engines.torch import TorchTrainingEngine

ARCHITECTURE = "Qwen3ForCausalLM"


def _timed_sync(resharder: Any, train_engine: Any, engine: Any, device: torch.device, *, warmup: int,
                repeat: int) -> dict[str, Any]:  # fmt: skip
    """Median seconds of reshard + load (the resharded copy freed after each load, as the manager does)."""
    reshard_times: list[float] = []

    def sync() -> None:
        weights = resharder.reshard(train_engine.named_train_parameters())
        engine.load_weights(weights)
        del weights
        resharder.destroy_buffers()
        stats = getattr(resharder, "stats", None)
        if stats is not None:
            reshard_times.append(stats.seconds)

    times = timed(sync, device, warmup=warmup, repeat=repeat)
    return {"seconds": median(times), "times": times,
            "reshard_seconds": median(reshard_times[warmup:]) if reshard_times else None}  # fmt: skip


def _rollout_engine(shape: Shape, device: torch.device, dtype: torch.dtype) -> Any:
    module = build_hf_model(shape, device, dtype, packed=False).requires_grad_(False).eval()
    return grpo_internals()["HFRolloutEngine"](module)


def bench_weight_sync(shape: Shape, device: torch.device, *, warmup: int, repeat: int) -> dict[str, Any]:
    hf_config = shape.hf_config()
    adaptor = get_adaptor(ARCHITECTURE, hf_config)
    rows: list[dict[str, Any]] = []
    with megatron_world(device):
        ddp, optimizer = build_megatron(shape, device)
        dtype = next(ddp.parameters()).dtype
        train_engine = MegatronTrainingEngine([ddp])
        engine = _rollout_engine(shape, device, dtype)
        num_bytes = 0
        for verify in (False, True):
            resharder = Resharder(
                adaptor, train_engine.layout, ParallelLayout(tp=1), verify=verify, device=device
            )
            row = _timed_sync(resharder, train_engine, engine, device, warmup=warmup, repeat=repeat)
            num_bytes = resharder.stats.output_bytes
            rows.append({"path": f"megatron -> HF engine, Resharder verify={verify}", "verify": verify,
                         "bytes": num_bytes, **row})  # fmt: skip
        num_tensors = len(train_engine.named_train_parameters())
        del ddp, optimizer, train_engine
        release(device)
    trained = build_hf_model(shape, device, dtype)
    local = LocalResharder(adaptor, target="hf")
    row = _timed_sync(
        local, TorchTrainingEngine(trained, adaptor), engine, device, warmup=warmup, repeat=repeat
    )
    rows.append({"path": "torch -> HF engine, LocalResharder (views, no checksum)", "verify": False,
                 "bytes": num_bytes, **row})  # fmt: skip
    del trained, engine
    release(device)
    copy = copy_baseline(num_bytes, device)
    for row in rows:
        row["gb_per_s"] = row["bytes"] / row["seconds"] / 1e9
        row["fraction_of_copy"] = copy["seconds"] / row["seconds"]
    return {"dtype": str(dtype).removeprefix("torch."), "train_tensors": num_tensors, "copy": copy,
            "rows": rows, "checksum": checksum_probe(device, large=num_bytes // 4)}  # fmt: skip


def checksum_probe(device: torch.device, *, large: int) -> dict[str, Any]:
    """Where the checksum runs, whether it matches the CPU's value, its rate and its cost per call.

    `large`: bytes of the tensor the rate is measured on (bf16 words).
    """
    gen = torch.Generator().manual_seed(3)
    sample = torch.randn(2**20 + 17, generator=gen).to(torch.bfloat16)
    on_device = checksum(sample.to(device))
    big = torch.randn(max(large // 2, 1024), generator=gen).to(device, torch.bfloat16)
    big_seconds = median(timed(lambda: checksum(big), device, warmup=2, repeat=5))
    small = torch.randn(1024, 1024, generator=gen).to(device, torch.bfloat16)
    small_seconds = median(timed(lambda: checksum(small), device, warmup=3, repeat=20))
    copy = copy_baseline(big.numel() * 2, device)
    return {
        "result_device": on_device.device.type, "matches_cpu": int(on_device) == int(checksum(sample)),
        "bytes": big.numel() * 2, "seconds": big_seconds, "gb_per_s": big.numel() * 2 / big_seconds / 1e9,
        "copy_gb_per_s": copy["gb_per_s"], "seconds_per_call_2mib": small_seconds,
    }  # fmt: skip
