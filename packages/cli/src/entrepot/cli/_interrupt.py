"""Ctrl-C for `rl grpo train`: the first one stops at the end of the running step, the second at once.

A step moves rows through the dock and the workers; stopping in the middle of one would leave that
step half done in the checkpoint. So the first SIGINT only sets a flag, the trainer's `on_step`
callback (run after every finished step) raises KeyboardInterrupt, and entrepot.grpo saves a
checkpoint at that clean boundary. A second Ctrl-C raises KeyboardInterrupt right away.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any


class StepBoundaryInterrupt:
    """Context manager installing the two-stage SIGINT handler; `check()` raises after the first one."""

    def __init__(self, notify: Callable[[str], None]) -> None:
        self.notify = notify
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StepBoundaryInterrupt:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.notify("Ctrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to stop now)")

    def check(self) -> None:
        """Raise KeyboardInterrupt if Ctrl-C was pressed (call at a step boundary)."""
        if self.requested:
            raise KeyboardInterrupt
