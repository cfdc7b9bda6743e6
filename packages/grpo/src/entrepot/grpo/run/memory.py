"""What one actor rank holds in memory: weights, gradients, optimizer state, reference, reward models,
rollout copy, KV.

`estimate_memory(config)` answers from the config alone. The policy is instantiated on the meta
device (shapes, no storage), so the parameter count is exact, the training shard of a rank is the
one the resharding adaptor cuts for `parallel.train`'s TP / PP, and the copy the train -> rollout
resharding allocates is found the way `ShardingManager` finds it (storages that alias no parameter).
Every engine here computes in float32: 4 bytes a value (`model.reference_dtype: bfloat16` halves the
reference, `engine.rollout_dtype: bfloat16` the torch rollout engine's own weights and KV cache).

The peak is that of the train -> rollout switch (`ShardingManager.enter_infer_mode`) and of the
generation that follows, taken at its three fullest moments (per rank, on the rank's device):

    reshard   params, grads, optimizer, reference, resharded copy and scratch
              (+ the rollout weights an idle engine keeps on a CPU device)
    load      the same without the scratch (freed when the resharding ends), plus the rollout
              engine's weights; with engine.offload_params the params leave before the load,
              or after it when the copy aliases them
    generate  params, grads, optimizer, reference, rollout weights, KV cache

and that of the update (torch engine): params, grads (one set more per extra compute lane, held until
the lanes' sets are summed), optimizer, the resident reference and idle rollout weights, plus the
largest micro-batch's activations and LM-head logits
(`entrepot.grpo.run.activations`); and a checkpoint's, whose `capture_state` copies params,
reference and optimizer state into host memory before writing them (on CPU only when an
`engine.offload_*` key empties them after the capture; else it writes them as they are). On
engine.device=cpu every moment also counts the process's own runtime (`CPU_RUNTIME_BYTES`: Python,
torch, transformers, the tokenizer). The CPU allocator keeps what the update freed for reuse, so
later moments of a measured run sit somewhat above their figures here (BENCHMARKS.md: within 20% on
SmolLM2-135M).

`engine.offload_params`, `offload_optimizer`, `offload_reference` and `offload_reward_models` keep
theirs in host memory meanwhile and `offload_grads` drops the gradients (the next update starts from
zero). With `resources.colocate: false` the reference and the reward models are on their own workers:
an actor rank holds neither. On engine.device=cpu host memory is the device: offloading there moves
bytes without freeing any.

Left out: megatron's activations, the logits of log-prob passes and of generation, the CUDA context
and allocator slack, vLLM's own workspace and vocabulary padding, megatron's gradient-buffer padding,
and on accelerators each worker process's own runtime.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from entrepot.grpo.config import (
    EngineConfig,
    GRPOConfig,
    RewardConfig,
    TrainParallelConfig,
)
from entrepot.grpo.engines.registry import RolloutKind, choose_engines, rollout_kind
from entrepot.grpo.engines.rollout_dtype import resolved_rollout_dtype
from entrepot.grpo.engines.rollout_vllm import vllm_kv_cache_bytes
from entrepot.grpo.errors import DataError
from entrepot.grpo.run.activations import UpdateWorkingSet, update_lanes, update_working_set
from entrepot.grpo.run.kv_cache import rollout_kv_cache

__all__ = ["MemoryEstimate", "estimate_memory", "vllm_kv_cache_bytes"]

FLOAT32_BYTES = 4
ADAM_MOMENTS = 2  # AdamW keeps exp_avg and exp_avg_sq per trained value (torch and megatron alike)
# RSS of a CPU worker before its model: Python, torch, transformers, entrepot, the tokenizer (measured
# at about 350 MiB with SmolLM2's tokenizer; 400 MiB leaves room for the dock and the reward worker)
CPU_RUNTIME_BYTES = 400 * 2**20
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}  # per value, model.reference_dtype / engine.rollout_dtype


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one actor rank holds, per item, and at each moment of the train -> rollout switch.

    Attributes:
        num_params: parameters of the whole policy (exact; tied embeddings counted once).
        num_ranks: actor ranks, resources.num_actor_workers x parallel.train.tensor x pipeline.
        device: engine.device.
        params: training parameters of the largest rank (its TP / PP shard; the whole model with
            engine.train=torch).
        grads: their gradients (megatron: its float32 gradient buffer).
        optimizer: AdamW's two moments per trained value.
        reference: the frozen reference copy (0 when algorithm.kl_coef is 0, or on its own workers).
        reward_models: the co-located reward models of `reward.models` (0 on their own workers).
        rollout_weights: the rollout engine's own copy of the weights (whole model; the slice of a
            tensor-parallel vLLM).
        resharded_copy: what the train -> rollout resharding allocates for its output (megatron:
            the whole model; torch: the tensors the layout conversion cannot hand over as views of
            the parameters).
        reshard_scratch: the megatron resharder's scratch, an upper bound: its rounds are packed
            under engine.reshard_bucket_mb (0 with engine.train=torch).
        kv_cache: the rollout engine's KV cache at its largest.
        kv_cache_basis: how `kv_cache` was sized.
        activations: what the update's forward keeps for its backward pass (torch engine; 0 megatron).
        logits: the update's LM-head working set (chunked, or the whole [R, V]).
        activations_basis: how `activations` and `logits` were counted.
        runtime: the process's own memory (engine.device=cpu; 0 on accelerators).
        stages: moment (the switch's three, and the update) -> (bytes on the device, bytes kept in
            host memory).
        lane_grads: the gradient sets the update's extra compute lanes hold until they are summed
            into `grads` (`threads.lanes` - 1 of them on a CPU run in one process; `embedded.lanes`).
    """

    num_params: int
    num_ranks: int
    device: str
    params: int
    grads: int
    optimizer: int
    reference: int
    reward_models: int
    rollout_weights: int
    resharded_copy: int
    reshard_scratch: int
    kv_cache: int
    kv_cache_basis: str
    activations: int
    logits: int
    activations_basis: str
    runtime: int
    stages: Mapping[str, tuple[int, int]]
    lane_grads: int = 0

    @property
    def on_cpu(self) -> bool:
        """Whether the ranks compute in host memory (engine.device=cpu)."""
        return self.device.split(":")[0] == "cpu"

    @property
    def peak_stage(self) -> str:
        """The fullest moment: most device bytes (on CPU, device plus host: they are one memory)."""
        return max(self.stages, key=lambda s: sum(self.stages[s]) if self.on_cpu else self.stages[s][0])

    @property
    def peak_bytes(self) -> int:
        """Bytes on one rank's device at the peak."""
        return self.stages[self.peak_stage][0]

    @property
    def offloaded_bytes(self) -> int:
        """Bytes one rank keeps in host memory at the peak (its offloaded state)."""
        return self.stages[self.peak_stage][1]

    @property
    def host_need_bytes(self) -> int:
        """Host memory all ranks need at the peak: everything on CPU, the offloaded state otherwise."""
        per_rank = self.peak_bytes + self.offloaded_bytes if self.on_cpu else self.offloaded_bytes
        return per_rank * self.num_ranks


