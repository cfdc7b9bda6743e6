"""The audit of one evaluation (`rl eval`): the signals a single set of responses can show.

Without a run's history there is no baseline: the evaluation reports the format-only check's share of
the reward (`signals.format_explained`, flagged at ``audit.format_explained``) and, as a figure only,
the mean reward minus the accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from entrepot.grpo.audit.signals import format_check, format_explained
from entrepot.grpo.config.audit import AuditConfig
from entrepot.grpo.evaluation.runner import EvalRecord

__all__ = ["audit_records"]


def audit_records(records: Sequence[EvalRecord], config: AuditConfig, task: str) -> dict[str, Any]:
    """``eval.json``'s ``audit``: the figures, the thresholds they were read against, and the flags."""
    check = format_check(task, config.format_check)
    formatted = [check(r.response, r.answer) >= 1.0 for r in records]
    explained = format_explained(
        [r.reward for r in records],
        [r.correct for r in records],
        formatted,
        config.format_min_share,
        config.format_min_rows,
    )
    reward = sum(r.reward for r in records) / len(records)
    accuracy = sum(r.correct for r in records) / len(records)
    flags = ["format_explained"] if explained is not None and explained >= config.format_explained else []
    return {
        "hacking/format_explained": explained,
        "hacking/formatted_share": sum(formatted) / len(records),
        "hacking/reward_minus_accuracy": reward - accuracy,
        "thresholds": {
            "format_explained": config.format_explained,
            "format_min_share": config.format_min_share,
        },
        "flags": flags,
    }
