"""What every engine gives the workers: the sampling parameters, one tensor result, two protocols.

A rollout engine (embedded GPT-2, HF `generate`, vLLM) answers `generate` with a `Rollout`: the
sampled tokens flat, one length per prompt, and the raw-logit log-prob of each token, so the actor
puts tensors into the dock without a Python list in between. A training engine (torch, megatron-core)
answers the actor's log-prob and update passes. Which engines a run uses is chosen once, by
`entrepot.grpo.engines.registry`.

Shape legend: B = prompts of one call, R = sampled tokens of all of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from entrepot.resharding.protocols import InferenceEngine

if TYPE_CHECKING:
    from entrepot.grpo.algo.optim import AdamW, LRSchedule
    from entrepot.grpo.algo.sequences import ResponseBatch
    from entrepot.grpo.algo.update import UpdateInputs
    from entrepot.grpo.engines.frozen import FrozenOnDemand

__all__ = ["Rollout", "RolloutEngine", "SamplingParams", "TrainEngine"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: temperature (0 = greedy), top-p, top-k (0 = off), budget and stop tokens."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Rollout:
    """The responses of one `generate` call, flat, in prompt order (a stop token is kept).

    Attributes:
        tokens: int64 [R] every response's tokens, one after another.
        lengths: int64 [B] tokens of each response.
        logprobs: float32 [R] each token's log-prob under the raw logits (before temperature, top-k
            and top-p: the distribution the trainer's log-probs are of).
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    logprobs: torch.Tensor

    def responses(self) -> list[torch.Tensor]:
        """One token tensor per prompt (views of `tokens`)."""
        return list(torch.split(self.tokens, self.lengths.tolist()))

    def response_logprobs(self) -> list[torch.Tensor]:
        """One log-prob tensor per prompt (views of `logprobs`)."""
        return list(torch.split(self.logprobs, self.lengths.tolist()))

    @staticmethod
    def from_rows(tokens: Sequence[Sequence[int]], logprobs: Sequence[torch.Tensor]) -> Rollout:
        """A rollout of per-row token lists (an engine that hands back lists, as vLLM does)."""
        lengths = torch.tensor([len(row) for row in tokens], dtype=torch.int64)
        flat = torch.tensor([t for row in tokens for t in row], dtype=torch.int64)
        logps = torch.cat([lp.float() for lp in logprobs]) if logprobs else torch.zeros(0)
        return Rollout(flat, lengths, logps)


class RolloutEngine(InferenceEngine, Protocol):
    """A rollout engine: entrepot.resharding's `InferenceEngine` (weights in, memory out) plus sampling.

    Attributes:
        tensor_parallel: ranks one engine spans (1: each rank generates alone).
        readable_weights: `hf_weights` can read its weights back (vLLM packs them for its kernels:
            an export reshards from the trainer instead).
    """

    tensor_parallel: int
    readable_weights: bool

    def generate(
        self,
        prompts: Sequence[Sequence[int] | torch.Tensor],
        params: SamplingParams,
        *,
        pad_token_id: int = 0,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """One sampled response per prompt; a response ends after a stop token (kept) or the budget."""
        ...

    def hf_weights(self) -> Mapping[str, torch.Tensor]:
        """The weights it holds, by HF name (an export writes them); only with `readable_weights`."""
        ...


class TrainEngine(Protocol):
    """What the actor worker needs of a training engine (`TorchTrainer`, `MegatronTrainer`)."""

    is_last_stage: bool  # this rank computes the log-probs (the last pipeline stage)
    tp_rank: int
    frozen_reference: FrozenOnDemand  # the reference's parameters (none without one), offloaded or not

    def logprobs(
        self, batch: ResponseBatch, pass_name: str, *, reference: bool, temperature: float = 1.0
    ) -> torch.Tensor | None:
        """Log-probs [R] of the response tokens under softmax(logits / temperature) (None on ranks that
        do not compute them)."""
        ...

    def update(self, inputs: UpdateInputs) -> dict[str, float]:
        """The policy update of one step; mean diagnostics."""
        ...

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's trainable parameters by name."""
        ...

    def named_reference(self) -> dict[str, torch.Tensor]:
        """This rank's reference parameters by name (empty without a reference)."""
        ...

    @property
    def torch_optimizer(self) -> AdamW | torch.optim.Optimizer:
        """The optimizer holding the moments (checkpoints save its state)."""
        ...

    @property
    def scheduler(self) -> LRSchedule | torch.optim.lr_scheduler.LRScheduler:
        """The LR schedule."""
        ...

    def after_restore(self) -> None:
        """Re-derive state that follows from the parameters after a checkpoint is loaded."""
        ...

    def join_data_parallel(self) -> None:
        """Sum gradients over the data-parallel ranks from now on (the actor group has several)."""
        ...

    def save_adapter(self, directory: str | Path) -> bool:
        """Write the LoRA adapter (peft's directory) when the policy trains one; whether it did."""
        ...

    def reference_resident(self) -> contextlib.AbstractContextManager[None]:
        """The reference's parameters on the device inside the block (checkpoints read and write them)."""
        ...
