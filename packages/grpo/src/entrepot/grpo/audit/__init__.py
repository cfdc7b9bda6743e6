"""The reward-hacking audit: detectors of a reward that pays for something other than the task.

- `signals`: what one batch of responses shows (the format-only check's share of the reward).
- `detectors`: the detectors and their thresholds (the ``audit`` config section), as a table.
- `tracker`: `AuditTracker`, fed every training step, giving ``hacking/*`` metrics; checkpointed.
- `snapshot`: the audit of one evaluation (`rl eval`).
"""

from __future__ import annotations

from entrepot.grpo.audit.detectors import DETECTORS, AuditHistory
from entrepot.grpo.audit.signals import answer_shape, format_check, format_explained
from entrepot.grpo.audit.tracker import FLAG_PREFIX, AuditTracker

__all__ = [
    "DETECTORS",
    "FLAG_PREFIX",
    "AuditHistory",
    "AuditTracker",
    "answer_shape",
    "format_check",
    "format_explained",
]
