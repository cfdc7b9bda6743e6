"""Start the run's local Ray (or attach to a cluster) while the trainer's modules import.

`ray.init` spends seconds waiting for Ray's own processes (GCS, raylet, agents) to boot, and the
trainer spends seconds importing torch, transformers and the dock; neither needs the other.
`start_ray_while_importing` does both at once: Ray on this thread (a Ray started from another
thread could not reach its GCS afterwards here), the imports on a helper thread. Kept free of
heavy imports so that it runs before torch loads. A local Ray started here is recorded in the run
folder (`entrepot.grpo.run.ray_session`), so that what a killed run leaves of it can be stopped.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from entrepot.grpo.embedded.threads import worker_env
from entrepot.grpo.errors import RayStartError
from entrepot.grpo.run.deployment import joins_a_cluster
from entrepot.grpo.run.ray_session import record_session

if TYPE_CHECKING:
    from entrepot.grpo.config import GRPOConfig

__all__ = ["WORKER_PRIORITY_ENV", "start_ray", "start_ray_while_importing", "start_timed_out"]

# Ray starts its worker processes at nice 15: beside any CPU-bound process of normal priority (another
# run, a test suite, a user's job) the run's actors then get a few percent of a core and its stages
# time out. A local Ray started here runs them at the driver's priority; the user's own setting wins.
WORKER_PRIORITY_ENV = {"RAY_worker_niceness": "0"}

# What ray.init raises (a bare Exception) when the node it started did not register in time.
_RAY_START_TIMEOUT = "timed out during startup"


def start_ray(config: GRPOConfig, run_dir: str | Path | None) -> None:
    """`ray.init` for the run, unless Ray is already up in this process; a local Ray it starts is
    recorded in `run_dir` (``ray_session.json``; None: a launch without a run folder records none).

    Workers need the thread settings before they import torch. A local Ray started here inherits
    them from this process's environment, and then reuses the worker processes it prestarts
    during `ray.init`: a `runtime_env` would make Ray start fresh ones (seconds each on 2 cores).
    On an existing cluster they travel as the job's `runtime_env`.
    """
    import ray

    if ray.is_initialized():
        return
    env = worker_env(config.threads)
    if joins_a_cluster(config.resources):
        ray.init(address=config.resources.ray_address, runtime_env={"env_vars": env}, include_dashboard=False,
                 logging_level="ERROR", log_to_driver=False)  # fmt: skip
    else:
        os.environ.update(env)
        for key, value in WORKER_PRIORITY_ENV.items():
            os.environ.setdefault(key, value)
        try:
            context = ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        except Exception as exc:
            if _RAY_START_TIMEOUT not in str(exc):
                raise
            ray.shutdown()  # what did start of the node
            raise start_timed_out(os.getloadavg()[0], os.cpu_count() or 1) from exc
        if run_dir is not None:
            record_session(Path(run_dir), context.address_info["session_dir"])


def start_timed_out(load: float, cores: int) -> RayStartError:
    """The error for a local Ray whose node missed Ray's fixed start-up deadlines.

    Ray's raylet waits 15 s for its dashboard agent (a Python process importing Ray's dashboard
    modules) to write its port files and aborts after that; the driver waits 30 s for the raylet.
    Neither is configurable, and on a starved CPU the agent's imports take longer.
    """
    return RayStartError(
        f"Ray's local node did not start: its raylet waits at most 15 s for its dashboard agent and "
        f"the driver 30 s for the raylet, and this machine (load {load:.1f} on {cores} cores) was too "
        "busy for them. Nothing was trained; run again when the machine is less busy, or without Ray "
        "(resources.use_ray=false) where the config allows it"
    )


def start_ray_while_importing(config: GRPOConfig, run_dir: Path, modules: Sequence[str]) -> None:
    """`start_ray` here while a helper thread imports `modules`; an import error is raised here after."""
    errors: list[BaseException] = []

    def load() -> None:
        try:
            for name in modules:
                importlib.import_module(name)
        except BaseException as exc:  # raised on this thread below
            errors.append(exc)

    loader = threading.Thread(target=load, name="import-trainer", daemon=True)
    loader.start()
    try:
        start_ray(config, run_dir)
    finally:
        loader.join()
    if errors:
        raise errors[0]
