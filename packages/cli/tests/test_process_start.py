"""`process_started_at`: the summary's times count from the process's start, not from an import."""

from __future__ import annotations

import time

from entrepot.cli._train import process_started_at

IMPORTED_AT = time.perf_counter()  # pytest had been running for a while by now


def test_the_process_start_is_before_this_test_module_was_imported() -> None:
    started = process_started_at()
    assert started < IMPORTED_AT - 0.02  # /proc's clock ticks are 10 ms
    assert time.perf_counter() - started < 24 * 3600
