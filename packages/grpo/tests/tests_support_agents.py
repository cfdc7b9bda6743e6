"""Agents the agent training tests load by dotted path (``tests_support_agents:name``)."""

from __future__ import annotations

from typing import Any

import openai

from entrepot.grpo.agents.examples import calculator_agent


async def misbehaves_by_row(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
    """Rows 1, 2, 3 of every 4 misbehave: an edited history (409), a wrong token (401), a raise; the others
    are the calculator agent."""
    kind = row["index"] % 4
    if kind == 0:
        return await calculator_agent(client, row)
    messages: list[Any] = [{"role": "user", "content": row["prompt"]}]
    if kind == 1:
        await client.chat.completions.create(model="policy", messages=messages)
        messages += [{"role": "assistant", "content": "0000"}, {"role": "tool", "content": "1"}]
        await client.chat.completions.create(model="policy", messages=messages)  # 409: not what was sampled
    if kind == 2:
        wrong = client.with_options(api_key="not-the-token")
        await wrong.chat.completions.create(model="policy", messages=messages)  # 401
    raise ValueError("the agent gives up")
