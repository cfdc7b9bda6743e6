"""How a run is deployed where it starts: Ray or one process, a cluster or a local Ray.

The config declares what the user asked for and reads nothing outside itself; these decisions also
depend on the environment (``RAY_ADDRESS``) and the machine (the CPU cores this process may use), so
the same config can run in one process on a laptop and on Ray inside a cluster job. (Threads per
micro-batch, which depend on the cores, are `entrepot.grpo.embedded.lanes.compute_lanes`.) Each function
takes the sections it reads plus that fact, which defaults to this process's, read at the call.
Free of heavy imports: the CLI and `train` call these before torch loads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from entrepot.grpo.config import (
        DockConfig,
        ParallelConfig,
        ResourcesConfig,
    )

__all__ = ["joins_a_cluster", "ray_needs", "uses_ray"]


def _ray_address_env(environ: Mapping[str, str] | None) -> bool:
    return bool((os.environ if environ is None else environ).get("RAY_ADDRESS"))


def ray_needs(
    resources: ResourcesConfig,
    parallel: ParallelConfig,
    dock: DockConfig,
    *,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """Why this run needs Ray workers (empty: one process can run it).

    Args:
        environ: where ``RAY_ADDRESS`` is read; None: this process's environment.
    """
    world = resources.num_actor_workers * parallel.train.model_parallel
    needs = [
        (world > 1, f"{world} actor ranks (DP x TP x PP)"),
        (resources.num_reward_workers > 1, f"{resources.num_reward_workers} reward workers"),
        (not resources.colocate, "separate workers (resources.colocate=false)"),
        (not resources.blocking, "overlapping stages (resources.blocking=false)"),
        (
            resources.ray_address is not None,
            f"a cluster address (resources.ray_address={resources.ray_address})",
        ),
        (_ray_address_env(environ), "a cluster address (RAY_ADDRESS)"),
        (
            bool(resources.custom_resources_per_worker),
            "Ray custom resources (resources.custom_resources_per_worker)",
        ),
        ((dock.shards or 1) > 1, f"a sharded dock (dock.shards={dock.shards})"),
    ]
    return [why for needed, why in needs if needed]


def uses_ray(
    resources: ResourcesConfig,
    parallel: ParallelConfig,
    dock: DockConfig,
    *,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Whether the workers are Ray actors: `resources.use_ray`, or when null whether the run needs Ray."""
    if resources.use_ray is not None:
        return resources.use_ray
    return bool(ray_needs(resources, parallel, dock, environ=environ))


def joins_a_cluster(resources: ResourcesConfig, *, environ: Mapping[str, str] | None = None) -> bool:
    """Whether `ray.init` attaches to a running cluster (an address in the config or RAY_ADDRESS)."""
    return resources.ray_address is not None or _ray_address_env(environ)