def estimate_memory(config: GRPOConfig) -> MemoryEstimate:
    """Bytes per actor rank of `config`'s policy, optimizer, reference, rollout engine and KV cache.

    Builds nothing but a meta-device model (no weights are allocated or read). See the module
    docstring for what is left out.

    Raises:
        DataError: model.path is not a local HF model directory, or a file task has no model.path.
        UnknownArchitectureError: the model has no weight adaptor (it could not be trained either).
        RewardModelError: a directory of reward.models is not a reward model.
    """
    from entrepot.resharding.adaptors import get_adaptor

    model = _policy_on_meta(config)
    adaptor = get_adaptor(type(model).__name__, model.config)
    hf_state = {name: p.detach() for name, p in model.named_parameters(remove_duplicate=False)}
    train_state = adaptor.hf_to_train(hf_state)
    engines = choose_engines(config.engine)
    kind = rollout_kind(config.engine, type(model).__name__)
    train = config.parallel.train
    num_ranks = config.resources.num_actor_workers * train.model_parallel
    sharded = engines.train.shards_weights  # TP / PP shards, a bucketed Resharder with its scratch
    params = _nbytes(_rank_shard(train, sharded, adaptor, train_state).values())
    # the Llama-family engine reads a torch policy's own parameters (`rollout_llama.can_read_policy`)
    # (in its dtype: a bfloat16 rollout keeps a copy of its own, as the embedded GPT-2 engine does)
    rollout_dtype = resolved_rollout_dtype(config)
    rollout_bytes = _DTYPE_BYTES[rollout_dtype] if kind in ("gpt2", "llama") else FLOAT32_BYTES
    reads_policy = kind == "llama" and not (
        sharded or config.model.lora.enabled or config.engine.offload_params or rollout_bytes != FLOAT32_BYTES
    )
    copy, aliases = (
        (0, True)
        if reads_policy
        else _resharded_copy(sharded, adaptor, train_state, kind, model.parameters())
    )
    sections = (config.data, config.rollout, config.eval)
    kv_cache, basis = rollout_kv_cache(
        *sections, model.config, kind, num_ranks, config.multiturn, rollout_bytes
    )
    if sharded:
        working = UpdateWorkingSet(0, 0, "megatron's activations are not counted")
    else:
        working = update_working_set(config, model.config, type(model).__name__, num_ranks)
    reference = params if config.algorithm.kl_coef > 0 and config.resources.colocate else 0
    if not sharded:  # the torch engine casts its reference to model.reference_dtype
        reference = reference * _DTYPE_BYTES[config.model.reference_dtype] // FLOAT32_BYTES
    estimate = MemoryEstimate(
        num_params=sum(p.numel() for p in model.parameters()),
        num_ranks=num_ranks,
        device=config.engine.device,
        params=params,
        grads=params,
        optimizer=ADAM_MOMENTS * params,
        reference=reference,
        reward_models=_reward_model_bytes(config.reward) if config.resources.colocate else 0,
        rollout_weights=0
        if reads_policy
        else _rollout_weights(config.parallel.infer.tensor, adaptor, train_state, kind)
        * rollout_bytes
        // FLOAT32_BYTES,
        resharded_copy=copy,
        reshard_scratch=config.engine.reshard_bucket_mb * 2**20 if sharded else 0,
        kv_cache=kv_cache,
        kv_cache_basis=basis,
        activations=working.activations,
        logits=working.logits,
        activations_basis=working.basis,
        runtime=CPU_RUNTIME_BYTES if config.engine.device.split(":")[0] == "cpu" else 0,
        stages={},
        lane_grads=0 if sharded else (update_lanes(config) - 1) * params,
    )
    return _with_stages(estimate, config.engine, kind, params_leave_after_load=aliases)


