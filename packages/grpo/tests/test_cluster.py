"""A run on a Ray cluster of two nodes (both on this machine, loopback only): one DP replica per node,
custom resources reserved per worker, and a lost worker named by its node, then `resume` finishing;
asynchronous training with the rollout on the other node than training.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from entrepot.dock import DockShardLostError
from entrepot.grpo import load_config, train
from entrepot.grpo.run.metrics import read_metrics

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.integration  # a Ray cluster of two nodes, training runs

SMALL = ["eval.num_prompts=64", "logging.tensorboard=false", "checkpoint.keep_last=0", "eval.every=0"]
STEPS = 15  # enough for the reward to rise on 4 digits, at 64 prompts a step and lr 5e-3
ACCEL_PER_NODE = 2  # a custom resource on both nodes: room for both replicas on either one


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A head node and a second node, each with 1 CPU and a resource naming it; the driver not yet joined.

    Ray gives its nodes this machine's network address unless told that clusters are off: then
    every node, and the driver, listen on 127.0.0.1 (the project's rule for local runs). Its files,
    and its record of the cluster that ``ray_address=auto`` finds, go to a directory of this module:
    a plain ``ray.init()`` elsewhere on the machine would otherwise join this cluster.
    """
    from ray._private import ray_constants
    from ray._private.authentication.authentication_token_setup import (
        enable_token_auth_by_default,
        ensure_token_if_auth_enabled,
    )
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # a local Ray left by another module: this module's runs join the cluster
        ray.shutdown()
    files = tempfile.mkdtemp(prefix="ray-cluster-", dir="/tmp")  # short: Ray's socket paths go inside
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", files)
        patch.delenv("RAY_ADDRESS", raising=False)
        # token auth as `ray start` turns it on, in the driver and (inherited) in the nodes alike
        enable_token_auth_by_default()
        ensure_token_if_auth_enabled(create_token_if_missing=True)
        patch.setenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0")  # the nodes' processes
        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # this process (the driver)
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1, "include_dashboard": False,
                # train_node, rollout_node (the other node): entrepot-cli's configs/async-ray-cluster.yaml
                "resources": {"node_a": 1, "accel": ACCEL_PER_NODE, "train_node": 1},
            },
        )  # fmt: skip
        try:
            cluster.add_node(num_cpus=1, resources={"node_b": 1, "accel": ACCEL_PER_NODE, "rollout_node": 1})
            cluster.wait_for_nodes()
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()
            shutil.rmtree(files, ignore_errors=True)


def kill_and_wait(actor: Any, timeout: float = 60.0) -> None:
    """`ray.kill` and wait until the actor is dead: ray.kill only asks, so a call made right after it
    may still run on a loaded machine."""
    ray.kill(actor)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError(f"actor still alive {timeout:g} s after ray.kill")


def _overrides(*more: str) -> list[str]:
    """Two DP replicas on the running cluster (``auto``: the one `ray start`, here the fixture, recorded)."""
    return [
        *SMALL, "resources.ray_address=auto", "resources.num_actor_workers=2", "rollout.prompts_per_step=8",
        "resources.custom_resources_per_worker={accel: 1}", *more,
    ]  # fmt: skip


def _replica_nodes(lines: list[str]) -> dict[int, tuple[str, str]]:
    """The start-up log's placement line: DP replica -> (node address, node id prefix)."""
    (line,) = [line for line in lines if line.startswith("placement: ")]
    print(line)  # the run's own record of where each replica went (pytest -s shows it)
    actors = line.removeprefix("placement: ").split("; ")[0]
    found = re.findall(r"dp (\d+) on node (\S+) \(node id ([0-9a-f]{12})\.\.\.\)", actors)
    return {int(dp): (ip, node_id) for dp, ip, node_id in found}


def _dock_shard_nodes(lines: list[str]) -> dict[int, str]:
    """The placement line's dock part: shard -> node id prefix."""
    (line,) = [line for line in lines if line.startswith("placement: ")]
    dock = [part for part in line.removeprefix("placement: ").split("; ") if part.startswith("dock ")]
    found = re.findall(r"shard (\d+) on node \S+ \(id ([0-9a-f]{12})\)", dock[0])
    return {int(shard): node_id for shard, node_id in found}


