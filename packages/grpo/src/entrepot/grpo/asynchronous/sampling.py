"""Asynchronous training as a sampling mode: the step takes finished groups from a rollout running beside it.

`AsyncSampling` is the `sampling.Sampling` of `trainer.mode: async`. It drives the rollout rank
(`worker.RolloutWorker`: an object in this process, or a Ray actor on a node of its own, chosen once
by the deployment) through the worker-group interface every stage uses. A step's `sample` takes the
next finished groups from the rollout's ledger (waiting under the stage timeout; a dead rollout fails
it at once, naming the rank); after the update, `updated` syncs the new weights to the rollout
(handed over in one process, or sent over a `WeightChannel` by the trainer's rank 0) and tells the
ledger, which may let the rollout start more prompts. The importance ratio divides by the rollout's
own log-probs of each token (the behaviour policy, possibly several versions in one response); the
loss's off-policy correction (`algorithm.correction`) reweighs by the trainer's over them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from entrepot.dock.signing import new_secret
from entrepot.grpo.asynchronous.ledger import Group, Taken
from entrepot.grpo.asynchronous.rollout_loop import RolloutStats
from entrepot.grpo.asynchronous.worker import RolloutWorker
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.run.deployment import uses_ray
from entrepot.grpo.sampling import Prompts, Sampled, StageStart
from entrepot.grpo.workers import ActorWorker, LocalWorkerGroup, WorkerGroup, wait_all
from entrepot.grpo.workers.ranks import rank_layout

__all__ = ["AsyncSampling"]


@dataclass
class AsyncSampling:
    """The sampling of asynchronous training (see the module docstring); `build` makes it.

    The rollout thread starts at the first `sample`, after a resumed run restored its state.

    Attributes:
        channel: ``host:port`` of the weight channel (Ray runs); None: weights handed over in-process.
        secret: the run's secret its messages are signed with, made here and given to both ends by Ray.
    """

    config: GRPOConfig
    cluster: Any
    rollouts: WorkerGroup[RolloutWorker]
    channel: str | None = None
    secret: bytes = field(default=b"", repr=False)
    started: bool = False
    log_probs_after: bool = True
    behaviour_ratio: bool = True
    explicit_rows: bool = True
    dock_in_checkpoint: bool = False
    columns: tuple[str, ...] = ("policy_version",)
    _wall: float = field(default_factory=time.perf_counter)
    _taken: list[Group] = field(default_factory=list)
    _waited: float = 0.0

    @staticmethod
    def build(config: GRPOConfig, cluster: Any) -> AsyncSampling:
        """The rollout rank beside `cluster`'s workers: here, or on Ray (its own placement)."""
        if not uses_ray(config.resources, config.parallel, config.dock):
            rollouts = LocalWorkerGroup("rollout", lambda rank: RolloutWorker(config, rank), rank_layout(1))
            sampling = AsyncSampling(config, cluster, rollouts)
        else:
            from entrepot.grpo.workers.placement import Placement
            from entrepot.grpo.workers.ray_group import RayWorkerGroup

            resources = config.resources
            placement = Placement(
                "rollout", rank_layout(1), num_cpus=resources.num_cpus_per_worker,
                num_gpus=1 if config.engine.device.startswith("cuda") else 0,
                resources=config.trainer.rollout_resources,
            )  # fmt: skip
            actors = cluster.actors.placement
            host = "127.0.0.1" if placement.nodes[0] == actors.nodes[0] else actors.nodes[0].ip
            channel, secret = f"{host}:{actors.free_port(host)}", new_secret()
            group = RayWorkerGroup(
                RolloutWorker, placement, lambda rank: (config, rank, channel, secret), concurrency=4
            )
            sampling = AsyncSampling(config, cluster, group, channel, secret)
        sampling._wait([sampling.rollouts.call(RolloutWorker.ready)])
        return sampling

    def describe(self) -> str:
        """A start-up line: where the rollout runs, how weights reach it, the staleness bound."""
        trainer = self.config.trainer
        placement = getattr(self.rollouts, "placement", None)
        where = placement.describe() if placement is not None else "rollout rank 0 on a thread here"
        how = f"signed weight channel at {self.channel}" if self.channel else "weights handed over in memory"
        return (f"asynchronous: {where}; {how}; max_staleness {trainer.async_max_staleness} "
                f"({trainer.staleness_policy})")  # fmt: skip

    # -- the step's side ------------------------------------------------------------------------

    def sample(self, prompts: Prompts, step: int, also: Sequence[StageStart]) -> Sampled:
        """The next `prompts_per_step` finished groups (the ledger's order and staleness policy)."""
        if not self.started:
            self._start(step)
        trainer = self.config.trainer
        timeout = self.config.resources.stage_timeout_s + trainer.weight_sync_timeout_s
        taken: Taken = self._wait([self.rollouts.call(RolloutWorker.take, timeout)], timeout + 60)[0][0]
        n = self.config.rollout.n_samples_per_prompt
        if taken.dropped:
            self.cluster.dock.clear(_rows(taken.dropped, n))
            self._wait([self.rollouts.call(RolloutWorker.release, len(taken.dropped))])
        self._taken, self._waited = taken.groups, taken.waited_s
        outstanding = self._wait([self.rollouts.call(RolloutWorker.outstanding)])[0][0]
        metrics = {
            "async/groups_dropped": float(len(taken.dropped)),
            "async/trainer_wait_s": taken.waited_s,
            "async/groups_outstanding": float(outstanding),
        }
        return Sampled(_rows(taken.groups, n), [], metrics)

    def updated(self, version: int) -> dict[str, float]:
        """The update to `version` is done: its weights to the rollout, and the ledger told."""
        t0 = time.perf_counter()
        metrics = self._sync(version)
        self._wait([self.rollouts.call(RolloutWorker.trained)])
        metrics["async/weight_sync_wall_s"] = time.perf_counter() - t0
        return metrics

    def clear(self, dock: Any, rows: torch.Tensor) -> None:
        """Only the step's rows leave the dock: the others are in flight or wait for a later step."""
        if rows.numel():
            dock.clear(rows)
            groups = rows.numel() // self.config.rollout.n_samples_per_prompt
            self._wait([self.rollouts.call(RolloutWorker.release, groups)])

    def after_clear(self, dock: Any, step: int, stats: Any) -> dict[str, float]:
        """Tokens trained per policy-version age, the rollout's figures since the last step, and the
        share of the step the trainer waited for groups."""
        out: dict[str, float] = {}
        if stats is not None:
            ages = step - stats.columns["policy_version"].long()  # [T] every trained token
            for age, tokens in enumerate(torch.bincount(ages.clamp(min=0)).tolist()):
                out[f"async/tokens_age_{age}"] = float(tokens)
        now = time.perf_counter()
        rollout: RolloutStats = self._wait([self.rollouts.call(RolloutWorker.stats)])[0][0]
        out.update(rollout.metrics(now - self._wall))
        out["async/trainer_idle_frac"] = self._waited / max(now - self._wall, 1e-9)  # waiting for groups
        self._wall = now
        return out

    def trained_prompts(self) -> list[int]:
        """The data positions of the prompts the last step trained."""
        return [g.position for g in self._taken]

    @property
    def data_position(self) -> int:
        return int(self._wait([self.rollouts.call(RolloutWorker.data_position)])[0][0])

    # -- checkpoints and the end ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """`RolloutWorker.state`: the prompts to redo after a resume, the next one, the rollout's version."""
        return dict(self._wait([self.rollouts.call(RolloutWorker.state)])[0][0])

    def restore(self, state: dict[str, Any], step: int) -> None:
        self._wait([self.rollouts.call(RolloutWorker.restore, state, step)])

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a dead rollout is closed all the same
            self._wait([self.rollouts.call(RolloutWorker.stop)], 60.0)
        self.rollouts.close()

    # -- internals ------------------------------------------------------------------------------

    def _start(self, step: int) -> None:
        self._sync(step)
        self._wait([self.rollouts.call(RolloutWorker.start, self.cluster.dock, step)])
        self._wall = time.perf_counter()
        self.started = True

    def _sync(self, version: int) -> dict[str, float]:
        """Weights of `version` from the actor ranks to the rollout: handed over, or over the channel."""
        t0 = time.perf_counter()
        if self.channel is None:
            published = self._wait([self.cluster.actors.call(ActorWorker.publish_weights, version)])[0][0]
            self._wait([self.rollouts.call(RolloutWorker.receive, published)])
            return {"async/publish_s": published.seconds, "async/publish_bytes": float(published.nbytes)}
        timeout = self.config.trainer.weight_sync_timeout_s
        sent, received = self._wait([
            self.cluster.actors.call(ActorWorker.send_weights, version, self.channel, self.secret),
            self.rollouts.call(RolloutWorker.receive_from_trainer, version),
        ], timeout)  # fmt: skip
        nbytes = float(sent[0])
        seconds = time.perf_counter() - t0
        return {"async/publish_s": seconds, "async/publish_bytes": nbytes,
                "async/channel_gbps": nbytes / max(received[0], 1e-9) / 1e9}  # fmt: skip

    def _wait(self, pendings: Sequence[Any], timeout: float | None = None) -> list[list[Any]]:
        return wait_all(pendings, timeout or self.config.resources.stage_timeout_s)


def _rows(groups: Sequence[Group], n: int) -> torch.Tensor:
    return torch.tensor([g.first_row + j for g in groups for j in range(n)], dtype=torch.int64)
