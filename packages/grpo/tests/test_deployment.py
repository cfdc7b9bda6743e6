"""`run.deployment`: Ray or one process, and a cluster or a local Ray, from the sections plus RAY_ADDRESS."""

from __future__ import annotations

import pytest

from entrepot.grpo import load_config
from entrepot.grpo.run.deployment import joins_a_cluster, ray_needs, uses_ray


def _uses_ray(overrides: list[str], environ: dict[str, str]) -> bool:
    config = load_config(None, overrides)
    return uses_ray(config.resources, config.parallel, config.dock, environ=environ)


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["resources.num_actor_workers=2"], "2 actor ranks (DP x TP x PP)"),
        (["engine.train=megatron", "parallel.train.tensor=2"], "2 actor ranks (DP x TP x PP)"),
        (["resources.num_reward_workers=2"], "2 reward workers"),
        (["resources.colocate=false"], "separate workers (resources.colocate=false)"),
        (["resources.blocking=false"], "overlapping stages (resources.blocking=false)"),
        (["resources.ray_address=auto"], "a cluster address (resources.ray_address=auto)"),
        (["resources.custom_resources_per_worker={NPU: 1}"], "Ray custom resources"),
        (["dock.shards=2"], "a sharded dock (dock.shards=2)"),
    ],
)
def test_a_run_uses_ray_when_it_needs_it_and_says_why(overrides: list[str], why: str) -> None:
    config = load_config(None, overrides)
    needs = ray_needs(config.resources, config.parallel, config.dock, environ={})
    assert len(needs) == 1 and needs[0].startswith(why), needs
    assert _uses_ray(overrides, {})


def test_the_default_runs_in_one_process_unless_ray_address_is_set() -> None:
    assert not _uses_ray([], {})
    assert _uses_ray([], {"RAY_ADDRESS": "10.0.0.8:6379"})
    assert not _uses_ray(["resources.use_ray=false"], {"RAY_ADDRESS": "10.0.0.8:6379"})  # forced wins
    assert _uses_ray(["resources.use_ray=true"], {})
    assert not _uses_ray([], {"RAY_ADDRESS": ""})  # set but empty: no address


def test_a_cluster_is_joined_from_the_config_or_ray_address() -> None:
    local = load_config(None, []).resources
    remote = load_config(None, ["resources.ray_address=auto"]).resources
    assert not joins_a_cluster(local, environ={})
    assert joins_a_cluster(local, environ={"RAY_ADDRESS": "10.0.0.8:6379"})
    assert joins_a_cluster(remote, environ={})
