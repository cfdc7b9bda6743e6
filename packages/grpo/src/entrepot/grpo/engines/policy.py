"""The policy of one actor rank: training model, reference, optimizer, rollout engine and their switch.

`build_policy` is what an actor worker holds, and what the single-process baseline in benchmarks/
builds too, so both start from identical weights, engines and sampling streams.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from entrepot.grpo.algo.optim import build_optimizer
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data.sources import TaskSetup, build_task
from entrepot.grpo.embedded.gpt2_model import as_hf_config, hf_architecture
from entrepot.grpo.engines.models import build_model, load_pretrained
from entrepot.grpo.engines.rollout_embedded import GPT2RolloutEngine, SamplingParams

if TYPE_CHECKING:  # resharding is imported where a manager is built, as below
    from entrepot.resharding import OptimizerState

__all__ = [
    "Policy",
    "build_policy",
    "export_hf",
    "initial_model",
    "load_reference",
    "sampling_generator",
    "total_optimizer_steps",
]


@dataclass
class Policy:
    """Everything a co-located actor rank computes with.

    Attributes:
        trainer: the training engine (`TorchTrainer`, or `MegatronTrainer` for engine.train=megatron):
            model, reference, optimizer and LR schedule.
        setup: tokenizer and prompt source.
        engine: the rollout engine (own weights in the inference layout).
        manager: entrepot.resharding's ShardingManager joining the trainer and `engine` (infer /
            forward / train modes, resharding and offload).
        sampling: the rollout's sampling parameters.
        generator: the rollout's sampling stream (the same on every rank).
        hf_config: the policy's HF config (an HF export writes it).
    """

    trainer: Any
    setup: TaskSetup
    engine: Any
    manager: Any
    sampling: SamplingParams
    generator: torch.Generator
    hf_config: Any = None  # the HF config of the policy (what an HF export writes)

    @property
    def reshard_stats(self) -> Any:
        """The last resharding's `ReshardStats` (None with the local layout conversion)."""
        return getattr(self.manager.resharder, "stats", None)


