"""Workers for `resources.colocate: false`: the reference and the reward models on their own resources.

Each is a dock consumer like a co-located stage, so it overlaps with the actor wherever the dock has
its inputs ready: the reference's log-probs while the actor computes its old log-probs, the reward
models while the actor rolls out the next rows (with `resources.blocking: false`). Their models stay
resident (nothing else shares their device).
"""

from __future__ import annotations

import time

import torch

from entrepot.dock import DockClient
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.embedded.threads import configure_threads
from entrepot.grpo.workers._model_rewards import MODEL_STAGE, ModelRewards
from entrepot.grpo.workers._stage import SEQUENCE_COLUMNS, DockReader, stage
from entrepot.grpo.workers._update_inputs import response_batch
from entrepot.grpo.workers.ranks import RankInfo

__all__ = ["ReferenceWorker", "RewardModelWorker"]


class ReferenceWorker:
    """One rank of the separate reference group: `ref_log_prob` with the torch engine.

    The reference is `model.ref_model_load_path`, else the policy's initial weights, built exactly as
    the actor ranks build them (same seed or the same `model.path`).

    Args:
        config: the run's config.
        rank: this worker's place in the reference group.
    """

    role = "reference"

    def __init__(self, config: GRPOConfig, rank: RankInfo | None = None) -> None:
        from entrepot.grpo.engines.policy import initial_model, load_reference

        configure_threads(config.threads, interop=True)
        self.config = config
        self.rank = rank or RankInfo(rank=0, world_size=1)
        self.reader = DockReader(self.rank, config.resources.stage_timeout_s)
        policy_model, setup = initial_model(config)
        path = config.model.ref_model_load_path
        model = policy_model if path is None else load_reference(path, policy_model)
        dtype = getattr(torch, config.model.reference_dtype)  # float32 | bfloat16 (validated)
        self.model = model.to(config.engine.device, dtype=dtype).requires_grad_(False).eval()
        self.pad_token_id = int(setup.tokenizer.pad_token_id)

    def ready(self) -> bool:
        """Nothing: answering at all means the worker finished starting (Ray queues calls until then)."""
        return True

    @stage("ref_log_prob")
    def reference_logprobs(self, dock: DockClient, count: int) -> dict[str, float]:
        """Reference log-probs of response tokens (flat, per row) into the dock, `count` rows at a time."""
        from entrepot.grpo.algo.update import compute_logprobs

        t0 = time.perf_counter()
        n = self.config.rollout.n_samples_per_prompt
        for batch in self.reader.batches(dock, "ref_log_prob", SEQUENCE_COLUMNS, count, min_count=n):
            rows = response_batch(batch)
            logp = compute_logprobs(self.model, rows, self.config.batching, "ref_log_prob",
                                    pad_token_id=self.pad_token_id)  # fmt: skip
            dock.put({"ref_log_prob": (logp, rows.response_lengths)}, batch.indexes)
        return {"time/ref": time.perf_counter() - t0}

    def reference_digest(self) -> dict[str, torch.Tensor]:
        """A copy of the reference's parameters (tests compare it with its source)."""
        return {n: p.detach().cpu().clone() for n, p in self.model.named_parameters()}

    def shutdown(self) -> None:
        """Nothing to release (the group's close ends the process)."""


class RewardModelWorker:
    """One rank of the separate reward-model group: every configured reward model, resident.

    Args:
        config: the run's config.
        rank: this worker's place in the group.
    """

    role = "reward_model"

    def __init__(self, config: GRPOConfig, rank: RankInfo | None = None) -> None:
        from entrepot.grpo.data.sources import build_task
        from entrepot.grpo.engines.models import load_tokenizer

        configure_threads(config.threads, interop=True)
        self.config = config
        self.rank = rank or RankInfo(rank=0, world_size=1)
        self.reader = DockReader(self.rank, config.resources.stage_timeout_s)
        tokenizer = load_tokenizer(config.model.path) if config.model.path is not None else None
        policy_tokenizer = build_task(config, tokenizer).tokenizer
        self.model_rewards = ModelRewards(
            config.reward, policy_tokenizer, device=config.engine.device,
            group_size=config.rollout.n_samples_per_prompt, offload=False,
        )  # fmt: skip

    def ready(self) -> bool:
        """Nothing: answering at all means the worker finished starting (Ray queues calls until then)."""
        return True

    @stage(MODEL_STAGE)
    def reward_model_scores(self, dock: DockClient, count: int) -> dict[str, float]:
        """Score responses (`count` rows a get) with every reward model into `model_scores`."""
        return self.model_rewards.run_stage(self.reader, dock, count)

    def shutdown(self) -> None:
        """Nothing to release (the group's close ends the process)."""
