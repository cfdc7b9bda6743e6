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
from entrepot.grpo.run.deployment import joins_a_cluster
from entrepot.grpo.run.ray_session import record_session

if TYPE_CHECKING:
    from entrepot.grpo.config import GRPOConfig

__all__ = ["start_ray", "start_ray_while_importing"]


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
        context = ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        if run_dir is not None:
            record_session(Path(run_dir), context.address_info["session_dir"])


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
