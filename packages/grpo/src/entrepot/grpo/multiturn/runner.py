"""Multi-turn rollouts over any rollout engine: token in, token out, environment calls in flight.

`MultiTurnRollout.run` keeps every trajectory of a batch in flight. Trajectories waiting for the model
are generated together, one engine call per token budget; each finished turn goes to its environment
on `EnvCalls`; whichever environment answers first returns its trajectory to the model's queue. So
the engine generates for the trajectories that are ready while others wait for their environment,
and a slow environment call holds up only its own trajectory.

A trajectory's tokens are the prompt's, then the model's sampled tokens as they came and the
`ChatFormat`'s tokens of each environment message: nothing is decoded and encoded again. An
environment that raises, passes ``multiturn.env_timeout_s`` or answers something malformed ends its
trajectory with that reason (`EndReason`), which the step counts; ``multiturn.fail_fast`` raises
`EnvironmentFailure` instead.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from entrepot.grpo.config.multiturn import MultiTurnConfig
from entrepot.grpo.engines.base import RolloutEngine, SamplingParams
from entrepot.grpo.errors import EnvironmentFailure
from entrepot.grpo.multiturn.chat import ChatFormat
from entrepot.grpo.multiturn.env_calls import EnvCalls
from entrepot.grpo.multiturn.environment import Row, Step, step_problem
from entrepot.grpo.multiturn.trajectory import EndReason, Trajectory, trajectory_metrics

__all__ = ["MultiTurnRollout", "TrajectoryRollout"]

_RESET, _STEP = "reset", "step"


class TrajectoryRollout(Protocol):
    """What the rollout stage runs for multi-turn trajectories: `MultiTurnRollout` (an environment
    answers each turn) or `agents.AgentRollout` (user agent code calls the policy over HTTP)."""

    def run(
        self, engine: RolloutEngine, starts: Sequence[tuple[Row, Sequence[int]]], sampling: SamplingParams,
        *, pad_token_id: int, generator: torch.Generator | None = None, version: int = 0,
    ) -> tuple[list[Trajectory], dict[str, float]]:  # fmt: skip
        """Run a trajectory from each (row, prompt tokens) until it ends; the trajectories and metrics.

        `version` is the policy version sampling (agents see it in each response)."""
        ...

    def close(self) -> None:
        """Release what the rollout holds (threads, a server)."""
        ...


class MultiTurnRollout:
    """Multi-turn trajectories of one environment class, on any engine (see the module docstring).

    Args:
        config: the `multiturn` section (limits, timeout, concurrency, fail-fast).
        chat: how environment messages become tokens.
        factory: makes one environment per trajectory from `config.env_args`.
        stops: tokens that end a model turn besides the chat's end of turn (`Environment.stop`).
    """

    def __init__(
        self,
        config: MultiTurnConfig,
        chat: ChatFormat,
        factory: Callable[..., Any],
        stops: tuple[int, ...] = (),
    ) -> None:
        self.config, self.chat, self.factory, self.stops = config, chat, factory, stops
        self.calls = EnvCalls(config.env_concurrency)

    def run(
        self, engine: RolloutEngine, starts: Sequence[tuple[Row, Sequence[int]]], sampling: SamplingParams,
        *, pad_token_id: int, generator: torch.Generator | None = None, version: int = 0,
    ) -> tuple[list[Trajectory], dict[str, float]]:  # fmt: skip
        """Run a trajectory from each (row, prompt tokens) until it ends; the trajectories and metrics
        (`version`: the policy's, which an environment does not see)."""
        return _Batch(self, engine, starts, sampling, pad_token_id, generator).run()

    def close(self) -> None:
        self.calls.close()


class _Batch:
    """The state of one `MultiTurnRollout.run`."""

    def __init__(
        self, owner: MultiTurnRollout, engine: RolloutEngine, starts: Sequence[tuple[Row, Sequence[int]]],
        sampling: SamplingParams, pad_token_id: int, generator: torch.Generator | None,
    ) -> None:  # fmt: skip
        self.config, self.chat, self.calls = owner.config, owner.chat, owner.calls
        self.engine, self.pad, self.generator = engine, pad_token_id, generator
        stops = tuple(dict.fromkeys((*sampling.stop_token_ids, *owner.chat.stop_token_ids, *owner.stops)))
        self.sampling = dataclasses.replace(sampling, stop_token_ids=stops)
        self.trajectories = [Trajectory(row.index, list(prompt)) for row, prompt in starts]
        self.rows = [row for row, _ in starts]
        self.envs: list[Any] = [None] * len(starts)
        self.stopped = [True] * len(starts)
        self.pending: dict[concurrent.futures.Future[Any], tuple[int, str]] = {}
        self.ready: list[int] = []
        self.times = {"generate": 0.0, "env_wait": 0.0}
        self.generated = 0
        self.factory = owner.factory
        self.turn_ends = set(owner.chat.stop_token_ids)  # the chat's end of turn (observation_ids closes it)

    def run(self) -> tuple[list[Trajectory], dict[str, float]]:
        for i, row in enumerate(self.rows):
            try:
                self.envs[i] = self.factory(**self.config.env_args)
            except Exception as exc:
                self._fail(
                    i, EndReason.ENV_ERROR, f"the environment did not build: {type(exc).__name__}: {exc}"
                )
                continue
            self._call(i, _RESET, row)
        while self.pending or self.ready:
            self._harvest(block=not self.ready)
            if self.ready:
                self._generate()
        return self.trajectories, self._metrics()

    # -- environment calls ----------------------------------------------------------------------

    def _call(self, i: int, kind: str, argument: Any) -> None:
        method = getattr(self.envs[i], kind, None)
        if not callable(method):
            self._fail(i, EndReason.ENV_MALFORMED, f"the environment has no {kind}() method")
            return
        self.pending[self.calls.submit(method, argument)] = (i, kind)

    def _harvest(self, *, block: bool) -> None:
        """Take the environment calls that finished (waiting for one when nothing else can run)."""
        if block and self.pending:
            t0 = time.perf_counter()
            concurrent.futures.wait(self.pending, timeout=self._wait_s(),
                                    return_when=concurrent.futures.FIRST_COMPLETED)  # fmt: skip
            self.times["env_wait"] += time.perf_counter() - t0
        for future in [f for f in self.pending if f.done()]:
            i, kind = self.pending.pop(future)
            self.calls.forget(future)
            self._answered(i, kind, future)
        now, limit = time.monotonic(), self.config.env_timeout_s
        for future, (i, kind) in list(self.pending.items()):
            started = self.calls.started.get(future)
            if started is not None and now - started > limit:
                del self.pending[future]
                self.calls.forget(future)
                self._fail(i, EndReason.ENV_TIMEOUT, f"{kind}() took longer than {limit:g} s")

    def _wait_s(self) -> float:
        """Seconds until the first running call's deadline (a queued one's deadline is further)."""
        now = time.monotonic()
        deadlines = [self.calls.started[f] + self.config.env_timeout_s
                     for f in self.pending if f in self.calls.started]  # fmt: skip
        return max(min(deadlines, default=now + self.config.env_timeout_s) - now, 0.0) + 1e-3

    def _answered(self, i: int, kind: str, future: concurrent.futures.Future[Any]) -> None:
        error = future.exception()
        if error is not None:
            self._fail(i, EndReason.ENV_ERROR, f"{kind}() raised {type(error).__name__}: {error}")
            return
        if kind == _RESET:
            self.ready.append(i)
            return
        step = future.result()
        problem = step_problem(step)
        if problem:
            self._fail(i, EndReason.ENV_MALFORMED, f"step() returned {problem}")
            return
        traj = self.trajectories[i]
        traj.reward += float(step.reward)
        traj.info = dict(step.info)
        if step.done:
            traj.finish(EndReason.DONE)
        elif traj.turns >= self.config.max_turns:
            traj.finish(EndReason.MAX_TURNS)
        else:
            self._observe(i, step)

    def _observe(self, i: int, step: Step) -> None:
        """Append the environment's message to trajectory `i`, or end it at a limit."""
        traj = self.trajectories[i]
        message = {"role": step.role, "content": step.observation or ""}
        try:
            ids = self.chat.observation_ids(message, stopped=self.stopped[i])
        except Exception as exc:
            self._fail(i, EndReason.ENV_MALFORMED, f"its message cannot be rendered: {exc}")
            return
        limit = self.config.max_observation_tokens
        if len(ids) > limit:
            traj.finish(
                EndReason.OBSERVATION_TOO_LONG,
                f"{len(ids)} tokens > multiturn.max_observation_tokens ({limit})",
            )
        elif len(traj.tokens) + len(ids) >= self.config.max_tokens:
            traj.finish(EndReason.MAX_TOKENS)
        else:
            traj.add_observation(ids)
            self.ready.append(i)

    def _fail(self, i: int, reason: EndReason, detail: str) -> None:
        row = self.rows[i]
        if self.config.fail_fast:
            raise EnvironmentFailure(
                f"environment of dock row {row.index} (turn {self.trajectories[i].turns}): {detail} "
                "(multiturn.fail_fast is on)"
            )
        self.trajectories[i].finish(reason, detail)

    # -- model turns ----------------------------------------------------------------------------

    def _generate(self) -> None:
        """One model turn of every ready trajectory, one engine call per token budget."""
        ready, self.ready = sorted(self.ready), []
        by_budget: dict[int, list[int]] = {}
        for i in ready:
            left = self.config.max_tokens - len(self.trajectories[i].tokens)
            by_budget.setdefault(min(self.sampling.max_new_tokens, left), []).append(i)
        for budget, members in sorted(by_budget.items()):
            params = dataclasses.replace(self.sampling, max_new_tokens=budget)
            t0 = time.perf_counter()
            out = self.engine.generate([self.trajectories[i].context() for i in members], params,
                                       pad_token_id=self.pad, generator=self.generator)  # fmt: skip
            self.times["generate"] += time.perf_counter() - t0
            for i, tokens, logps in zip(members, out.responses(), out.response_logprobs(), strict=True):
                ids = tokens.tolist()
                self.trajectories[i].add_model_turn(ids, logps.float().tolist())
                self.generated += len(ids)
                self.stopped[i] = bool(ids) and ids[-1] in self.turn_ends
                self._call(i, _STEP, self.chat.action_text(ids))

    def _metrics(self) -> dict[str, float]:
        times = self.times
        return trajectory_metrics(self.trajectories, generated=self.generated, generate_s=times["generate"],
                                  wait_s=times["env_wait"])  # fmt: skip
