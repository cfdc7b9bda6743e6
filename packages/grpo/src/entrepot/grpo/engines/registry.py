"""The engine seam: `engine.train` and `engine.rollout` name an entry of these registries, read here once.

A `TrainEngineSpec` builds one actor rank's training side (the trainer, its rollout engine and the
`ShardingManager` between them) and says what the rest of the run must know of it: whether it shards
the weights (TP / PP: a checkpoint then also holds a whole-model HF export), which optional module it
needs. A `RolloutEngineSpec` builds the rollout engine from the policy module. Workers, the memory
estimate and preflight ask a spec; nothing else compares engine names.

The torch rollout engine takes the architecture into account (`TORCH_ROLLOUT_KINDS`): GPT-2 gets the
embedded engine (its own KV-cache decoder, `rollout_embedded`), Llama / Qwen2 / Qwen3 the Llama-family
KV-cache decoder (`rollout_llama`), every other architecture HF `generate` (`rollout_hf`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from entrepot.grpo.engines.specs import (
    EngineChoice,
    RolloutEngineSpec,
    RolloutKind,
    TrainEngineSpec,
    TrainSide,
)

if TYPE_CHECKING:
    from entrepot.grpo.config import EngineConfig

__all__ = [
    "ROLLOUT_ENGINES",
    "TORCH_ROLLOUT_KINDS",
    "TRAIN_ENGINES",
    "EngineChoice",
    "RolloutEngineSpec",
    "RolloutKind",
    "TrainEngineSpec",
    "choose_engines",
    "rollout_description",
    "rollout_kind",
]


def _build_torch(*args: Any) -> TrainSide:
    from entrepot.grpo.engines.train_torch import build_torch_side

    return build_torch_side(*args)


def _start_torch(config: Any, rank: int, world_size: int, model_parallel: int, dist_init: str) -> None:
    """Data-parallel ranks share one process group (the update sums gradients over it)."""
    if world_size > 1:
        from entrepot.grpo.algo.update import process_group_backend
        from entrepot.grpo.engines.rendezvous import join_world

        join_world(process_group_backend(config.engine.device), dist_init, rank, world_size)


def _start_megatron(config: Any, rank: int, world_size: int, model_parallel: int, dist_init: str) -> Any:
    """The process group and megatron's parallel state; the TP x PP group when it has several ranks."""
    from megatron.core import parallel_state as mpu

    from entrepot.grpo.engines.megatron import init_model_parallel

    init_model_parallel(config.parallel.train, config.engine.device, config.seed, rank, world_size, dist_init)
    return mpu.get_model_parallel_group() if model_parallel > 1 else None


def _build_megatron(*args: Any) -> TrainSide:
    from entrepot.grpo.engines.megatron.side import build_megatron_side

    return build_megatron_side(*args)


TORCH_ROLLOUT_KINDS: dict[str, RolloutKind] = {
    "GPT2LMHeadModel": "gpt2",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "llama",
}
"""The torch rollout engine of each architecture with a KV-cache decoder of ours (others: "hf")."""


def _torch_kind(architecture: str) -> RolloutKind:
    return TORCH_ROLLOUT_KINDS.get(architecture, "hf")


def _build_gpt2(config: Any, model: Any, copy_module: bool, lanes: int) -> tuple[Any, str]:
    import torch

    from entrepot.grpo.engines.rollout_dtype import resolved_rollout_dtype
    from entrepot.grpo.engines.rollout_embedded import build_embedded_engine

    dtype = getattr(torch, resolved_rollout_dtype(config))
    return build_embedded_engine(config.engine, model, lanes, dtype), "infer"


def _build_llama(config: Any, model: Any, copy_module: bool, lanes: int) -> tuple[Any, str]:
    from entrepot.grpo.engines.rollout_llama import build_llama_engine

    return build_llama_engine(config, model, copy_module, lanes)


def _build_hf(config: Any, model: Any, copy_module: bool, lanes: int) -> tuple[Any, str]:
    from entrepot.grpo.engines.rollout_hf import build_hf_engine

    return build_hf_engine(config.engine, model, copy_module), "hf"


_TORCH_BUILDERS = {"gpt2": _build_gpt2, "llama": _build_llama, "hf": _build_hf}


def _build_torch_rollout(
    config: Any, model: Any, run_dir: Any, copy_module: bool, lanes: int
) -> tuple[Any, str]:
    builder = _TORCH_BUILDERS[rollout_kind(config.engine, _architecture(model))]
    return builder(config, model, copy_module, lanes)


def _build_vllm_rollout(
    config: Any, model: Any, run_dir: Any, copy_module: bool, lanes: int
) -> tuple[Any, str]:
    from entrepot.grpo.engines.rollout_vllm import build_vllm_engine

    return build_vllm_engine(config, model, run_dir), "infer"


def _architecture(model: Any) -> str:
    from entrepot.grpo.embedded.gpt2_model import hf_architecture

    return hf_architecture(model)


TRAIN_ENGINES: dict[str, TrainEngineSpec] = {
    "torch": TrainEngineSpec(
        name="torch", build=_build_torch, start=_start_torch, shards_weights=False, lanes=True
    ),
    "megatron": TrainEngineSpec(
        name="megatron",
        build=_build_megatron,
        start=_start_megatron,
        shards_weights=True,
        module="megatron.core",
        extra="megatron",
    ),
}

ROLLOUT_ENGINES: dict[str, RolloutEngineSpec] = {
    "torch": RolloutEngineSpec(
        name="torch",
        kind=_torch_kind,
        build=_build_torch_rollout,
    ),
    "hf": RolloutEngineSpec(name="hf", kind=lambda architecture: "hf", build=_build_torch_rollout),
    "vllm": RolloutEngineSpec(
        name="vllm",
        kind=lambda architecture: "vllm",
        build=_build_vllm_rollout,
        separate_kernels=True,
        module="vllm",
        extra="vllm",
    ),
}


def choose_engines(engine: EngineConfig) -> EngineChoice:
    """The specs `engine.train` and `engine.rollout` name (the config already refused other names)."""
    return EngineChoice(TRAIN_ENGINES[engine.train], ROLLOUT_ENGINES[engine.rollout])


def rollout_kind(engine: EngineConfig, architecture: str) -> RolloutKind:
    """Which rollout engine a policy of `architecture` gets under `engine.rollout`."""
    return ROLLOUT_ENGINES[engine.rollout].kind(architecture)


_DESCRIPTIONS: dict[RolloutKind, str] = {
    "gpt2": "embedded GPT-2 kv-cache ({})",
    "llama": "llama kv-cache ({})",
    "hf": "HF generate (fallback for {})",
    "vllm": "vLLM ({})",
}


def rollout_description(engine: EngineConfig, architecture: str, dtype: str = "float32") -> str:
    """The start-up line naming the rollout engine a policy of `architecture` gets, and its `dtype`
    where it is a KV-cache engine of ours (`engine.rollout_dtype` resolved)."""
    kind = rollout_kind(engine, architecture)
    line = "rollout engine: " + _DESCRIPTIONS[kind].format(architecture)
    if kind in ("gpt2", "llama"):
        chosen = " (engine.rollout_dtype: auto)" if engine.rollout_dtype == "auto" else ""
        line += f", {dtype}{chosen}"
    return line
