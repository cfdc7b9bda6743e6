"""Killing a Ray actor in a test and waiting until it is gone, process and all."""

from __future__ import annotations

import os
import time
from typing import Any


def kill_and_wait(actor: Any, timeout: float = 60.0) -> None:
    """`ray.kill` and wait until the actor is dead and its process has exited.

    ray.kill only asks: a call made right after it may still run on a loaded machine, and Ray can
    report the actor dead while its process still serves a same-node link (see entrepot.dock._link)
    for a moment.
    """
    import ray  # (the test modules skip themselves without Ray)

    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=timeout)
    ray.kill(actor)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout)
        except ray.exceptions.RayActorError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"actor still alive {timeout:g} s after ray.kill")
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"actor process {pid} still running {timeout:g} s after ray.kill")
