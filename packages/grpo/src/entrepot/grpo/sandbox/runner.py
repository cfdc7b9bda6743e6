"""Run a Python program against its tests in a child process, and many programs at once.

One run: a fresh temporary directory (removed after) holding the program and its tests; the launcher
(`_launcher.py`) started with ``python -I -S`` (no site-packages, no user directory, no PYTHON*
variables), a minimal environment (PATH, LANG, HOME, TMPDIR, PYTHONHASHSEED: nothing of the parent's,
so no secret), stdin from /dev/null, stdout and stderr into an unnamed file capped by RLIMIT_FSIZE, in
a session of its own. At the wall deadline every process of the session, and the pid namespace's
pid 1 (which takes the namespace with it), gets SIGKILL. The verdict is read from the harness's report
(`verdicts.read_verdict`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from entrepot.grpo.sandbox.isolation import isolation
from entrepot.grpo.sandbox.limits import SandboxLimits
from entrepot.grpo.sandbox.verdicts import SandboxResult, read_verdict

__all__ = ["run_many", "run_program"]

_HERE = Path(__file__).parent
_OUTPUT_HEAD = 4096  # bytes of a program's output kept in its result
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8"}  # fmt: skip


def run_program(
    program: str, tests: Sequence[str], limits: SandboxLimits, *, isolate: bool | None = None
) -> SandboxResult:
    """Run `program`, then each of `tests` (Python sources, each one test), under `limits`.

    Args:
        program: the program's source.
        tests: the tests' sources, run in the program's namespace in order.
        limits: what the run may use.
        isolate: run in namespaces of its own (network, filesystem, processes); None: when this
            machine allows it (`isolation()`). True where it does not is `SandboxError`.

    Returns:
        The verdict, within `limits.timeout_s` plus the start and the clean-up.
    """
    if isolate is None:
        isolate = isolation().available
    elif isolate:
        isolation().require()
    with tempfile.TemporaryDirectory(prefix="entrepot-sandbox-") as root:
        base = Path(root)
        (base / "program.py").write_text(program, encoding="utf-8")
        (base / "tests.json").write_text(json.dumps(list(tests)), encoding="utf-8")
        workdir = base / "work"
        workdir.mkdir()
        with tempfile.TemporaryFile(dir=root) as output, tempfile.TemporaryFile(dir=root) as report:
            started = time.monotonic()
            returncode, timed_out = _launch(base, workdir, limits, isolate, output, report)
            seconds = time.monotonic() - started
            report.seek(0)
            text = report.read(1 << 16).decode("utf-8", "replace")
            output.seek(0)
            head = output.read(_OUTPUT_HEAD).decode("utf-8", "replace")
    verdict, passed = read_verdict(text, len(tests), timed_out=timed_out, returncode=returncode)
    return SandboxResult(verdict, passed, len(tests), seconds, returncode, head, isolate)


def _launch(
    base: Path, workdir: Path, limits: SandboxLimits, isolate: bool, output: IO[bytes], report: IO[bytes]
) -> tuple[int | None, bool]:
    """Start the launcher, wait until it ends or the deadline passes; (exit status, timed out)."""
    fd = report.fileno()
    spec = {
        "isolate": isolate,
        "workdir": str(workdir),
        "disk_mb": limits.disk_mb,
        "limits": limits.rlimits(),
        "harness": str(_HERE / "_harness.py"),
        "harness_args": [str(fd), str(base / "program.py"), str(base / "tests.json")],
    }
    env = {**_ENV, "HOME": str(workdir), "TMPDIR": str(workdir)}
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", str(_HERE / "_launcher.py"), json.dumps(spec)],
        stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, pass_fds=(fd,), env=env,
        cwd=base, start_new_session=True,
    )  # fmt: skip
    timed_out = False
    try:
        proc.wait(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_namespace(proc.pid)
    _kill_group(proc.pid)  # what the program left behind in its session (forks outlive their parent)
    proc.wait()
    return proc.returncode, timed_out


def _kill_namespace(pid: int) -> None:
    """SIGKILL the launcher's children: the pid namespace's pid 1 among them, whose death ends every
    process in the namespace, even one that left the session."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(child), signal.SIGKILL)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_many(
    programs: Sequence[str], tests: Sequence[Sequence[str]], limits: SandboxLimits, *, max_workers: int = 8,
    isolate: bool | None = None,
) -> list[SandboxResult]:  # fmt: skip
    """`run_program` on each (program, tests) pair, `max_workers` at a time: a batch of N takes about
    ceil(N / max_workers) deadlines, not N."""
    if len(programs) != len(tests):
        raise ValueError(f"{len(programs)} programs but {len(tests)} test lists")
    if isolate is None:
        isolate = isolation().available  # probed once, before the threads start
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(programs) or 1))) as pool:
        futures = [
            pool.submit(run_program, p, t, limits, isolate=isolate)
            for p, t in zip(programs, tests, strict=True)
        ]
        return [f.result() for f in futures]
