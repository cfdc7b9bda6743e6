"""Start the dock and the worker groups of a run, in this process or on Ray: the one place that chooses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data.lengths import partial_max_age
from entrepot.grpo.run.deployment import uses_ray
from entrepot.grpo.run.ray_start import start_ray
from entrepot.grpo.workers._model_rewards import MODEL_SCORES
from entrepot.grpo.workers.actor import ActorWorker
from entrepot.grpo.workers.group import LocalWorkerGroup, WorkerGroup
from entrepot.grpo.workers.ranks import RankInfo, rank_layout
from entrepot.grpo.workers.reward import JUDGE_COLUMNS, RewardWorker, wants_prompt_text
from entrepot.grpo.workers.separate import ReferenceWorker, RewardModelWorker

__all__ = ["Cluster", "launch"]


@dataclass
class Cluster:
    """The dock (a DockClient) and the worker groups of a run.

    `references` and `reward_models` are the separate groups of `resources.colocate: false` (None when
    co-located, or when the run has no reference / no reward model).
    """

    dock: Any
    actors: WorkerGroup[ActorWorker]
    rewards: WorkerGroup[RewardWorker]
    ray_dock_actors: tuple[Any, ...] = ()  # the Ray actors behind `dock`, killed on close
    references: WorkerGroup[ReferenceWorker] | None = None
    reward_models: WorkerGroup[RewardModelWorker] | None = None

    def placement(self) -> str | None:
        """Where each Ray group runs (``placement: actor dp 0 on node 10.0.0.1 (node id ...), ...``).

        None when the workers run in this process.
        """
        from entrepot.grpo.workers.ray_group import RayWorkerGroup

        groups = (self.actors, self.rewards, self.references, self.reward_models)
        where = [group.placement.describe() for group in groups if isinstance(group, RayWorkerGroup)]
        if hasattr(self.dock, "describe"):  # a sharded dock: where its shards hold the rows
            where.append(self.dock.describe())
        return "placement: " + "; ".join(where) if where else None

    def close(self) -> None:
        """Stop the workers and the dock's actors (Ray itself stays up for the next run in this process)."""
        self.actors.close()
        self.rewards.close()
        for group in (self.references, self.reward_models):
            if group is not None:
                group.close()
        if self.ray_dock_actors:
            import ray

            for actor in self.ray_dock_actors:
                ray.kill(actor)


