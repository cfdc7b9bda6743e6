"""The built-in multi-turn task: addition with a calculator tool, learnable from scratch on CPU.

The prompts are the addition task's (``1234+5678=``, `data.task: addition`). The model may answer at
once (a turn of digits), or first call the calculator (at most `max_calls` times): a turn ending
with ``#``, which ends the turn as a closing tag ends a tool call. ``#`` alone adds the question's
numbers, ``a+b#`` those; the tool answers anything else with ``?``. The model reads the result
(``>06912=``: the tool's message in the character chat format) and then answers. The reward is the
answer's partial credit (the fraction of its digits that are right) plus `call_bonus` when the
answer follows a call the tool answered. Tool use is reported as ``env/tool_calls``, exact answers
as accuracy (``Step.info["correct"]``).

Why the bonus: a randomly initialised model learns the cheap part of adding at once (the leading
``0`` or ``1``, a digit or two), and before it has learned to copy the tool's result, a trajectory
through the tool scores below one that answers at once; GRPO then unlearns calling before copying
is learned. The bonus keeps calls ahead long enough for copying to pay.
"""

from __future__ import annotations

from entrepot.grpo.data.rewards import get_verifier
from entrepot.grpo.multiturn.environment import Row, Step
from entrepot.grpo.multiturn.tools import ToolCall, ToolEnvironment

__all__ = ["CalculatorEnv"]

CALL = "#"
ERROR = "?"  # the tool's answer to a call it cannot read (the character tokenizer has no letters)


def add(a: int, b: int, width: int) -> str:
    """`a + b` zero-padded to `width` digits, as the addition task writes its answers."""
    return str(a + b).zfill(width)


class CalculatorEnv(ToolEnvironment):
    """Addition questions with an ``add`` tool (see the module docstring). A ``#`` ends the model's
    turn, as a closing tag ends a tool call: the call is then one token where the model knows it.

    Args:
        tool_timeout_s: seconds the tool may run.
        max_calls: calls a trajectory may make; the turn after the last one is the answer.
        call_bonus: reward added to an answer given after a call the tool answered (a tool-use
            reward, as agent RL recipes shape theirs; 0 turns it off). Accuracy counts exact answers.
    """

    stop = (CALL,)

    def __init__(self, tool_timeout_s: float = 5.0, max_calls: int = 1, call_bonus: float = 0.2) -> None:
        self.tools = {"add": add}
        self.max_calls, self.call_bonus = max_calls, call_bonus
        self.tool_timeout_s = tool_timeout_s
        self._partial_credit = get_verifier("partial_credit")

    def reset(self, row: Row) -> None:
        super().reset(row)
        self.failed_calls = 0
        left, _, right = row.prompt.rstrip("=").partition("+")
        self.question = (int(left), int(right)) if left.isdigit() and right.isdigit() else None
        self.width = len(row.answer)

    def parse_call(self, action: str) -> ToolCall | None:
        if not action.endswith(CALL) or self.calls >= self.max_calls:
            return None  # an answer (after its calls, any turn is)
        expression = action.removesuffix(CALL)
        left, plus, right = expression.partition("+")
        if plus and left.isdigit() and right.isdigit():
            a, b = int(left), int(right)
        elif not expression and self.question is not None:
            a, b = self.question
        else:
            return ToolCall("add", {})  # nothing it can add: the tool answers with an error
        return ToolCall("add", {"a": a, "b": b, "width": self.width})

    def step(self, action: str) -> Step:
        out = super().step(action)
        if out.observation is not None and out.observation.startswith("error"):
            self.failed_calls += 1
            return Step(observation=ERROR, role=out.role, info=out.info)
        if out.done:
            correct = float(action.strip() == self.row.answer)
            return Step(reward=out.reward, done=True, info={**out.info, "correct": correct})
        return out

    def finish(self, answer: str) -> float:
        bonus = self.call_bonus if self.calls > self.failed_calls else 0.0  # a call that answered
        return float(self._partial_credit(answer, self.row.answer)) + bonus
