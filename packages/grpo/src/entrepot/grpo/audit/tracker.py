"""The audit during training: one `AuditTracker` per run, fed each step's metrics and rows, giving the
``hacking/*`` metrics; its history goes into every checkpoint, so a resumed run keeps its baselines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from entrepot.grpo.audit.detectors import DETECTORS, AuditHistory
from entrepot.grpo.audit.signals import format_check, format_explained
from entrepot.grpo.config.audit import AuditConfig

__all__ = ["FLAG_PREFIX", "AuditTracker"]

FLAG_PREFIX = "hacking/flag/"  # + detector: 1.0 on a step it flags
_SERIES = {"reward": "reward_mean", "entropy": "entropy", "kl": "kl", "length": "response_length"}


class AuditTracker:
    """Runs the detectors (`audit.detectors`) on a run's steps.

    Args:
        config: the ``audit`` section.
        task: ``data.task`` (which format-only check applies).
    """

    def __init__(self, config: AuditConfig, task: str) -> None:
        self.config = config
        self.check = format_check(task, config.format_check)
        self.history = AuditHistory()
        self.first: dict[str, int] = {}  # detector -> the first step it flagged

    def formatted(self, responses: Sequence[str], answers: Sequence[str]) -> list[bool]:
        """Whether each response passes the format-only check."""
        return [self.check(r, a) >= 1.0 for r, a in zip(responses, answers, strict=True)]

    def observe(
        self, step: int, metrics: Mapping[str, Any], *, reward: Sequence[float] = (),
        correct: Sequence[bool] = (), formatted: Sequence[bool] | None = None,
    ) -> dict[str, float]:  # fmt: skip
        """Add step `step`'s figures (`metrics`: the step's, its held-out ``accuracy`` when it evaluated;
        per row: reward, correct, formatted) and return its ``hacking/*`` metrics."""
        h = self.history
        for name, key in _SERIES.items():
            if key in metrics:
                getattr(h, name).append(float(metrics[key]))
        if "accuracy" in metrics:
            h.accuracy.append(float(metrics["accuracy"]))
        config = self.config
        h.format_explained = None
        if formatted is not None:
            h.format_explained = format_explained(
                reward, correct, formatted, config.format_min_share, config.format_min_rows
            )
        out: dict[str, float] = {}
        for name, detector in DETECTORS.items():
            value, flagged = detector(h, self.config)
            if value is not None:
                out[f"hacking/{name}"] = float(value)
            if flagged:
                out[FLAG_PREFIX + name] = 1.0
                self.first.setdefault(name, step)
        out["hacking/flagged"] = float(sum(1 for key in out if key.startswith(FLAG_PREFIX)))
        if self.first:
            out["hacking/first_flag_step"] = float(min(self.first.values()))
        return out

    def state(self) -> dict[str, Any]:
        """The history and first flags (JSON), for a checkpoint."""
        return {"history": asdict(self.history), "first": dict(self.first)}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from `state` (a checkpoint without one: from nothing)."""
        if not state:
            return
        self.history = AuditHistory(**state["history"])
        self.first = {str(k): int(v) for k, v in state["first"].items()}
