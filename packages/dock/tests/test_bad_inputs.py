"""The bad-input catalogue on one in-process dock: each call raises its typed error and changes nothing.

The same table runs through Ray and a sharded dock in test_sharded_parity.py (integration tier).
"""

from __future__ import annotations

from typing import Any

import pytest
from tests_support_bad_inputs import CATALOGUE, DOCK_KWARGS, Case, assert_same_state, check_outcome, prepare

from entrepot.dock import ExperienceDock


def _state(dock: ExperienceDock) -> tuple[dict[str, Any], dict[str, float]]:
    """The whole state_dict (data and counters) and the metrics, less the seconds spent waiting."""
    state = dock.state_dict()
    state.pop("wait_s")
    metrics = {key: value for key, value in dock.metrics().items() if not key.startswith("dock/wait_s/")}
    return state, metrics


@pytest.mark.parametrize("case", CATALOGUE, ids=lambda case: f"{case.method}: {case.name}")
def test_a_bad_call_raises_its_typed_error_and_changes_nothing(case: Case) -> None:
    dock = ExperienceDock(**DOCK_KWARGS)
    leases = prepare(lambda method, *args, **kwargs: getattr(dock, method)(*args, **kwargs))
    before = _state(dock)
    args, kwargs = case.call_for(leases)
    try:
        getattr(dock, case.method)(*args, **kwargs)
        error = None
    except Exception as raised:
        error = raised
    problem = check_outcome(case, error)
    assert problem is None, problem
    after = _state(dock)
    assert_same_state(before[0], after[0])
    assert before[1] == after[1]