def _reward_model_bytes(reward: RewardConfig) -> int:
    """Float32 bytes of every reward model, from its config.json on the meta device (nothing is read)."""
    from transformers import AutoConfig, AutoModel

    from entrepot.grpo.engines.reward_model import reward_model_kind

    total = 0
    for path in reward.models:
        kind = reward_model_kind(path)  # a RewardModelError naming the directory if it is none
        hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
        with torch.device("meta"):
            backbone = AutoModel.from_config(hf_config, dtype=torch.float32)
        hidden = int(getattr(hf_config, "hidden_size", 0))
        # the scoring head: HF classifiers' `score` has no bias, TRL's value head has one
        head = hidden + (1 if kind == "value_head" else 0)
        total += _nbytes(backbone.parameters()) + head * FLOAT32_BYTES
    return total


def _policy_on_meta(config: GRPOConfig) -> torch.nn.Module:
    """The policy's HF module on the meta device: built from `model`, or from model.path's config.json."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if config.model.path is None:
        from entrepot.grpo.data.sources import build_task
        from entrepot.grpo.engines.models import build_hf_config

        tok = build_task(config).tokenizer  # the vocabulary the trainer builds the decoder with
        hf_config = build_hf_config(
            config.model, tok.vocab_size, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
        )
    else:
        directory = Path(config.model.path)
        if not (directory / "config.json").is_file():
            raise DataError(
                f"model.path ({str(directory)!r}) must be a local HF model directory with config.json"
            )
        hf_config = AutoConfig.from_pretrained(directory, local_files_only=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)


def _rank_shard(
    train: TrainParallelConfig, sharded: bool, adaptor: Any, train_state: Mapping[str, torch.Tensor]
) -> dict[str, Any]:
    """Training-layout tensors of the largest rank (the whole model unless the engine shards it)."""
    from entrepot.resharding import ParallelLayout

    if not sharded:
        return dict(train_state)
    vpp = train.virtual_pipeline if train.pipeline > 1 else None
    layout = ParallelLayout(tp=train.tensor, pp=train.pipeline, vpp=vpp)
    shards = [adaptor.shard(train_state, layout, tp_rank=0, pp_rank=p) for p in range(train.pipeline)]
    if train.pipeline > 1 and adaptor.dims.tie_word_embeddings:
        # megatron's last stage trains its own copy of the tied output layer
        embedding = shards[0]["embedding.word_embeddings.weight"]
        shards[-1] = {**shards[-1], "output_layer.weight": embedding}
    return max(shards, key=lambda shard: _nbytes(shard.values()))


def _resharded_copy(
    sharded: bool, adaptor: Any, train_state: Mapping[str, torch.Tensor], kind: RolloutKind,
    parameters: Iterable[torch.Tensor],
) -> tuple[int, bool]:  # fmt: skip
    """Bytes the train -> rollout resharding allocates, and whether its output aliases parameters."""
    if sharded:  # `Resharder`: the whole model in a buffer of its own
        return _nbytes(adaptor.train_to_infer(train_state).values()), False
    from entrepot.resharding import LocalResharder

    weights = LocalResharder(adaptor, "hf" if kind in ("hf", "llama") else "infer").reshard(train_state)
    params = {_storage_id(p) for p in parameters}
    unique = {_storage_id(t): t for t in weights.values()}
    fresh = [t for key, t in unique.items() if key not in params]
    return sum(t.untyped_storage().nbytes() for t in fresh), len(fresh) < len(unique)


def _rollout_weights(
    tensor: int, adaptor: Any, train_state: Mapping[str, torch.Tensor], kind: RolloutKind
) -> int:
    """Bytes of the rollout engine's weights: the whole model, or a `tensor`-parallel vLLM's slice."""
    if kind == "vllm" and tensor > 1:
        from entrepot.resharding import ParallelLayout

        return _nbytes(adaptor.shard(train_state, ParallelLayout(tp=tensor)).values())
    return _nbytes(train_state.values())


def _with_stages(
    estimate: MemoryEstimate, flags: EngineConfig, kind: RolloutKind, *, params_leave_after_load: bool
) -> MemoryEstimate:
    """`estimate` with the (device, host) bytes of each moment of the switch (see the module docstring);
    `flags`: the engine section's offload keys."""
    e = estimate
    on_host = [  # offloaded state stays in host memory (the gradients are dropped instead)
        e.optimizer if flags.offload_optimizer else 0,
        e.reference if flags.reference_offloaded else 0,
        e.reward_models if flags.reward_models_offloaded else 0,
    ]
    resident = [
        0 if flags.offload_grads else e.grads,
        0 if flags.offload_optimizer else e.optimizer,
        0 if flags.reference_offloaded else e.reference,
        0 if flags.reward_models_offloaded else e.reward_models,
    ]
    idle_device, idle_host = _idle_rollout_weights(e, kind)
    params_in_load = e.params if not flags.offload_params or params_leave_after_load else 0
    params_gone = 0 if flags.offload_params else e.params
    reference_leaves = flags.reference_offloaded and e.reference > 0
    emptied = flags.offload_params or flags.offload_optimizer or reference_leaves
    copied = not e.on_cpu or emptied  # what `capture_state` copies (on CPU: what offloading empties)
    stages = {
        "reshard": (
            e.params + sum(resident) + e.resharded_copy + e.reshard_scratch + idle_device,
            sum(on_host) + idle_host,
        ),
        "load": (
            params_in_load + sum(resident) + e.resharded_copy + e.rollout_weights,
            sum(on_host) + e.params - params_in_load,
        ),
        "generate": (
            params_gone + sum(resident) + e.rollout_weights + e.kv_cache,
            sum(on_host) + e.params - params_gone,
        ),
        "update": (  # everything the update trains with is back; the reference waits as between stages
            e.params
            + e.grads
            + e.lane_grads
            + e.optimizer
            + resident[2]
            + resident[3]
            + idle_device
            + e.activations
            + e.logits,
            on_host[1] + on_host[2] + idle_host,
        ),
        # a checkpoint's `capture_state` copies params, reference and optimizer state to host memory
        # (host tensors that nothing offloads after the capture are written as they are)
        "checkpoint": (
            e.params + sum(resident) + idle_device,
            sum(on_host) + idle_host + (e.params + e.reference + e.optimizer if copied else 0),
        ),
    }
    stages = {name: (device + e.runtime, host) for name, (device, host) in stages.items()}
    return replace(e, stages=stages)


def _idle_rollout_weights(estimate: MemoryEstimate, kind: RolloutKind) -> tuple[int, int]:
    """(device, host) bytes of the rollout weights between rollouts.

    vLLM sleeps on an accelerator (weights dropped) and keeps its packed weights on CPU; the embedded
    GPT-2 engine and the Llama-family engine's own copy move to host memory (on CPU: stay); the HF
    engine drops them; a Llama-family engine reading the policy holds none.
    """
    if kind == "hf":
        return 0, 0
    if estimate.on_cpu:
        return estimate.rollout_weights, 0
    return (0, estimate.rollout_weights) if kind == "gpt2" else (0, 0)


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _storage_id(tensor: torch.Tensor) -> int:
    # meta storages have no address (data_ptr 0); the storage object's pointer tells them apart
    return int(tensor.untyped_storage()._cdata)
