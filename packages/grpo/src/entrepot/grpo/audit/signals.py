"""What the audit measures on one batch of responses: how much of the reward a format-only check explains.

Among the *wrong* responses (the accuracy verifier says no), a reward that pays for the answer still
varies with how close each one came; a reward that pays for the format is constant on each side of a
format-only check. The share of the reward's variance the check explains there (eta squared: between
the two sides over the total) is 1 for a format-paying reward and well below for an honest one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from entrepot.grpo.data import rewards
from entrepot.grpo.data.tasks import SYNTHETIC_TASKS

__all__ = ["answer_shape", "format_check", "format_explained"]


def answer_shape(response: str, answer: str) -> float:
    """1 if the stripped response looks like the answer (its width, digits where it has digits): the
    format-only check of the synthetic tasks, blind to whether the digits are right."""
    text = response.strip()
    return float(
        len(text) == len(answer)
        and all(a.isdigit() == r.isdigit() for a, r in zip(answer, text, strict=False))
    )


def format_check(task: str, name: str | None) -> Callable[[str, str], float]:
    """The format-only check: verifier `name`, or the task's (synthetic: `answer_shape`; else ``format``)."""
    if name is not None:
        return rewards.get_verifier(name)
    return answer_shape if task in SYNTHETIC_TASKS else rewards.get_verifier("format")


def format_explained(
    reward: Sequence[float],
    correct: Sequence[bool],
    formatted: Sequence[bool],
    min_share: float,
    min_rows: int = 8,
) -> float | None:
    """Eta squared of `reward` on `formatted` over the wrong responses; None when either side holds less
    than `min_share` of them or fewer than `min_rows`, or their reward does not vary."""
    wrong = [(r, f) for r, c, f in zip(reward, correct, formatted, strict=True) if not c]
    sides = [[r for r, f in wrong if f], [r for r, f in wrong if not f]]
    if any(len(side) < max(min_rows, min_share * len(wrong)) for side in sides):
        return None
    values = [r for r, _ in wrong]
    mean = sum(values) / len(values)
    total = sum((r - mean) ** 2 for r in values)
    if total <= 1e-12:
        return None
    between = sum(len(side) * (sum(side) / len(side) - mean) ** 2 for side in sides)
    return between / total
