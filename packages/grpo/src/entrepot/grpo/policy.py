"""The policy of one actor rank: training model, reference, optimizer, rollout engine and their switch.

`build_policy` is what an actor worker holds, and what the single-process baseline in benchmarks/
builds too, so both start from identical weights, engines and sampling streams.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data import TaskSetup, build_task
from entrepot.grpo.model import build_model, load_pretrained
from entrepot.grpo.optim import build_optimizer
from entrepot.grpo.rollout import GPT2RolloutEngine, SamplingParams

__all__ = ["Policy", "build_policy", "sampling_generator", "total_optimizer_steps"]


@dataclass
class Policy:
    """Everything a co-located actor rank computes with.

    Attributes:
        model: the training model (HF causal LM) on the configured device.
        reference: a frozen copy of the initial model, or None when no stage needs it (kl_coef = 0).
        optimizer, scheduler: AdamW and its LR schedule.
        setup: tokenizer and prompt source.
        engine: the rollout engine (own weights in the inference layout).
        manager: entrepot.resharding's ShardingManager joining `model` and `engine` (infer / forward /
            train modes, resharding and offload).
        sampling: the rollout's sampling parameters.
        generator: the rollout's sampling stream (seeded per DP rank).
    """

    model: torch.nn.Module
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    setup: TaskSetup
    engine: Any
    manager: Any
    sampling: SamplingParams
    generator: torch.Generator


def total_optimizer_steps(config: GRPOConfig) -> int:
    """Optimiser steps of the whole run (the cosine schedule's length)."""
    mini = config.algorithm.mini_batch_size or config.rollout.batch_size
    return config.max_steps * config.algorithm.epochs * max(1, config.rollout.batch_size // mini)


def sampling_generator(seed: int, dp_rank: int) -> torch.Generator:
    """The rollout sampling stream of DP rank `dp_rank` (distinct per rank, fixed by the seed)."""
    return torch.Generator().manual_seed(seed + 7919 * (dp_rank + 1))


def build_policy(config: GRPOConfig, dp_rank: int = 0) -> Policy:
    """Build (or load from `model.path`) the policy; every rank builds identical initial weights."""
    torch.manual_seed(config.seed)
    tokenizer = None
    if config.model.path is not None:
        model, tokenizer = load_pretrained(config.model.path)
    setup = build_task(config, tokenizer)
    tok = setup.tokenizer
    if config.model.path is None:
        model = build_model(config.model, tok.vocab_size, pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id)  # fmt: skip
    model.to(config.engine.device)
    reference = copy.deepcopy(model).requires_grad_(False) if config.algorithm.kl_coef > 0 else None
    optimizer, scheduler = build_optimizer(model, config.algorithm, total_optimizer_steps(config))
    engine, manager = _rollout_engine(config, model, optimizer)
    sampling = SamplingParams(
        temperature=config.rollout.temperature, top_p=config.rollout.top_p, top_k=config.rollout.top_k,
        max_new_tokens=setup.max_new_tokens,
        stop_token_ids=(tok.eos_token_id,) if config.rollout.stop_on_eos else (),
    )  # fmt: skip
    return Policy(model, reference, optimizer, scheduler, setup, engine, manager, sampling,
                  sampling_generator(config.seed, dp_rank))  # fmt: skip


def _rollout_engine(
    config: GRPOConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[Any, Any]:
    """The rollout engine and the ShardingManager joining it to the training model.

    GPT-2 gets the embedded engine in the fused inference layout; other architectures get an
    HF-layout generation copy (`HFRolloutEngine`). Both receive weights through the resharder.
    """
    from entrepot.resharding import LocalResharder, Offloader, ShardingManager
    from entrepot.resharding.adaptors import get_adaptor
    from entrepot.resharding.engines.torch import TorchTrainingEngine

    architecture = type(model).__name__
    adaptor = get_adaptor(architecture, model.config)
    engine: Any
    if architecture == "GPT2LMHeadModel":
        engine = GPT2RolloutEngine.from_hf_config(model.config, device=config.engine.device)
        resharder = LocalResharder(adaptor, target="infer")
    else:
        from entrepot.grpo.rollout_hf import HFRolloutEngine

        engine = HFRolloutEngine(copy.deepcopy(model).requires_grad_(False).eval())
        resharder = LocalResharder(adaptor, target="hf")
    offload = config.engine.offload_train_in_rollout
    manager = ShardingManager(
        TorchTrainingEngine(model, adaptor),
        engine,
        resharder,
        Offloader(model, optimizer) if offload else None,
        offload_train_params=offload, offload_grads=offload, offload_optimizer=offload,
    )  # fmt: skip
    return engine, manager
