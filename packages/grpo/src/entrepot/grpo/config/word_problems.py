"""How hard the generated arithmetic word problems are: the `data.word_problems` section."""

from __future__ import annotations

from dataclasses import dataclass, field

from entrepot.grpo.config.fields import check, doc

__all__ = ["WORD_PROBLEM_OPERATIONS", "WordProblemsConfig"]

WORD_PROBLEM_OPERATIONS = "+-x"  # add, take away, multiply


@dataclass(kw_only=True)
class WordProblemsConfig:
    """How hard the generated word problems are: operations per problem, operand range, which operations."""

    steps: int = field(
        default=1,
        metadata=doc("Operations per problem after the starting amount (1 to 3): 1 is one-step, 2 two-step."),
    )
    max_operand: int = field(
        default=10, metadata=doc("Operands are drawn from 1..max_operand (multipliers from 2..min(5, it)).")
    )
    operations: str = field(
        default="+-x",
        metadata=doc("Operations drawn from: any of '+' (buys more), '-' (gives away), 'x' (times as many)."),
    )

    def __post_init__(self) -> None:
        check(1 <= self.steps <= 3, "data.word_problems.steps", self.steps, "between 1 and 3")
        check(
            2 <= self.max_operand <= 1000,
            "data.word_problems.max_operand",
            self.max_operand,
            "between 2 and 1000",
        )
        check(
            bool(self.operations)
            and set(self.operations) <= set(WORD_PROBLEM_OPERATIONS)
            and len(set(self.operations)) == len(self.operations),
            "data.word_problems.operations",
            self.operations,
            f"a non-empty string of distinct characters from {WORD_PROBLEM_OPERATIONS!r}",
        )
        check(
            self.steps == 1 or self.operations != "-",
            "data.word_problems.operations",
            self.operations,
            f"more than '-' when data.word_problems.steps ({self.steps}) > 1 (taking away twice can "
            "leave nothing to take)",
        )
