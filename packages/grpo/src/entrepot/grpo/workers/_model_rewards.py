"""The reward-model stage, shared by a co-located actor rank and a separate reward-model worker.

Each configured reward model (`reward.models`: local directory -> weight) reads the prompt text and
the response text, decoded with the policy's tokenizer, through its own tokenizer; the weighted sum
goes into the dock's `model_scores` column, which the rule-reward stage adds to its verifiers' sum.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from entrepot.dock import Batch, DockClient
from entrepot.grpo.config import RewardConfig
from entrepot.grpo.engines.frozen import FrozenOnDemand
from entrepot.grpo.workers._stage import SEQUENCE_COLUMNS, DockReader

__all__ = ["MODEL_SCORES", "MODEL_STAGE", "ModelRewards"]

MODEL_STAGE = "reward_scores"  # the dock consumer of the reward-model stage
MODEL_SCORES = "model_scores"  # the dock column it writes


class ModelRewards:
    """The configured reward models with their weights, each on the device only while it scores.

    Args:
        reward: `reward.models` (directory -> weight) and `reward.model_micro_batch`.
        tokenizer: the policy's tokenizer (decodes the dock's token ids to text).
        device: where the models score (`engine.device`).
        group_size: rows per prompt group (a get takes whole groups).
        offload: keep each model in host memory outside the stage (co-located actor ranks).
    """

    def __init__(
        self, reward: RewardConfig, tokenizer: Any, *, device: str, group_size: int, offload: bool
    ) -> None:
        from entrepot.grpo.engines.reward_model import load_reward_model

        self.reward, self.tokenizer, self.group_size = reward, tokenizer, group_size
        self.models = [
            (load_reward_model(path, device), float(weight)) for path, weight in reward.models.items()
        ]
        self.frozen = [FrozenOnDemand(model.parameters(), offload=offload) for model, _ in self.models]

    def params(self) -> Iterator[torch.Tensor]:
        """Every reward model's parameters (per-phase memory adds up their storages)."""
        for frozen in self.frozen:
            yield from frozen.params

    def device_bytes(self) -> int:
        """Bytes the reward models hold on the device now (0 between stages when offloaded)."""
        return sum(frozen.device_bytes() for frozen in self.frozen)

    def score(self, batch: Batch, sample: Callable[[], None] | None = None) -> torch.Tensor:
        """Weighted model scores [B] of a packed batch of prompts and responses.

        `sample` is called while each model is on the device (per-phase memory).
        """
        prompts = torch.split(batch.columns["prompts"], batch.lengths["prompts"].tolist())
        responses = torch.split(batch.columns["responses"], batch.lengths["responses"].tolist())
        # the prompt as the policy saw it (chat template included); the response without EOS / pad
        prompt_texts = [self.tokenizer.decode(p.tolist(), skip_special_tokens=False) for p in prompts]
        response_texts = [self.tokenizer.decode(r.tolist(), skip_special_tokens=True) for r in responses]
        total = torch.zeros(len(prompt_texts), dtype=torch.float32)
        micro = self.reward.model_micro_batch
        for (model, weight), frozen in zip(self.models, self.frozen, strict=True):
            with frozen.resident():
                if sample is not None:
                    sample()
                total += weight * model.score(prompt_texts, response_texts, micro_batch=micro)
        return total

    def run_stage(
        self, reader: DockReader, dock: DockClient, count: int, *, sample: Callable[[], None] | None = None
    ) -> dict[str, float]:
        """Score unscored rows, `count` at a time, into `model_scores`; this stage's time and mean score."""
        t0 = time.perf_counter()
        n = self.group_size
        total, rows = 0.0, 0
        for batch in reader.batches(dock, MODEL_STAGE, SEQUENCE_COLUMNS, count, min_count=n, alone=True):
            scores = self.score(batch, sample)
            dock.put({MODEL_SCORES: scores}, batch.indexes)
            total, rows = total + float(scores.sum()), rows + scores.numel()
        stats = {"time/reward_model": time.perf_counter() - t0}
        if rows:
            stats["reward/model_mean"] = total / rows
        return stats
