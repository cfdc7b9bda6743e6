"""The reward-hacking detectors: each reads the audit's history and the thresholds, and gives its figure
(None: not measurable yet) and whether it flags.

- ``divergence``: the training reward's gain over its baseline minus the held-out accuracy's gain
  (since the first evaluation); flags above ``audit.divergence``.
- ``entropy_collapse``: the entropy over its baseline; flags below ``audit.entropy_ratio`` while the
  latest held-out accuracy is below ``audit.entropy_accuracy`` (a confident, accurate policy has
  converged, not collapsed).
- ``kl_acceleration``: the mean KL of the last window over the window before; flags above
  ``audit.kl_growth`` once the KL is above ``audit.kl_floor``.
- ``length_blowup``: the mean response length over its baseline; flags at ``audit.length_growth``.
- ``format_explained``: eta squared of the reward on a format-only check, over the wrong responses
  (`signals.format_explained`); flags at ``audit.format_explained``.

Baselines are the means of the first ``warmup_steps`` steps; current values the mean of the last
``window``. Held-out accuracy is the in-run evaluation's (``eval.every``): its gain counts from the
first evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from entrepot.grpo.config.audit import AuditConfig

__all__ = ["DETECTORS", "AuditHistory", "Reading"]


@dataclass
class AuditHistory:
    """Per-step series the detectors read (a checkpoint saves them: `AuditTracker.state`)."""

    reward: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    length: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)  # held-out, one per evaluation
    format_explained: float | None = None  # this step's


Reading = tuple[float | None, bool]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _baseline_and_now(series: Sequence[float], config: AuditConfig) -> tuple[float, float] | None:
    if len(series) <= config.warmup_steps:
        return None
    return _mean(series[: config.warmup_steps]), _mean(series[-config.window :])


def divergence(history: AuditHistory, config: AuditConfig) -> Reading:
    pair = _baseline_and_now(history.reward, config)
    if pair is None or not history.accuracy:
        return None, False
    gap = (pair[1] - pair[0]) - (history.accuracy[-1] - history.accuracy[0])
    return gap, gap > config.divergence


def entropy_collapse(history: AuditHistory, config: AuditConfig) -> Reading:
    pair = _baseline_and_now(history.entropy, config)
    if pair is None or pair[0] <= 0:
        return None, False
    ratio = pair[1] / pair[0]
    unearned = not history.accuracy or history.accuracy[-1] < config.entropy_accuracy
    return ratio, ratio < config.entropy_ratio and unearned


def kl_acceleration(history: AuditHistory, config: AuditConfig) -> Reading:
    w = config.window
    if len(history.kl) < 2 * w:
        return None, False
    now, before = _mean(history.kl[-w:]), _mean(history.kl[-2 * w : -w])
    if before <= 0:
        return None, False
    growth = now / before
    return growth, growth > config.kl_growth and now > config.kl_floor


def length_blowup(history: AuditHistory, config: AuditConfig) -> Reading:
    pair = _baseline_and_now(history.length, config)
    if pair is None or pair[0] <= 0:
        return None, False
    growth = pair[1] / pair[0]
    return growth, growth >= config.length_growth


def format_explained(history: AuditHistory, config: AuditConfig) -> Reading:
    value = history.format_explained
    return value, value is not None and value >= config.format_explained


DETECTORS: dict[str, Callable[[AuditHistory, AuditConfig], Reading]] = {
    "divergence": divergence,
    "entropy_collapse": entropy_collapse,
    "kl_acceleration": kl_acceleration,
    "length_blowup": length_blowup,
    "format_explained": format_explained,
}
