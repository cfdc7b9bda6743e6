"""The policy of one actor rank: training model, reference, optimizer, rollout engine and their switch.

`build_policy` is what an actor worker holds, and what the single-process baseline in benchmarks/
builds too, so both start from identical weights, engines and sampling streams.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data.sources import TaskSetup, build_task
from entrepot.grpo.embedded.gpt2_model import as_hf_config, hf_architecture
from entrepot.grpo.embedded.lanes import compute_lanes
from entrepot.grpo.engines.base import RolloutEngine, SamplingParams, TrainEngine
from entrepot.grpo.engines.models import build_model, load_pretrained
from entrepot.grpo.engines.registry import EngineChoice, choose_engines

if TYPE_CHECKING:
    from entrepot.resharding import ReshardStats, ShardingManager

__all__ = [
    "Policy",
    "build_policy",
    "export_hf",
    "initial_model",
    "load_reference",
    "quiet_hf_progress",
    "sampling_generator",
]


@dataclass
class Policy:
    """Everything a co-located actor rank computes with.

    Attributes:
        trainer: the training engine (`engines.base.TrainEngine`): model, reference, optimizer and LR
            schedule.
        setup: tokenizer and prompt source.
        engine: the rollout engine (own weights in the inference layout).
        manager: entrepot.resharding's ShardingManager joining the trainer and `engine` (infer /
            forward / train modes, resharding and offload).
        sampling: the rollout's sampling parameters.
        generator: the rollout's sampling stream (the same on every rank).
        hf_config: the policy's HF config (an HF export writes it).
        engines: the specs the trainer and the engine were built from (`engines.registry`).
        architecture: the policy's HF architecture (``LlamaForCausalLM``), which picks the engine.
    """

    trainer: TrainEngine
    setup: TaskSetup
    engine: RolloutEngine
    manager: ShardingManager
    sampling: SamplingParams
    generator: torch.Generator
    hf_config: Any
    engines: EngineChoice
    architecture: str = ""

    @property
    def reshard_stats(self) -> ReshardStats | None:
        """The last resharding's `ReshardStats` (None with the local layout conversion)."""
        return getattr(self.manager.resharder, "stats", None)


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


def build_policy(config: GRPOConfig, run_dir: str | Path | None = None, *, on_ray: bool = False) -> Policy:
    """Build (or load from `model.path`) the policy; every rank builds identical initial weights.

    The engines are those `engine.train` / `engine.rollout` name (`engines.registry`); a sharding
    engine (megatron) needs its parallel state initialised already (`TrainEngineSpec.start`). vLLM
    reads the built default model from `run_dir`/rollout_model (a temporary directory when None).
    The reference is co-located here unless `resources.colocate` is false (its own workers).
    `on_ray`: this rank is a Ray worker (it then shares the cores: one compute lane).
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
    engines = choose_engines(config.engine)
    lanes = compute_lanes(
        config.threads, device=config.engine.device, splits=engines.train.lanes, on_ray=on_ray
    )
    trainer, engine, manager = engines.train.build(
        config, model, own_reference, int(tok.pad_token_id), run_dir, engines.rollout, lanes
    )
    architecture = hf_architecture(model)
    return Policy(trainer, setup, engine, manager, sampling, generator, model.config, engines, architecture)


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

    from entrepot.grpo.embedded.gpt2_layout import gpt2_infer_to_hf
    from entrepot.grpo.engines.rollout_hf import unfused_weights

    out = Path(directory)
    model = AutoModelForCausalLM.from_config(as_hf_config(policy.hf_config))
    gpt2 = type(model).__name__ == "GPT2LMHeadModel"
    if weights is not None:  # the inference layout of a Resharder's output
        host = {name: t.detach().cpu() for name, t in weights.items()}
        named = gpt2_infer_to_hf(host) if gpt2 else unfused_weights(host, policy.hf_config)
    else:
        named = {name: t.detach().cpu() for name, t in policy.engine.hf_weights().items()}
    missing, unexpected = model.load_state_dict(named, strict=False)
    if unexpected or any(name != "lm_head.weight" for name in missing):
        raise RuntimeError(f"HF export: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    with quiet_hf_progress():
        model.save_pretrained(out)
    return out


@contextlib.contextmanager
def quiet_hf_progress() -> Iterator[None]:
    """No transformers progress bars inside (a checkpoint's export would draw one into the live display)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
