"""The workers of the full system and the groups that run them.

- `ActorWorker`: a co-located actor rank (train + rollout + reference + reward models),
  `RewardWorker`: rule rewards (plus the reward models' scores).
- `ReferenceWorker`, `RewardModelWorker`: the reference and the reward models on their own workers
  (`resources.colocate: false`).
- `WorkerGroup` (`LocalWorkerGroup` in this process, `ray_group.RayWorkerGroup` on Ray), `RankInfo`,
  `wait_all`: how the trainer starts stages on every rank and collects results.
- `launch`: the dock and the groups for a config, in this process or on Ray.
"""

from __future__ import annotations

from entrepot.grpo.workers._update_inputs import response_batch
from entrepot.grpo.workers.actor import ActorWorker
from entrepot.grpo.workers.group import LocalWorkerGroup, Pending, WorkerGroup, wait_all
from entrepot.grpo.workers.launch import Cluster, launch
from entrepot.grpo.workers.ranks import RankInfo, rank_layout
from entrepot.grpo.workers.reward import (
    JUDGE_COLUMNS,
    RewardWorker,
    prompt_extras,
    tensor_text,
    text_tensor,
    wants_prompt_text,
)
from entrepot.grpo.workers.separate import ReferenceWorker, RewardModelWorker

__all__ = [
    "JUDGE_COLUMNS",
    "ActorWorker",
    "Cluster",
    "LocalWorkerGroup",
    "Pending",
    "RankInfo",
    "ReferenceWorker",
    "RewardModelWorker",
    "RewardWorker",
    "WorkerGroup",
    "launch",
    "prompt_extras",
    "rank_layout",
    "response_batch",
    "tensor_text",
    "text_tensor",
    "wait_all",
    "wants_prompt_text",
]