def total_optimizer_steps(config: GRPOConfig) -> int:
    """Optimiser steps of the whole run (the cosine schedule's length)."""
    mini = config.algorithm.mini_batch_size or config.rollout.batch_size
    return config.max_steps * config.algorithm.epochs * max(1, config.rollout.batch_size // mini)


def sampling_generator(seed: int) -> torch.Generator:
    """The rollout sampling stream (fixed by the seed; the same on every rank)."""
    return torch.Generator().manual_seed(seed + 7919)


def initial_model(config: GRPOConfig) -> tuple[torch.nn.Module, TaskSetup]:
    """The policy's initial weights (built from the seed, or loaded from `model.path`) and the task.

    Every process that calls it gets identical weights: the actor ranks, and a separate reference
    worker anchored at the initial policy.
    """
    torch.manual_seed(config.seed)
    tokenizer = None
    if config.model.path is not None:
        model, tokenizer = load_pretrained(config.model.path)
    setup = build_task(config, tokenizer)
    tok = setup.tokenizer
    if config.model.path is None:
        model = build_model(config.model, tok.vocab_size, pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id)  # fmt: skip
    return model, setup


def load_reference(path: str | Path, policy: torch.nn.Module) -> torch.nn.Module:
    """The reference of `model.ref_model_load_path`; a `DataError` if its vocabulary is not the policy's."""
    from entrepot.grpo.errors import DataError

    reference, _ = load_pretrained(path, with_tokenizer=False, key="model.ref_model_load_path")
    ours, theirs = getattr(policy.config, "vocab_size", None), getattr(reference.config, "vocab_size", None)
    if ours != theirs:
        raise DataError(
            f"model.ref_model_load_path ({str(path)!r}) has a vocabulary of {theirs} tokens, the policy "
            f"{ours}: log-probs of one token id must mean the same token under both"
        )
    return reference


def build_policy(config: GRPOConfig, run_dir: str | Path | None = None) -> Policy:
    """Build (or load from `model.path`) the policy; every rank builds identical initial weights.

    With engine.train=megatron, megatron-core's parallel state must be initialised already
    (`entrepot.grpo.engines.megatron.init_model_parallel`). With engine.rollout=vllm the built default model
    is saved for vLLM as `run_dir`/rollout_model (a temporary directory when `run_dir` is None).
    The reference is co-located here unless `resources.colocate` is false (its own workers).
    """
    model, setup = initial_model(config)
    tok = setup.tokenizer
    sampling = SamplingParams(
        temperature=config.rollout.temperature, top_p=config.rollout.top_p, top_k=config.rollout.top_k,
        max_new_tokens=setup.max_new_tokens,
        stop_token_ids=(tok.eos_token_id,) if config.rollout.stop_on_eos else (),
    )  # fmt: skip
    generator = sampling_generator(config.seed)
    own_reference = None
    if config.model.ref_model_load_path is not None and config.resources.colocate:
        own_reference = load_reference(config.model.ref_model_load_path, model)
    if config.engine.train == "megatron":
        trainer, engine, manager = _megatron_policy(config, model, own_reference, run_dir)
    else:
        trainer, engine, manager = _torch_policy(config, model, own_reference, int(tok.pad_token_id), run_dir)
    return Policy(trainer, setup, engine, manager, sampling, generator, model.config)


def _torch_policy(
    config: GRPOConfig, model: torch.nn.Module, own_reference: torch.nn.Module | None, pad_token_id: int,
    run_dir: str | Path | None,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """The HF module trained in this process, and its rollout engine joined by a local layout conversion."""
    from entrepot.grpo.engines.train_torch import TorchTrainer
    from entrepot.resharding import LocalResharder
    from entrepot.resharding.adaptors import get_adaptor
    from entrepot.resharding.engines.torch import TorchTrainingEngine

    model.to(config.engine.device)
    reference = None
    if config.algorithm.kl_coef > 0 and config.resources.colocate:
        reference = own_reference if own_reference is not None else copy.deepcopy(model)
        reference = reference.to(config.engine.device).requires_grad_(False).eval()
    optimizer, scheduler = build_optimizer(model, config.algorithm, total_optimizer_steps(config))
    trainer = TorchTrainer(config, model, reference, optimizer, scheduler, pad_token_id)
    adaptor = get_adaptor(hf_architecture(model), model.config)
    engine, target = _rollout_engine(config, model, run_dir)
    manager = _manager(config, TorchTrainingEngine(model, adaptor), engine, LocalResharder(adaptor, target),
                       list(model.parameters()), optimizer)  # fmt: skip
    return trainer, engine, manager


def _megatron_policy(
    config: GRPOConfig, model: torch.nn.Module, own_reference: torch.nn.Module | None,
    run_dir: str | Path | None,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """megatron-core chunks of this rank, resharded every rollout into whole weights for the engine."""
    from entrepot.grpo.engines.megatron import MegatronTrainer
    from entrepot.resharding import ParallelLayout, Resharder

    trainer = MegatronTrainer(config, model, own_reference)
    # Whole weights on every rank: a tensor-parallel vLLM keeps its slice of each through its own
    # checkpoint loader (on CPU it repacks linear weights for its kernels, so shards cannot be copied in).
    resharder = Resharder(
        trainer.adaptor, trainer.train_engine.layout, ParallelLayout(tp=1),
        bucket_bytes=config.engine.reshard_bucket_mb * 2**20, verify=config.engine.reshard_verify,
        device=config.engine.device,
    )  # fmt: skip
    model.requires_grad_(False).eval()  # the HF copy only generates (non-GPT-2 architectures)
    engine, _ = _rollout_engine(config, model, run_dir, copy_module=False)
    params = [p for chunk in trainer.chunks for p in chunk.parameters()]
    manager = _manager(config, trainer.train_engine, engine, resharder, params, trainer.torch_optimizer)
    return trainer, engine, manager


def _rollout_engine(
    config: GRPOConfig, model: torch.nn.Module, run_dir: str | Path | None, copy_module: bool = True
) -> tuple[Any, str]:
    """The rollout engine and the layout it takes (`LocalResharder`'s target).

    engine.rollout=vllm: vLLM, in the fused inference layout. torch: GPT-2 gets the embedded engine in
    the fused inference layout; other architectures an HF copy, in HF names.
    """
    if config.engine.rollout == "vllm":
        from entrepot.grpo.engines.rollout_vllm import VllmRolloutEngine, save_model_dir

        model_dir = config.model.path
        if model_dir is None and run_dir is not None:
            # every rank built the same weights; HF's save_pretrained writes on global rank 0 only
            model_dir = str(save_model_dir(model, Path(run_dir) / "rollout_model"))
            if torch.distributed.is_initialized():
                torch.distributed.barrier()  # the directory is complete before any rank's vLLM reads it
        engine = VllmRolloutEngine.launch(
            model, model_dir, max_model_len=config.longest_sequence(), max_num_seqs=config.rollout.batch_size,
            seed=config.seed, device=config.engine.device, verify=config.engine.reshard_verify,
            tensor_parallel=config.parallel.infer.tensor,
        )  # fmt: skip
        return engine, "infer"
    if hf_architecture(model) == "GPT2LMHeadModel":
        lanes = config.compute_lanes()  # decoding threads, as the log-prob and update passes have
        return GPT2RolloutEngine.from_hf_config(
            model.config, device=config.engine.device, lanes=lanes
        ), "infer"
    from entrepot.grpo.engines.rollout_hf import HFRolloutEngine

    module = copy.deepcopy(model) if copy_module else model
    return HFRolloutEngine(module.requires_grad_(False).eval().to(config.engine.device)), "hf"


def _manager(
    config: GRPOConfig, train_engine: Any, engine: Any, resharder: Any, params: Sequence[torch.Tensor],
    optimizer: OptimizerState,
) -> Any:  # fmt: skip
    """The ShardingManager with the offload flags of `engine`."""
    from entrepot.resharding import Offloader, ShardingManager

    flags = config.engine
    return ShardingManager(
        train_engine, engine, resharder, Offloader(params, optimizer) if flags.offload_any else None,
        offload_train_params=flags.offload_params, offload_grads=flags.offload_grads,
        offload_optimizer=flags.offload_optimizer,
    )  # fmt: skip


def export_hf(
    policy: Policy, directory: str | Path, weights: Mapping[str, torch.Tensor] | None = None
) -> Path:
    """Write the policy as an HF model directory (`AutoModelForCausalLM.from_pretrained` loads it).

    Args:
        policy: the policy; without `weights`, its rollout engine's weights (resharded from training
            just before: call it in infer mode) are written.
        directory: the directory to write.
        weights: the whole model in the inference layout (a `Resharder`'s output), for engines whose
            own weights are not readable (vLLM packs them for its CPU kernels).
    """
    from transformers import AutoModelForCausalLM

    from entrepot.grpo.engines.rollout_embedded import gpt2_infer_to_hf
    from entrepot.grpo.engines.rollout_hf import unfused_weights

    out = Path(directory)
    engine = policy.engine
    if weights is None and not isinstance(engine, GPT2RolloutEngine):
        engine.module.save_pretrained(out)
        return out
    if weights is None:
        weights = engine.weights
    model = AutoModelForCausalLM.from_config(as_hf_config(policy.hf_config))
    host = {name: t.detach().cpu() for name, t in weights.items()}
    gpt2 = type(model).__name__ == "GPT2LMHeadModel"
    named = gpt2_infer_to_hf(host) if gpt2 else unfused_weights(host, policy.hf_config)
    missing, unexpected = model.load_state_dict(named, strict=False)
    if unexpected or any(name != "lm_head.weight" for name in missing):
        raise RuntimeError(f"HF export: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.save_pretrained(out)
    return out
