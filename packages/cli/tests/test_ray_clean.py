"""`rl ray-clean RUN` stops what a killed run left of the Ray it started, and nothing else.

A real local Ray started for a run folder (`start_ray`, as `rl grpo train` starts it), its driver
SIGKILLed: some of its processes stay (the dashboard and runtime-env agents, idle workers for a
while), and `rl ray-clean` stops every one of them. Stand-in processes check the "nothing else": a
process whose output goes to another session's logs survives. A run whose driver still runs is
refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests_support_rl import rl_env
from typer.testing import CliRunner

from entrepot.cli.app import app
from entrepot.grpo.run.ray_session import RAY_SESSION_FILE, RaySession, read_session, session_processes

pytestmark = pytest.mark.integration  # Ray and other processes

DRIVER = """
import sys, time
from pathlib import Path
from entrepot.grpo import load_config
from entrepot.grpo.run.ray_start import start_ray

run = Path(sys.argv[1])
run.mkdir()
start_ray(load_config(None, ["resources.use_ray=true"]), run)
print("ready", flush=True)
time.sleep(600)
"""


def _record(run: Path, session: Path, driver_pid: int, started: int = 1) -> None:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    run.mkdir(exist_ok=True)
    record = RaySession(str(session), driver_pid, started, boot)
    (run / RAY_SESSION_FILE).write_text(json.dumps(record.__dict__))


def test_a_killed_runs_ray_is_stopped_whole(runner: CliRunner, tmp_path: Path) -> None:
    run = tmp_path / "run"
    command = [sys.executable, "-c", DRIVER, str(run)]
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=rl_env())
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline() == "ready\n"  # Ray is up
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    session = read_session(run)
    assert session is not None and session.driver_pid == driver.pid and not session.driver_alive()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(
        name.startswith("ray::") for name in session_processes(session.session_dir).values()
    ):
        time.sleep(0.2)  # the GCS, the raylet and the monitors die with their parent
    left = session_processes(session.session_dir)
    assert left, "a SIGKILLed driver left no Ray process (nothing to test)"
    result = runner.invoke(app, ["ray-clean", str(run)])
    assert result.exit_code == 0, result.output
    assert f"process(es) of the run's Ray session {session.session_dir}" in result.output
    assert any(f"  {pid} ray::" in result.output for pid in left)  # the leftovers, stopped by it
    assert session_processes(session.session_dir) == {}
    assert not (run / RAY_SESSION_FILE).exists()
    again = runner.invoke(app, ["ray-clean", str(run)])
    assert again.exit_code == 0 and "nothing to stop" in again.output


def test_only_the_runs_own_session_is_stopped(runner: CliRunner, tmp_path: Path) -> None:
    ours, theirs = tmp_path / "session_ours", tmp_path / "session_theirs"
    for session in (ours, theirs):
        (session / "logs").mkdir(parents=True)
    exited = subprocess.Popen(["true"])
    exited.wait()
    _record(tmp_path / "run", ours, exited.pid)
    with (ours / "logs/agent.out").open("w") as out, (theirs / "logs/agent.out").open("w") as other:
        leftover = subprocess.Popen(["sleep", "120"], stdout=out)
        bystander = subprocess.Popen(["sleep", "120"], stdout=other)
    try:
        result = runner.invoke(app, ["ray-clean", str(tmp_path / "run")])
        assert result.exit_code == 0, result.output
        assert f"  {leftover.pid} sleep" in result.output
        assert leftover.wait(5) == -signal.SIGTERM and bystander.poll() is None
    finally:
        for process in (leftover, bystander):
            process.kill()
            process.wait()


def test_a_run_whose_driver_still_runs_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    started = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
    _record(tmp_path / "run", tmp_path / "session", os.getpid(), int(started))
    result = runner.invoke(app, ["ray-clean", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {str(tmp_path / 'run')!r}: the run that started its Ray is still running "
        f"(pid {os.getpid()}); stop it with Ctrl-C, which stops its Ray too"
    )
    assert (tmp_path / "run" / RAY_SESSION_FILE).exists()
