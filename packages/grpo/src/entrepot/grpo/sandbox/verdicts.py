"""What a sandboxed run ended as: one verdict of six, the tests passed, and how the verdict is read."""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass

__all__ = ["SandboxResult", "Verdict", "read_verdict"]


class Verdict(enum.StrEnum):
    """How a program's run against its tests ended (the value is its name in metrics and configs)."""

    PASS = "pass"  # every test passed
    FAIL = "fail"  # every test ran; at least one failed (an assert, an exception, a sys.exit)
    TIMEOUT = "timeout"  # killed at the wall deadline, or by the CPU-time limit
    CRASH = "crash"  # raised at its top level, or the process died before the tests ended
    MEMORY = "memory"  # ran out of address space (MemoryError) loading or in a test
    SYNTAX = "syntax"  # the program does not compile


@dataclass(frozen=True)
class SandboxResult:
    """One run: its verdict, `passed` of `total` tests, wall `seconds`, the first bytes of its output,
    and whether it ran in namespaces of its own (`isolated`; False: the limits only)."""

    verdict: Verdict
    passed: int
    total: int
    seconds: float
    returncode: int | None
    output: str
    isolated: bool

    @property
    def credit(self) -> float:
        """Passed tests / total tests."""
        return self.passed / self.total if self.total else 0.0


def read_verdict(report: str, total: int, *, timed_out: bool, returncode: int | None) -> tuple[Verdict, int]:
    """The verdict and the passed-test count from the harness's report lines (`_harness.py`), the
    runner's deadline and the exit status (negative: the signal that ended the run)."""
    lines = report.splitlines()
    passed = len({line.split()[1] for line in lines if line.startswith("pass ")})
    if "syntax" in lines:
        return Verdict.SYNTAX, 0
    if any(line == "memory" or line.startswith("memory ") for line in lines):
        return Verdict.MEMORY, passed
    if "done" in lines:
        return (Verdict.PASS if passed == total else Verdict.FAIL), passed
    if timed_out or returncode == -signal.SIGXCPU:
        return Verdict.TIMEOUT, passed
    return Verdict.CRASH, passed
