"""An example agent: the built-in calculator task (`multiturn.calculator`) written with the `openai` client.

``multiturn.agent: entrepot.grpo.agents.examples:calculator_agent`` trains the embedded default on
four-digit addition (``1234+5678=``) as the calculator environment does, but the loop is agent code:
the model may first call the calculator (a reply ending in ``#``, a stop text), the agent answers with
the sum as a ``tool`` message (``>06912=`` in the character chat format), and the model's next reply
is the answer. The reward is the answer's partial credit plus a bonus after a call the tool answered
(the environment's `CalculatorEnv` says why the bonus).
"""

from __future__ import annotations

from typing import Any

import openai

from entrepot.grpo.data.rewards import get_verifier

__all__ = ["calculator_agent"]

CALL, ERROR, CALL_BONUS = "#", "?", 0.2


def calculate(call: str, question: str, width: int) -> str:
    """The calculator's answer to a call: ``#`` adds the question's numbers, ``a+b#`` those; else ``?``."""
    expression = call.removesuffix(CALL) or question.rstrip("=")
    left, plus, right = expression.partition("+")
    if not (plus and left.isdigit() and right.isdigit()):
        return ERROR
    return str(int(left) + int(right)).zfill(width)


async def calculator_agent(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
    """At most one calculator call, then an answer; the answer's partial credit (+ the call bonus)."""
    messages: list[Any] = [{"role": "user", "content": row["prompt"]}]
    bonus = 0.0
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, stop=[CALL])
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        if text.endswith(CALL) and len(messages) == 2:  # the one call: answer it as a tool
            result = calculate(text, row["prompt"], len(row["answer"]))
            bonus = CALL_BONUS if result != ERROR else 0.0
            messages.append({"role": "tool", "tool_call_id": "calculator", "content": result})
            continue
        return float(get_verifier("partial_credit")(text, row["answer"])) + bonus
    return 0.0
