"""The policy as the agent server sees it: the run's rollout engine, attached while a rollout runs.

Requests arrive on the server's threads; each asks `Serving.generate` for one model turn. Whoever finds
the engine idle generates for every turn queued by then, one `RolloutEngine.generate` call per (token
budget, stop tokens), the call `MultiTurnRollout` makes for its ready trajectories; the others wait for
their result. So concurrent agents are batched without a timer. Between rollouts (the engine is
training) and after `close`, a request is refused (`NotServing`, HTTP 503).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from entrepot.grpo.engines.base import RolloutEngine, SamplingParams

__all__ = ["NotServing", "Serving", "TurnOut"]


class NotServing(Exception):
    """No rollout is running (or the server closed): the policy cannot answer now."""


@dataclass(frozen=True)
class TurnOut:
    """One sampled model turn: its tokens, their log-probs and the policy version that sampled them."""

    token_ids: list[int]
    logprobs: list[float]
    version: int


@dataclass
class _Job:
    prompt: list[int]
    budget: int
    stops: tuple[int, ...]
    future: concurrent.futures.Future[TurnOut]


@dataclass
class _Attached:
    engine: RolloutEngine
    sampling: SamplingParams
    pad_token_id: int
    generator: torch.Generator | None
    version: int


class Serving:
    """The engine of the running rollout (`attach` .. `detach`), generating queued turns in batches.

    Attributes:
        generate_s: seconds spent in the engine since the last `attach`.
        generated: model tokens sampled since the last `attach`.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._attached: _Attached | None = None
        self._queue: list[_Job] = []
        self._busy = False
        self._closed = False
        self.generate_s, self.generated = 0.0, 0

    @property
    def sampling(self) -> SamplingParams:
        """The sampling of the attached rollout (`NotServing` when none is)."""
        with self._cond:
            return self._current().sampling

    def attach(
        self,
        engine: RolloutEngine,
        sampling: SamplingParams,
        *,
        pad_token_id: int,
        generator: torch.Generator | None,
        version: int,
    ) -> None:
        """Serve `engine` with `sampling` (its stop tokens end every turn) until `detach`."""
        with self._cond:
            self._attached = _Attached(engine, sampling, pad_token_id, generator, version)
            self.generate_s, self.generated = 0.0, 0

    def detach(self) -> None:
        """Stop serving: queued turns are refused, and this returns once the engine is idle."""
        with self._cond:
            self._attached = None
            for job in self._queue:
                job.future.set_exception(NotServing("the rollout ended before this turn was generated"))
            self._queue.clear()
            while self._busy:
                self._cond.wait()

    def close(self) -> None:
        """Detach for good: every later request is `NotServing`."""
        self._closed = True
        self.detach()

    def _current(self) -> _Attached:
        if self._closed:
            raise NotServing("the agent server is closed")
        if self._attached is None:
            raise NotServing("no rollout is running: the policy is served only while one runs")
        return self._attached

    def generate(self, prompt: Sequence[int], budget: int, stops: tuple[int, ...] = ()) -> TurnOut:
        """One model turn after `prompt`: at most `budget` tokens, ending at the sampling's stop tokens or
        `stops`. Raises `NotServing` when no rollout is attached."""
        future: concurrent.futures.Future[TurnOut] = concurrent.futures.Future()
        with self._cond:
            self._current()
            self._queue.append(_Job(list(prompt), budget, stops, future))
            if self._busy:  # the generating thread takes this job in its next round
                lead = False
            else:
                self._busy = lead = True
        if lead:
            self._drain()
        return future.result()

    def _drain(self) -> None:
        """Generate rounds of queued jobs until the queue is empty (the calling thread leads)."""
        done = False
        try:
            while True:
                with self._cond:
                    jobs, self._queue = self._queue, []
                    attached = self._attached
                    if not jobs:  # idle again, under the same lock a new job would see `_busy` by
                        self._busy, done = False, True
                        self._cond.notify_all()
                        return
                if attached is None:
                    for job in jobs:
                        job.future.set_exception(
                            NotServing("the rollout ended before this turn was generated")
                        )
                    continue
                self._round(attached, jobs)
        finally:
            if not done:  # a failure outside the engine call: never leave the queue without a leader
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _round(self, attached: _Attached, jobs: list[_Job]) -> None:
        groups: dict[tuple[int, tuple[int, ...]], list[_Job]] = {}
        for job in jobs:
            groups.setdefault((job.budget, job.stops), []).append(job)
        for (budget, stops), members in sorted(groups.items()):
            base = attached.sampling
            params = dataclasses.replace(
                base,
                max_new_tokens=budget,
                stop_token_ids=tuple(dict.fromkeys((*base.stop_token_ids, *stops))),
            )
            prompts = [torch.tensor(job.prompt, dtype=torch.long) for job in members]
            t0 = time.perf_counter()
            try:
                out = attached.engine.generate(
                    prompts, params, pad_token_id=attached.pad_token_id, generator=attached.generator
                )
                turns = [
                    TurnOut(tokens.tolist(), logps.float().tolist(), attached.version)
                    for tokens, logps in zip(out.responses(), out.response_logprobs(), strict=True)
                ]
            except Exception as exc:  # the engine's failure is the requests' (HTTP 500), not the thread's
                for job in members:
                    job.future.set_exception(exc)
                continue
            finally:
                self.generate_s += time.perf_counter() - t0
            for job, turn in zip(members, turns, strict=True):
                self.generated += len(turn.token_ids)
                job.future.set_result(turn)
