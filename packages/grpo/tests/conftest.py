"""Test setup: single-threaded torch, this folder importable (user verifiers by dotted path), Ray."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def ray_session():  # type: ignore[no-untyped-def]
    """A local Ray whose workers run single-threaded torch and can import this folder's test verifiers."""
    ray = pytest.importorskip("ray")
    from entrepot.grpo.config import ThreadsConfig
    from entrepot.grpo.embedded.threads import worker_env

    env = {**worker_env(ThreadsConfig()), "PYTHONPATH": str(Path(__file__).parent)}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    yield ray
    ray.shutdown()