def launch(config: GRPOConfig, run_dir: str | None = None) -> Cluster:
    """The GRPO dock and an actor group of DP ranks plus a reward group, as `resources` asks.

    `run_dir` is where the actors keep files of the run (vLLM's model directory); None: temporary ones.
    """
    from entrepot.dock import ColumnSpec, GRPODock

    resources = config.resources
    partial = config.rollout.partial_max_tokens is not None
    max_age = partial_max_age(config.data, config.rollout)
    dock_args: dict[str, Any] = {
        # partial rollout: each step's prompts plus the groups of up to max_age - 1 earlier steps;
        # asynchronous: the max_staleness + 1 steps' groups the rollout may have going
        "prompts_num": config.rollout.prompts_per_step * max(max_age, _async_steps(config)),
        "n_samples_per_prompt": config.rollout.n_samples_per_prompt,
        # rollout_log_prob: the rollout engine's log-probs of its sampled tokens (vLLM's, or the behaviour
        # log-probs of partial rollout; flat per row); policy_version: the version that sampled each
        # token (partial rollout); model_scores: the reward models' weighted sum (one per row)
        "extra_columns": {
            "answer": ColumnSpec(), "accuracy": ColumnSpec(), "rollout_log_prob": ColumnSpec(),
            "policy_version": ColumnSpec(), MODEL_SCORES: ColumnSpec(scalar=True),
        },
        "seed": config.seed,
        "max_age": max_age if partial else None,
        "max_staleness": config.trainer.max_staleness if partial else None,  # async: the ledger's
    }  # fmt: skip
    if wants_prompt_text(config):  # the prompt's text for the environment or the judge
        dock_args["extra_columns"]["prompt_text"] = ColumnSpec()
    if config.reward.judge.enabled:  # each row's judge verdict, [0, 1] score and output, for the samples
        verdict, score, output = JUDGE_COLUMNS
        dock_args["extra_columns"].update({
            verdict: ColumnSpec(scalar=True), score: ColumnSpec(scalar=True), output: ColumnSpec(),
        })  # fmt: skip
    if config.multiturn.enabled:  # per token, who wrote it
        dock_args["extra_columns"].update({
            "model_mask": ColumnSpec(),
            "env_reward": ColumnSpec(scalar=True), "env_accuracy": ColumnSpec(scalar=True),
            "end_reason": ColumnSpec(scalar=True),
        })  # fmt: skip
    if config.algorithm.distill.enabled:  # the teacher stage's log-probs; the per-token advantages
        from entrepot.grpo.workers._teacher import DISTILL_COLUMNS, TEACHER_STAGE, TOKEN_ADVANTAGES

        dock_args["extra_columns"].update(dict.fromkeys([*DISTILL_COLUMNS, TOKEN_ADVANTAGES], ColumnSpec()))
        dock_args["extra_consumers"] = [TEACHER_STAGE]
    separate = not resources.colocate
    wants_reference = separate and config.algorithm.kl_coef > 0
    wants_reward_models = separate and bool(config.reward.models)
    train = config.parallel.train
    actor_ranks = rank_layout(resources.num_actor_workers, train.tensor, train.pipeline)
    reward_ranks = rank_layout(resources.num_reward_workers)
    # one process (separate workers need Ray: the config refuses colocate=false without it)
    if not uses_ray(resources, config.parallel, config.dock):
        return Cluster(
            dock=GRPODock(**dock_args),
            actors=LocalWorkerGroup(
                "actor", lambda rank: ActorWorker(config, rank, run_dir=run_dir), actor_ranks
            ),
            rewards=LocalWorkerGroup("reward", lambda rank: RewardWorker(config, rank), reward_ranks),
        )

    from entrepot.grpo.workers.placement import Placement
    from entrepot.grpo.workers.ray_group import RayWorkerGroup

    start_ray(config, run_dir)
    train_device = config.engine.device.startswith("cuda")  # one GPU per actor rank (and separate worker)

    def place(name: str, ranks: list[RankInfo], device: bool = True, replicas: bool = False) -> Placement:
        """`ranks`' bundles: CPUs for every worker, the device (GPU, custom resources) for device workers."""
        return Placement(
            name, ranks, num_cpus=resources.num_cpus_per_worker, num_gpus=1 if device and train_device else 0,
            resources=resources.custom_resources_per_worker if device else None, replicas=replicas,
        )  # fmt: skip

    actor_placement = place("actor", actor_ranks, replicas=True)  # a replica per node while nodes last
    dist_init = actor_placement.rendezvous() if len(actor_ranks) > 1 else ""

    def actor_args(rank: RankInfo) -> tuple[Any, ...]:
        return (config, rank, dist_init, run_dir)

    def reward_args(rank: RankInfo) -> tuple[Any, ...]:  # every role but the actor: (config, rank)
        return (config, rank)

    references = None
    if wants_reference:
        references = RayWorkerGroup(
            ReferenceWorker, place("reference", rank_layout(resources.reference_workers)), reward_args
        )
    reward_models = None
    if wants_reward_models:
        reward_models = RayWorkerGroup(
            RewardModelWorker, place("reward_model", rank_layout(resources.reward_model_workers)), reward_args
        )
    actors = RayWorkerGroup(ActorWorker, actor_placement, actor_args)
    # the reward workers take a device only for a judge model (rules and the sandbox need CPUs)
    judge_device = config.reward.judge.enabled
    rewards = RayWorkerGroup(RewardWorker, place("reward", reward_ranks, device=judge_device), reward_args)
    try:  # the workers start in their processes meanwhile (a sharded dock waits for its shards)
        dock, dock_actors = _ray_dock(config, dock_args, run_dir)
    except BaseException:
        for group in (actors, rewards, references, reward_models):
            if group is not None:
                group.close()
        raise
    return Cluster(
        dock=dock,
        actors=actors,
        rewards=rewards,
        ray_dock_actors=dock_actors,
        references=references,
        reward_models=reward_models,
    )


def _ray_dock(
    config: GRPOConfig, dock_args: dict[str, Any], run_dir: str | None
) -> tuple[Any, tuple[Any, ...]]:
    """The run's dock on Ray and its actors: sharded over `dock.shards` (null: one per node) when above
    1, else one dock actor."""
    import ray

    from entrepot.dock import GRPODock

    shards = config.dock.shards or sum(1 for node in ray.nodes() if node["Alive"])
    if shards > 1:
        from entrepot.dock.sharded import ShardedDockClient

        sharded = ShardedDockClient.launch(GRPODock, shards=shards, num_cpus=0, **dock_args)
        return sharded, (sharded.controller, *sharded.shards)  # it saves through the driver: no files_root
    from entrepot.dock.ray import RayDockClient

    # the dock actor saves and loads checkpoints only inside the run directory
    files_root = None if run_dir is None else str(Path(run_dir).resolve())  # the driver's view of it
    dock = RayDockClient.launch(GRPODock, num_cpus=0, files_root=files_root, **dock_args)
    return dock, (dock.actor,)


def _async_steps(config: GRPOConfig) -> int:
    """Steps' worth of groups an asynchronous rollout keeps going (1 in synchronous training)."""
    return config.trainer.async_max_staleness + 1 if config.trainer.asynchronous else 1
