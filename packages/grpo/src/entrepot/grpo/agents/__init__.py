"""Agents as a rollout source: the policy served over an OpenAI-compatible HTTP endpoint during a run.

- `server`: `AgentServer`, the FastAPI app on loopback (chat and text completions, a token route).
- `serving`: the run's rollout engine while a rollout runs, concurrent requests generated in batches.
- `sessions`, `render`: one episode's turns as sampled; a request's messages as tokens, checked (409).
- `params`: a request's parameters, checked.
- `rollout`: `AgentRollout`, ``multiturn.agent`` run once per trajectory.
- `examples`: `calculator_agent`, the built-in calculator task written as an agent.

The server needs FastAPI, uvicorn and the `openai` client (the ``agents`` extra): they are imported
only when ``multiturn.agent`` is set, so a run without an agent needs none of them.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import TYPE_CHECKING, Any

from entrepot.grpo._install import install_command
from entrepot.grpo.config.multiturn import MultiTurnConfig
from entrepot.grpo.errors import GRPOConfigError
from entrepot.grpo.multiturn import build_multiturn
from entrepot.grpo.multiturn.runner import TrajectoryRollout

if TYPE_CHECKING:
    from entrepot.grpo.agents.rollout import Agent

__all__ = ["SERVER_MODULES", "build_rollout", "check_server_installed", "load_agent"]

SERVER_MODULES = ("fastapi", "uvicorn", "openai")  # the agents extra


def check_server_installed(key: str = "multiturn.agent") -> None:
    """A `GRPOConfigError` naming `key` and the install command when the server's packages are missing."""
    missing = [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise GRPOConfigError(
            f"{key} serves the policy over HTTP, which needs {', '.join(missing)}: "
            f"{install_command('fastapi')}"
        )


def load_agent(spec: str, key: str = "multiturn.agent") -> Agent:
    """The async function ``"package.module:function"`` names; one that does not import or is not an
    ``async def`` is a `GRPOConfigError` naming `key`."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise GRPOConfigError(f"{key} ({spec!r}) must be 'module:function'")
    try:
        agent = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise GRPOConfigError(f"{key} ({spec!r}) cannot be imported: {exc}") from exc
    if not inspect.iscoroutinefunction(agent):
        raise GRPOConfigError(
            f"{key} ({spec!r}) must be an async function (client, row) -> float, got {type(agent).__name__}"
        )
    return agent


def build_rollout(config: MultiTurnConfig, tokenizer: Any) -> TrajectoryRollout | None:
    """The multi-turn rollout of `config`: an agent's (`AgentRollout`), an environment's
    (`MultiTurnRollout`), or None (single-turn). The one place the rollout kind is chosen."""
    if config.agent is not None:
        from entrepot.grpo.agents.rollout import AgentRollout
        from entrepot.grpo.multiturn.chat import chat_format

        agent = load_agent(config.agent)
        return AgentRollout(config, chat_format(tokenizer, key="multiturn.agent"), tokenizer, agent)
    return build_multiturn(config, tokenizer)