def test_each_replica_runs_on_its_own_node_and_a_dead_worker_and_a_lost_dock_shard_are_named_by_their_nodes(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """One run, two failures at its last step, each before that step's checkpoint: a fresh run, one
    replica per node, learns for STEPS steps and loses actor rank 1 at the last; its resume (from the
    step before) loses dock shard 1; each error names the node, each leaves the earlier checkpoint
    alone, and a last resume trains the last step once (on both nodes again).

    (Three tests once, each with a fresh run: the failures now come at the end of the run that checks
    the placement and the learning, and in its resume, which saves two start-ups of the workers, the
    most of each test's time.)
    """
    from entrepot.dock.sharded import ShardedDockClient
    from entrepot.grpo.errors import StageError
    from entrepot.grpo.run.resume import resume_point
    from entrepot.grpo.trainer import Trainer
    from entrepot.grpo.workers import ActorWorker, wait_all

    config = load_config(None, _overrides(
        f"max_steps={STEPS}", f"checkpoint.save_every={STEPS - 1}", "data.num_digits=4", "algorithm.lr=5e-3",
        "rollout.prompts_per_step=64", "eval.num_prompts=8",
    ))  # fmt: skip
    run = tmp_path / "run"
    before_last = f"step_{STEPS - 1:06d}"
    lines: list[str] = []
    held: list[float] = []
    trainer = Trainer(config, run, on_startup=lines.append)
    try:
        infos = wait_all([trainer.actors.call(ActorWorker.runtime_info)], 60)[0]
        nodes = trainer.actors.placement.nodes  # type: ignore[attr-defined]
        assert [info["node_id"] for info in infos] == [node.node_id for node in nodes]  # where placed
        assert nodes[0].node_id != nodes[1].node_id

        def kill_rank_1(metrics: dict[str, Any]) -> None:  # after the last step, before its checkpoint
            # mid-run: what the workers' bundles hold
            held.append(ray.cluster_resources()["accel"] - ray.available_resources().get("accel", 0.0))
            if metrics["step"] == STEPS:
                kill_and_wait(trainer.actors.actors[1])  # type: ignore[attr-defined]

        died = (
            rf"failed in actor rank 1 on node 127\.0\.0\.1 \(node id {nodes[1].node_id[:12]}\.\.\.\): "
            "the worker process died"
        )
        with pytest.raises(StageError, match=died):
            trainer.fit(on_step=kill_rank_1)
    finally:
        trainer.close()
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == [before_last]
    replicas = _replica_nodes(lines)
    alive = {node["NodeID"][:12] for node in ray.nodes() if node["Alive"]}
    assert sorted(replicas) == [0, 1]
    assert replicas[0][1] != replicas[1][1] and {r[1] for r in replicas.values()} == alive  # one per node
    assert {r[0] for r in replicas.values()} == {"127.0.0.1"}
    assert held == [2.0] * STEPS  # {accel: 1} reserved for each of the two actor ranks, the whole run
    shards = _dock_shard_nodes(lines)
    assert sorted(shards) == [0, 1] and set(shards.values()) == alive  # a dock shard per node
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    first = sum(r["reward_mean"] for r in rows[:5]) / 5
    last = sum(r["reward_mean"] for r in rows[-5:]) / 5
    print(f"reward_mean: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last > first + 0.05, (first, last)  # it learns across two nodes (0.081 -> 0.236 when written)
    for row in rows:
        assert 0.0 <= row["reward_mean"] <= 1.0 and row["grad_norm"] > 0  # each step trained
        assert row["dock/actor_train/rows"] == 64 * 8  # both replicas read their planned rows

    trainer = Trainer(config, run, resume=resume_point(run, config))  # as `train(resume=True)` builds it
    try:
        assert trainer.step == STEPS - 1
        dock = trainer.dock
        assert isinstance(dock, ShardedDockClient) and len(set(dock.shard_nodes)) == 2  # a shard per node

        def kill_shard_1(metrics: dict[str, Any]) -> None:  # after the last step, before its checkpoint
            if metrics["step"] == STEPS:
                kill_and_wait(dock.shards[1])

        lost = rf"dock's shard 1 on node 127\.0\.0\.1 \(id {dock.shard_nodes[1][:12]}\) is lost"
        with pytest.raises((DockShardLostError, StageError), match=lost):
            trainer.fit(on_step=kill_shard_1)
    finally:
        trainer.close()
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == [before_last]

    lines.clear()
    result = train(config, run, resume=True, on_startup=lines.append)
    assert json.loads((run / "resumed_from.json").read_text())["step"] == STEPS - 1
    assert result.steps == STEPS and [r["step"] for r in result.history] == [STEPS]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, STEPS + 1))  # once
    assert len({node for _, node in _replica_nodes(lines).values()}) == 2  # both nodes again


def test_async_rollout_and_training_on_different_nodes(ray_cluster: Any, tmp_path: Path) -> None:
    """entrepot-cli's configs/async-ray-cluster.yaml on the cluster (nodes started with train_node and
    rollout_node, as its header says), 3 small steps: the actor on one node, the rollout rank on the
    other, each update's weights over the signed weight channel between them."""
    from entrepot.grpo.trainer import Trainer

    example = Path(__file__).resolve().parents[3] / "packages" / "cli" / "configs" / "async-ray-cluster.yaml"
    config = load_config(
        example, [*SMALL, "rollout.prompts_per_step=8", "max_steps=3", "checkpoint.save_every=0"]
    )
    trainer = Trainer(config, tmp_path / "run")
    try:
        actor_node = trainer.actors.placement.nodes[0]  # type: ignore[attr-defined]
        rollout_node = trainer.grpo_step.sampling.rollouts.placement.nodes[0]  # type: ignore[attr-defined]
        rows = trainer.fit()
    finally:
        trainer.close()
    print(f"actor on {actor_node}, rollout on {rollout_node}")
    assert actor_node.node_id != rollout_node.node_id  # training and rollout on different nodes
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["async/channel_gbps"] > 0 for r in rows)  # the weights crossed between the nodes
    ages = {k for r in rows for k, v in r.items() if k.startswith("async/tokens_age_") and v}
    assert ages <= {"async/tokens_age_0", "async/tokens_age_1"}
