"""Tool calling on top of `Environment`: parse a call from the model's turn, run a Python function
with a timeout, give its result back as the next message (role ``tool``).

The default call syntax is the Hermes / Qwen one, ``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>``; an environment with another syntax overrides `ToolEnvironment.parse_call`. A tool
that raises, times out or is not known answers with an error message: the model made the call and
reads the outcome (an environment that fails itself is another matter: `runner`).

Tools run on daemon threads, at most `MAX_TOOL_CALLS` at once (`EnvCalls`, as environment calls do):
a tool that never returns answers a timeout, gives its slot back and is abandoned on its thread, so
later calls still run and the process still exits.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from entrepot.grpo.multiturn.env_calls import EnvCalls
from entrepot.grpo.multiturn.environment import Environment, Row, Step

__all__ = ["MAX_TOOL_CALLS", "TOOL_CALLS", "ToolCall", "ToolEnvironment", "parse_hermes_call", "run_tool"]

_HERMES = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
MAX_TOOL_CALLS = 16
"""Tool calls of this process that run at once (more wait for a slot; their timeout starts with them)."""
TOOL_CALLS = EnvCalls(MAX_TOOL_CALLS)
"""Where every tool runs (``TOOL_CALLS.abandoned``: hung tools whose threads still run)."""


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its keyword arguments."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


def parse_hermes_call(text: str) -> ToolCall | None:
    """The first ``<tool_call>{json}</tool_call>`` of `text` (None: no call, or not valid JSON)."""
    match = _HERMES.search(text)
    if match is None:
        return None
    try:
        body = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return None
    arguments = body.get("arguments", {})
    return ToolCall(body["name"], arguments if isinstance(arguments, dict) else {})


def run_tool(fn: Callable[..., Any], arguments: Mapping[str, Any], timeout_s: float) -> str:
    """`fn(**arguments)` as text, or ``error: ...`` when it raises or runs past `timeout_s` (counted
    from when it starts; a call that hangs is abandoned on its daemon thread, its result dropped)."""
    try:
        return str(TOOL_CALLS.result(TOOL_CALLS.submit(functools.partial(fn, **arguments)), timeout_s))
    except TimeoutError:
        return f"error: timed out after {timeout_s:g} s"
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"


class ToolEnvironment(Environment):
    """An environment whose model calls tools until it answers.

    A turn holding a call gets the tool's result as the next message; a turn without one is the
    answer, which `finish` scores. Subclasses set `tools` and write `finish` (and `parse_call` for
    another call syntax).

    Attributes:
        tools: the tools by name.
        tool_timeout_s: seconds a tool may run.
        calls: tool calls made in this trajectory (reported as ``env/tool_calls``).
    """

    tools: Mapping[str, Callable[..., Any]] = {}
    tool_timeout_s: float = 5.0

    def reset(self, row: Row) -> None:
        self.row, self.calls = row, 0

    def parse_call(self, action: str) -> ToolCall | None:
        """The tool call in the model's turn, if any."""
        return parse_hermes_call(action)

    def finish(self, answer: str) -> float:
        """The reward of the model's final answer."""
        raise NotImplementedError

    def step(self, action: str) -> Step:
        call = self.parse_call(action)
        if call is None:
            return Step(reward=self.finish(action), done=True, info={"tool_calls": float(self.calls)})
        self.calls += 1
        fn = self.tools.get(call.name)
        if fn is None:
            result = f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(self.tools))}"
        else:
            result = run_tool(fn, call.arguments, self.tool_timeout_s)
        return Step(observation=result, role="tool", info={"tool_calls": float(self.calls)})
