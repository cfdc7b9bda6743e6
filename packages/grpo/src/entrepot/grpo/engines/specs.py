"""The engine specs: what `engines.registry` holds for each `engine.train` / `engine.rollout` value.

A spec is a small frozen record: how to build the engine, and what the rest of the run must know of
it (`TrainEngineSpec.shards_weights`, `RolloutEngineSpec.separate_kernels`, the optional module it
needs). Builders receive the rollout spec they build with, so an engine module imports these types
and never the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

    from entrepot.grpo.config import GRPOConfig
    from entrepot.grpo.engines.base import RolloutEngine, TrainEngine
    from entrepot.resharding import ShardingManager

__all__ = ["EngineChoice", "RolloutEngineSpec", "RolloutKind", "TrainEngineSpec", "TrainSide"]

RolloutKind = Literal["gpt2", "llama", "hf", "vllm"]
"""The rollout engine a run gets: the embedded GPT-2 decoder, the Llama-family decoder, HF `generate`,
or vLLM."""

TrainSide = tuple["TrainEngine", "RolloutEngine", "ShardingManager"]
BuildRollout = Callable[["GRPOConfig", "torch.nn.Module", "str | Path | None", bool, int],
                        tuple["RolloutEngine", str]]  # fmt: skip
StartRanks = Callable[["GRPOConfig", int, int, int, str], Any]
BuildTrain = Callable[["GRPOConfig", "torch.nn.Module", "torch.nn.Module | None", int, "str | Path | None",
                       "RolloutEngineSpec", int], TrainSide]  # fmt: skip


@dataclass(frozen=True)
class TrainEngineSpec:
    """One training engine.

    Attributes:
        name: its `engine.train` value.
        build: (config, policy module, own reference or None, pad token id, run dir, the rollout
            engine's spec, lanes) -> the trainer, the rollout engine and the ShardingManager joining
            them.
        start: (config, rank, world size, model-parallel ranks, rendezvous URL) -> joins this rank to
            the engine's process groups before `build`; returns the model-parallel group the dock
            reads are broadcast over (None: each rank reads alone).
        lanes: it splits each micro-batch over CPU threads (`embedded.lanes`) when the machine allows.
        shards_weights: the ranks hold TP / PP shards, resharded for the rollout engine through a
            bucketed `Resharder`; a checkpoint also writes a whole-model HF export, which evaluation
            reads.
        module: the optional module it needs (None: always installed) and the extra that brings it.
    """

    name: str
    build: BuildTrain
    start: StartRanks
    shards_weights: bool
    lanes: bool = False
    module: str | None = None
    extra: str | None = None


@dataclass(frozen=True)
class RolloutEngineSpec:
    """One rollout engine (`engine.rollout`).

    Attributes:
        name: its `engine.rollout` value.
        kind: what `build` gives for a policy architecture (the torch engine: GPT-2's embedded
            decoder, the Llama-family decoder or HF `generate`).
        build: (config, policy module, run dir, copy the module?, decoding lanes) -> the engine and the
            weight layout it takes (`LocalResharder`'s target: "infer" or "hf"; "policy": it reads
            the module's own parameters, `engines.shared_weights`).
        separate_kernels: its log-probs come from kernels of its own (vLLM): the actor puts them in
            the dock and checks them against the training engine's every step (`rollout/logp_mismatch_*`).
        module, extra: the optional module it needs and the extra that brings it.
    """

    name: str
    kind: Callable[[str], RolloutKind]
    build: BuildRollout
    separate_kernels: bool = False
    module: str | None = None
    extra: str | None = None


@dataclass(frozen=True)
class EngineChoice:
    """The engines of a run: chosen once from `engine.train` / `engine.rollout`."""

    train: TrainEngineSpec
    rollout: RolloutEngineSpec
