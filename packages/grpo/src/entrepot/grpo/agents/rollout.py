"""`AgentRollout`: user agent code, written against the `openai` client, as a multi-turn rollout source.

For each row, ``multiturn.agent`` (an async function ``(client, row) -> float``) runs with an
`openai.AsyncOpenAI` client whose base URL is its own session on the run's `AgentServer`; its
return is the trajectory's reward. The trajectory is the session's turns exactly as sampled: the
prompt, each turn's new context tokens (the agent's messages, rendered by the chat format: masked
like an environment's) and the model's sampled tokens with their log-probs, so the rest of the step
is that of `MultiTurnRollout` (`run` returns the same `Trajectory` objects and metrics).

Failures are data: an agent that raises (or returns no finite number) ends its trajectory as
``agent_error``, one past ``multiturn.agent_timeout_s`` as ``agent_timeout`` (counted in
``multiturn/env_failures`` and ``multiturn/end_<reason>``); ``multiturn.fail_fast`` raises instead. A
request refused at a trajectory limit ends it with that limit's reason whatever the agent does next.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import numbers
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import openai
import torch

from entrepot.grpo.agents.server import AgentServer
from entrepot.grpo.agents.serving import Serving
from entrepot.grpo.agents.sessions import Session
from entrepot.grpo.config.multiturn import MultiTurnConfig
from entrepot.grpo.engines.base import RolloutEngine, SamplingParams
from entrepot.grpo.errors import EnvironmentFailure
from entrepot.grpo.multiturn.chat import ChatFormat
from entrepot.grpo.multiturn.environment import Row
from entrepot.grpo.multiturn.trajectory import EndReason, Trajectory, trajectory_metrics

__all__ = ["Agent", "AgentRollout"]

Agent = Callable[[openai.AsyncOpenAI, dict[str, Any]], Awaitable[float]]
"""An agent: ``async def agent(client, row) -> float``; `row` holds ``prompt``, ``answer``, ``index``."""

_Outcome = tuple[float, EndReason, str]


class AgentRollout:
    """Trajectories driven by `agent` through a loopback OpenAI-compatible server (module docstring).

    Args:
        config: the `multiturn` section (limits, agent concurrency and timeout, fail-fast).
        chat: renders the agent's messages after a model turn.
        tokenizer: the policy's tokenizer.
        agent: the async function run once per trajectory.
    """

    def __init__(self, config: MultiTurnConfig, chat: ChatFormat, tokenizer: Any, agent: Agent) -> None:
        self.config, self.chat, self.agent = config, chat, agent
        self.serving = Serving()
        self.server = AgentServer(self.serving, chat, tokenizer, config).start()

    def run(
        self,
        engine: RolloutEngine,
        starts: Sequence[tuple[Row, Sequence[int]]],
        sampling: SamplingParams,
        *,
        pad_token_id: int,
        generator: torch.Generator | None = None,
        version: int = 0,
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """Run the agent on each (row, prompt tokens); the trajectories and metrics (`version`: the
        policy version the responses report)."""
        stops = tuple(dict.fromkeys((*sampling.stop_token_ids, *self.chat.stop_token_ids)))
        names = [f"{secrets.token_hex(6)}-{row.index}" for row, _ in starts]
        for name, (row, prompt) in zip(names, starts, strict=True):
            self.server.open_session(name, list(prompt), row.prompt)
        requests, refused = self.server.requests, self.server.refused
        self.serving.attach(
            engine,
            dataclasses.replace(sampling, stop_token_ids=stops),
            pad_token_id=pad_token_id,
            generator=generator,
            version=version,
        )
        t0 = time.perf_counter()
        try:
            outcomes = asyncio.run(self._episodes(names, [row for row, _ in starts]))
        finally:
            self.serving.detach()
            records = [self.server.end_session(name) for name in names]
        wall = time.perf_counter() - t0
        trajectories = [
            self._trajectory(row, list(prompt), record, outcome)
            for (row, prompt), record, outcome in zip(starts, records, outcomes, strict=True)
        ]
        metrics = trajectory_metrics(
            trajectories,
            generated=self.serving.generated,
            generate_s=self.serving.generate_s,
            wait_s=wall - self.serving.generate_s,
        )
        metrics["agents/requests"] = float(self.server.requests - requests)
        metrics["agents/refused"] = float(self.server.refused - refused)
        return trajectories, metrics

    async def _episodes(self, names: list[str], rows: list[Row]) -> list[_Outcome]:
        slots = asyncio.Semaphore(self.config.agent_concurrency)
        # one connection pool for every episode, the environment's proxies ignored (the server is local)
        async with openai.DefaultAsyncHttpxClient(trust_env=False, timeout=None) as http:
            episodes = (self._episode(http, slots, n, r) for n, r in zip(names, rows, strict=True))
            return list(await asyncio.gather(*episodes))

    async def _episode(self, http: Any, slots: asyncio.Semaphore, name: str, row: Row) -> _Outcome:
        limit = self.config.agent_timeout_s
        async with slots:
            client = openai.AsyncOpenAI(
                base_url=self.server.base_url(name),
                api_key=self.server.token,
                http_client=http,
                max_retries=0,
            )
            row_dict = {"prompt": row.prompt, "answer": row.answer, "index": row.index}
            try:
                reward = await asyncio.wait_for(self.agent(client, row_dict), timeout=limit)
            except TimeoutError:
                return (
                    0.0,
                    EndReason.AGENT_TIMEOUT,
                    f"the agent took longer than {limit:g} s (multiturn.agent_timeout_s)",
                )
            except Exception as exc:
                return 0.0, EndReason.AGENT_ERROR, f"the agent raised {type(exc).__name__}: {exc}"
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
            return (
                0.0,
                EndReason.AGENT_ERROR,
                f"the agent returned {reward!r}, not a finite number (the reward)",
            )
        return float(reward), EndReason.DONE, ""

    def _trajectory(self, row: Row, prompt: list[int], record: Session, outcome: _Outcome) -> Trajectory:
        """The session's turns as one trajectory: each turn's new context masked, its reply sampled."""
        reward, reason, detail = outcome
        if record.limit is not None and reason is not EndReason.AGENT_TIMEOUT:  # the limit ended it first
            reason, detail = record.limit, detail or "a request was refused at this limit"
        elif reason is not EndReason.DONE and self.config.fail_fast:
            raise EnvironmentFailure(f"agent of dock row {row.index}: {detail} (multiturn.fail_fast is on)")
        traj = Trajectory(row.index, prompt)
        at = len(prompt)
        for turn in record.turns:
            traj.add_observation(turn.context[at:])
            traj.add_model_turn(turn.sampled, turn.logprobs)
            at = len(turn.context) + len(turn.sampled)
        traj.reward = reward
        traj.finish(reason, detail)
        return traj

    def close(self) -> None:
        """Stop the server (requests after this are refused or find no listener)."""
        self.server.close()
