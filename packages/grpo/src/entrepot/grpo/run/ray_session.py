"""The local Ray a run starts, recorded in its folder, so that a killed run's leftovers can be stopped.

A run that starts a Ray of its own (not one that joins a cluster) writes ``ray_session.json`` into
its folder: Ray's session directory, and the driver's pid, start time and boot. Ray's GCS and raylet
die with a SIGKILLed driver, but its dashboard and runtime-env agents and its workers can stay.
`stop_leftovers` stops exactly the processes of that session once its driver is gone: those with a
file open inside the session directory (Ray sends every process's output, workers' included, to
``<session>/logs``), so another run's Ray on the same machine is left alone (``ray stop`` would stop
it too). `train(..., resume=True)` calls it before starting, and ``rl ray-clean RUN`` on demand.
Reads /proc (Linux); imports no Ray.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "RAY_SESSION_FILE",
    "RaySession",
    "read_session",
    "record_session",
    "session_processes",
    "stop_leftovers",
]

RAY_SESSION_FILE = "ray_session.json"
_PROC = Path("/proc")


def _boot_id() -> str:
    return (_PROC / "sys/kernel/random/boot_id").read_text().strip()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a process, or None if it is gone."""
    try:
        fields = (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)


@dataclass(frozen=True)
class RaySession:
    """A local Ray session and the driver that started it (pid reuse told apart by start time)."""

    session_dir: str
    driver_pid: int
    driver_started: int
    boot_id: str

    def driver_alive(self) -> bool:
        """Whether the driver that started the session still runs (this boot, same start time)."""
        stat = _stat(self.driver_pid)
        alive = stat is not None and stat[0] != "Z" and stat[1] == self.driver_started
        return alive and self.boot_id == _boot_id()


def record_session(run_dir: Path, session_dir: str) -> RaySession:
    """Write ``ray_session.json`` for the Ray this process just started (`session_dir` is Ray's)."""
    stat = _stat(os.getpid())
    assert stat is not None  # this process
    session = RaySession(session_dir, os.getpid(), stat[1], _boot_id())
    (run_dir / RAY_SESSION_FILE).write_text(json.dumps(asdict(session), indent=1))
    return session


def read_session(run_dir: Path) -> RaySession | None:
    """The Ray session recorded in a run folder, or None (the run started no Ray of its own)."""
    path = run_dir / RAY_SESSION_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    pid, started = int(record["driver_pid"]), int(record["driver_started"])
    return RaySession(str(record["session_dir"]), pid, started, str(record["boot_id"]))


def session_processes(session_dir: str) -> dict[int, str]:
    """pid -> name of the live processes (other than this one) with a file open inside `session_dir`."""
    inside = session_dir.rstrip("/") + "/"
    found: dict[int, str] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
            name = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:  # gone, or another user's
            continue
        stat = _stat(int(entry.name))
        if stat is not None and stat[0] != "Z" and any(link.startswith(inside) for link in links):
            found[int(entry.name)] = name.strip() or entry.name
    return found


def stop_leftovers(run_dir: Path, grace_s: float = 1.0) -> list[str]:
    """Stop the processes the run's recorded Ray session left behind when its driver was killed.

    SIGTERM, then SIGKILL for those still running after `grace_s`; the record is removed once they
    are gone. Returns "pid name" of each process stopped: none when the folder records no session or
    its driver still runs (a live run's Ray is not touched).
    """
    session = read_session(run_dir)
    if session is None or session.driver_alive():
        return []
    processes = (
        {pid: (name, _stat(pid)) for pid, name in session_processes(session.session_dir).items()}
        if session.boot_id == _boot_id()
        else {}  # a reboot ended them all
    )

    def running() -> list[int]:
        return [pid for pid, (_, first) in processes.items() if (now := _stat(pid)) is not None
                and now[0] != "Z" and first is not None and now[1] == first[1]]  # fmt: skip

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in running():
            with contextlib.suppress(ProcessLookupError):  # exited since
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while running() and time.monotonic() < deadline:
            time.sleep(0.05)
    (run_dir / RAY_SESSION_FILE).unlink()
    return [f"{pid} {name}" for pid, (name, _) in sorted(processes.items())]
