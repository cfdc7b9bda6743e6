"""On-policy distillation: the `algorithm.distill` section (formulas: the grpo docs' distillation page).

A teacher scores the rollout's own tokens; each model token t of a response gets the advantage
A_t = reward_weight * A_seq + coef * (log p_teacher(y_t) - log p_student(y_t)), both log-probs at the
rollout's temperature. Off (`teacher: null`) the step is GRPO exactly as without the section.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from entrepot.grpo.config.fields import check, doc

__all__ = ["DistillConfig"]


@dataclass(kw_only=True)
class DistillConfig:
    """The teacher and the weights of the per-token reverse-KL advantage and of the reward's."""

    teacher: str | None = field(
        default=None,
        metadata=doc(
            "The teacher: a local HF model directory, an Entrepot checkpoint (checkpoints/step_N) or a "
            "run directory (its newest complete checkpoint). Same vocabulary as the policy. null = no "
            "distillation."
        ),
    )
    coef: float = field(
        default=1.0,
        metadata=doc(
            "Weight of the per-token reverse-KL advantage coef * (teacher log-prob - student log-prob)."
        ),
    )
    reward_weight: float = field(
        default=0.0,
        metadata=doc(
            "Weight of the usual per-response advantage (algorithm.advantage) in each token's "
            "advantage; 0 = pure distillation (the reward stage still runs and is logged)."
        ),
    )
    teachers: dict[str, str] = field(
        default_factory=dict,
        metadata=doc("A teacher per data column value (with teacher_column): not built yet, must be empty."),
    )
    teacher_column: str | None = field(
        default=None, metadata=doc("The data column choosing a row's teacher in teachers: not built yet.")
    )

    def __post_init__(self) -> None:
        if self.teacher is not None:
            check(bool(self.teacher), "algorithm.distill.teacher", self.teacher, "a path or null")
        check(self.coef >= 0, "algorithm.distill.coef", self.coef, ">= 0")
        check(self.reward_weight >= 0, "algorithm.distill.reward_weight", self.reward_weight, ">= 0")
        check(self.coef > 0 or self.reward_weight > 0 or self.teacher is None, "algorithm.distill.coef",
              self.coef, "> 0 when algorithm.distill.reward_weight is 0 (no advantage is left)")  # fmt: skip
        why = "a teacher per row (teachers + teacher_column) is not built yet; use teacher"
        check(not self.teachers, "algorithm.distill.teachers", self.teachers, f"empty: {why}")
        check(self.teacher_column is None, "algorithm.distill.teacher_column", self.teacher_column,
              f"null: {why}")  # fmt: skip

    @property
    def enabled(self) -> bool:
        """Whether a teacher scores the rollouts."""
        return self.teacher is not None
