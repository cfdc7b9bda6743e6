"""A local Ray that misses Ray's own start-up deadlines ends `rl grpo train` with one line, not a traceback.

Ray's raylet waits at most 15 s for its dashboard agent (a Python process that imports Ray's
dashboard modules) to write its port files, then aborts; the driver's `ray.init` gives up 30 s
later. On a starved CPU (a second copy of the test suite beside this one, load 20 on 2 cores) the
agent's imports take longer than that, and the run died in `ray.init` with Ray's traceback. Here
the agent is made slow for real: a `sitecustomize` on the agent's PYTHONPATH sleeps in that
process only, before its imports.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tests_support_rl import rl_command, rl_env

pytestmark = pytest.mark.integration  # Ray and a training process

SLOW_AGENT = """
import sys, time
if sys.argv and sys.argv[0].endswith("dashboard/agent.py"):
    time.sleep(60)  # past the raylet's 15 s wait for the agent's ports
"""


def test_a_ray_that_does_not_start_in_time_is_one_line_naming_the_load(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_AGENT)
    env = rl_env()
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(site)
    done = subprocess.run(
        rl_command("grpo", "train", "-o", str(tmp_path / "runs"), "--max-steps", "1", "--quiet",
                   "resources.use_ray=true"),
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 2, output  # rl's exit code for an error it explains on one line
    assert "error: Ray's local node did not start" in " ".join(output.split()), output
    assert "resources.use_ray=false" in output and "cores)" in output, output
    assert "Traceback" not in output, output
    assert not list((tmp_path / "runs").glob("*/metrics.jsonl"))


WORKER_NICENESS = """
import os
from entrepot.grpo import load_config
from entrepot.grpo.run.ray_start import start_ray
import ray

start_ray(load_config(None, ["resources.use_ray=true"]), None)
print("niceness", ray.get(ray.remote(lambda: os.nice(0)).remote()), os.nice(0))
"""


def test_the_runs_ray_workers_run_at_the_drivers_priority() -> None:
    """Ray starts its workers at nice 15: beside a CPU-bound neighbour of normal priority (a second
    test suite on the machine) a dock test's producer actor got so little CPU that a consumer's 60 s
    wait ran out. A run's local Ray starts them at the driver's priority."""
    import sys

    env = {key: value for key, value in rl_env().items() if key != "RAY_worker_niceness"}
    done = subprocess.run([sys.executable, "-c", WORKER_NICENESS], capture_output=True, text=True, env=env,
                          timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "niceness 0 0" in done.stdout, done.stdout + done.stderr
