"""Two-stage Ctrl-C: the first SIGINT waits for the step boundary, the second interrupts at once."""

from __future__ import annotations

import signal

import pytest

from entrepot.cli._interrupt import StepBoundaryInterrupt


def test_first_sigint_is_deferred_to_check_and_second_raises_at_once() -> None:
    before = signal.getsignal(signal.SIGINT)
    notes: list[str] = []
    with StepBoundaryInterrupt(notes.append) as interrupt:
        interrupt.check()  # nothing pressed yet
        signal.raise_signal(signal.SIGINT)  # runs the handler in this (main) thread
        assert interrupt.requested
        assert notes and "stopping after this step" in notes[0]
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
