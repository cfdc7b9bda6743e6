"""Whether this machine lets the sandbox isolate a program: probed once per process, never assumed.

The probe runs one trivial program through the full isolation (`_launcher.py`: user, network, mount
and pid namespaces, a read-only filesystem, the seccomp filter). Where any step fails (a kernel
without unprivileged user namespaces, a container that forbids them) programs run under the resource
limits only, and every result says so (`SandboxResult.isolated`, the `reward/code_isolated` metric);
a run that sets ``reward.code.require_isolation`` is refused instead.
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from entrepot.grpo.errors import SandboxError
from entrepot.grpo.sandbox.limits import SandboxLimits

__all__ = ["Isolation", "isolation"]

_log = logging.getLogger(__name__)
_HERE = Path(__file__).parent


@dataclass(frozen=True)
class Isolation:
    """The probe's answer: `available`, or the `reason` (the failed step) why not."""

    available: bool
    reason: str = ""

    def require(self) -> None:
        """Raise `SandboxError` with the reason unless isolation is available."""
        if not self.available:
            raise SandboxError(f"the sandbox cannot isolate programs on this machine: {self.reason}")


@functools.cache
def isolation() -> Isolation:
    """Probe once (about 0.1 s) whether the launcher's isolation works here; log a warning if not."""
    import tempfile

    limits = SandboxLimits()
    with tempfile.TemporaryDirectory(prefix="entrepot-sandbox-probe-") as root:
        (Path(root) / "program.py").write_text("")
        (Path(root) / "tests.json").write_text("[]")
        (Path(root) / "work").mkdir()
        spec = {
            "isolate": True, "workdir": str(Path(root) / "work"), "disk_mb": 1, "limits": limits.rlimits(),
            "harness": str(_HERE / "_harness.py"),
            "harness_args": ["1", str(Path(root) / "program.py"), str(Path(root) / "tests.json")],
        }  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-B", str(_HERE / "_launcher.py"), json.dumps(spec)],
            capture_output=True, env={"PATH": "/usr/bin:/bin"}, timeout=30, check=False,
        )  # fmt: skip
    if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [b"done"]:
        return Isolation(True)
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    reason = lines[-1] if lines else f"exit status {done.returncode}"
    _log.warning("sandbox: no isolation on this machine (%s); programs run under the limits only", reason)
    return Isolation(False, reason)
