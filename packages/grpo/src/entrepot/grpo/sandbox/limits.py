"""What one sandboxed program may use: wall and CPU time, memory, output, disk, processes, files."""

from __future__ import annotations

import math
from dataclasses import dataclass

from entrepot.grpo.errors import SandboxError

__all__ = ["SandboxLimits"]


@dataclass(frozen=True, kw_only=True)
class SandboxLimits:
    """Limits of one run; the kernel enforces all but the wall deadline (the runner's SIGKILL).

    Args:
        timeout_s: wall seconds from start to SIGKILL of the whole process group (CPU seconds too).
        memory_mb: address space (RLIMIT_AS); an allocation past it raises MemoryError.
        output_bytes: the largest file the program may write, its stdout and stderr included
            (RLIMIT_FSIZE); a write past it raises OSError (File too large).
        disk_mb: size of the private tmpfs working directory (with network isolation only).
        processes: RLIMIT_NPROC (not enforced by the kernel for root: the seccomp filter is).
        open_files: RLIMIT_NOFILE.
    """

    timeout_s: float = 5.0
    memory_mb: int = 512
    output_bytes: int = 1 << 20
    disk_mb: int = 16
    processes: int = 16
    open_files: int = 64

    def __post_init__(self) -> None:
        for name, value, least in (
            ("timeout_s", self.timeout_s, 0.1), ("memory_mb", self.memory_mb, 64),
            ("output_bytes", self.output_bytes, 1024), ("disk_mb", self.disk_mb, 1),
            ("processes", self.processes, 1), ("open_files", self.open_files, 16),
        ):  # fmt: skip
            if not value >= least:
                raise SandboxError(f"sandbox limit {name} ({value!r}) must be >= {least}")

    @property
    def cpu_s(self) -> int:
        """RLIMIT_CPU: the wall deadline rounded up (a busy program is stopped by the kernel too)."""
        return max(1, math.ceil(self.timeout_s))

    def rlimits(self) -> dict[str, int]:
        """The launcher's view of the limits (plain ints, JSON)."""
        return {
            "cpu_s": self.cpu_s,
            "memory_bytes": self.memory_mb << 20,
            "file_bytes": self.output_bytes,
            "processes": self.processes,
            "open_files": self.open_files,
        }
