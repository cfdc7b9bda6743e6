"""The rollout of asynchronous training: a thread that decodes all the time, in chunks, with its own weights.

It keeps up to `slots` responses in flight. Each turn it
1. loads the newest published weights if there are any (verified, `engines.weight_sync.PublishedWeights`): the
   responses in flight continue under them, every token tagged with the version that sampled it. The
   mailbox holds the newest version only, so versions published while the rollout was busy (a chunk,
   an admission) are skipped for the newest: counted in ``async/weight_versions_skipped``, so that
   loads + skipped versions always account for every version up to ``async/rollout_version``;
2. fills free slots with new prompt groups, as many as the ledger admits (the staleness bound);
3. decodes at most `chunk_tokens` more tokens of every response in flight (`partial_round`: one engine
   call per response length so far, the prompt plus what the response has);
4. puts finished responses into the dock (tokens, behaviour log-probs, versions), scores each group
   whose responses all finished, and marks it finished in the ledger, where a step takes it.

With a multi-turn environment (`multiturn`), step 3 runs the trajectories in flight to their end
instead (`multiturn.MultiTurnRollout`): new weights then reach the rollout between two batches of
trajectories, never inside one.

A failure ends the thread and is kept (`error`); the trainer's waits call `check`, which raises it as
`RolloutLostError` naming the rollout rank, so a dead rollout never leaves the trainer waiting.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from entrepot.grpo.asynchronous.ledger import Ledger
from entrepot.grpo.engines.base import RolloutEngine, SamplingParams
from entrepot.grpo.engines.weight_sync import WeightMailbox
from entrepot.grpo.errors import RolloutLostError, WeightSyncError
from entrepot.grpo.multiturn.runner import TrajectoryRollout
from entrepot.grpo.workers._partial_rollout import partial_round
from entrepot.grpo.workers._rollout import MultiTurnTotals, trajectory_columns, trajectory_starts

__all__ = ["Admit", "RolloutLoop", "RolloutStats"]

Admit = Callable[[int, int], tuple[list[int], list[torch.Tensor]]]
"""(groups, version) -> (first dock row of each admitted group, each group's prompt tokens)."""

Score = Callable[[Sequence[int]], Mapping[str, float] | None]
"""Scores the dock rows given (their responses are in the dock): puts rm_scores and accuracy; returns
the reward stage's figures (its `reward/*` counters reach the step's metrics)."""

_IDLE_S = 0.02  # sleep between looks when nothing is in flight and nothing may start


@dataclass
class _Slot:
    row: int
    prompt: torch.Tensor
    tokens: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    logps: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    versions: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int32))


@dataclass
class RolloutStats:
    """What the rollout did since the last `RolloutLoop.take_stats`."""

    tokens: int = 0
    busy_s: float = 0.0
    idle_s: float = 0.0
    loads: int = 0
    skipped: int = 0  # versions published and superseded before the rollout looked (it loads the newest)
    load_s: float = 0.0
    load_bytes: int = 0
    in_flight_updates: int = 0  # loads that happened with responses in flight
    version: int = -1
    multiturn: MultiTurnTotals = field(default_factory=MultiTurnTotals)  # the trajectories' metrics
    reward: dict[str, float] = field(default_factory=dict)  # the reward stage's counters (`reward/*`)

    def metrics(self, wall_s: float) -> dict[str, float]:
        out = {
            "async/rollout_tokens": float(self.tokens),
            "async/rollout_idle_frac": self.idle_s / wall_s if wall_s > 0 else 0.0,
            "async/rollout_version": float(self.version),
            "async/weight_loads": float(self.loads),
            "async/weight_versions_skipped": float(self.skipped),
            "async/in_flight_updates": float(self.in_flight_updates),
        }
        out.update({k: v for k, v in self.multiturn.metrics().items() if k != "rollout_tokens"})
        out.update(self.reward)
        if self.loads:
            out["async/weight_sync_s"] = self.load_s / self.loads
            out["async/weight_sync_gbps"] = self.load_bytes / max(self.load_s, 1e-9) / 1e9
        return out


class RolloutLoop:
    """The rollout thread (see the module docstring).

    Args:
        engine: a rollout engine of its own (not the trainer's).
        sampling: the run's sampling parameters (`max_new_tokens` is a whole response's budget).
        dock: the run's dock.
        ledger: admission and finished groups.
        mailbox: where the trainer publishes weights.
        admit: puts new prompt groups into the dock.
        score: scores finished rows.
        group_size: responses per prompt (n).
        slots: responses decoded at once.
        chunk_tokens: tokens per response between two looks at weights and slots.
        pad_token_id: the tokenizer's pad id.
        generator: the sampling stream.
        name: this rank's name in errors.
    """

    def __init__(
        self, engine: RolloutEngine, sampling: SamplingParams, dock: Any, ledger: Ledger,
        mailbox: WeightMailbox, admit: Admit, score: Score, *, group_size: int, slots: int,
        chunk_tokens: int, pad_token_id: int, generator: torch.Generator, name: str = "rollout rank 0",
        multiturn: TrajectoryRollout | None = None,
    ) -> None:  # fmt: skip
        self.engine, self.sampling, self.dock, self.ledger = engine, sampling, dock, ledger
        self.mailbox, self.admit, self.score = mailbox, admit, score
        self.n, self.slots, self.chunk = group_size, max(slots, group_size), chunk_tokens
        self.pad, self.generator, self.name = pad_token_id, generator, name
        self.multiturn = multiturn
        self.version = -1
        self.error: BaseException | None = None
        self.details: str | None = None
        self.doing = "starting"
        self._stats = RolloutStats()
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="entrepot-rollout", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the thread to end after its current chunk and wait for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def check(self) -> None:
        """Raise the rollout's failure (`RolloutLostError`) if it has one."""
        if isinstance(self.error, WeightSyncError):  # it names the ranks and the version itself
            raise self.error
        if self.error is not None:
            reason = f"{type(self.error).__name__}: {self.error} (while {self.doing})"
            raise RolloutLostError(self.name, reason, self.details)
        if not self._thread.is_alive() and not self._stop.is_set():
            raise RolloutLostError(self.name, f"its thread ended (while {self.doing})")

    def take_stats(self) -> RolloutStats:
        with self._stats_lock:
            stats, self._stats = self._stats, RolloutStats(version=self.version)
            stats.version = self.version
        return stats

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except InterruptedError:
            pass
        except BaseException as error:  # kept for the trainer: `check` raises it there
            self.error, self.details = error, traceback.format_exc()

    def _loop(self) -> None:
        active: list[_Slot] = []
        self.doing = "waiting for the first weights"
        self._load(self.mailbox.wait_newer(-1, self.name, self._stop), in_flight=False)
        while not self._stop.is_set():
            latest = self.mailbox.latest()
            if latest is not None and latest.version > self.version:
                self._load(latest, in_flight=bool(active))
            active += self._refill(len(active))
            if not active:
                t0 = time.perf_counter()
                self.doing = "waiting for room under the staleness bound"
                self.ledger.wait_for_room(_IDLE_S)
                self._add(idle_s=time.perf_counter() - t0)
                continue
            active = self._chunk(active) if self.multiturn is None else self._trajectories(active)

    def _load(self, weights: Any, *, in_flight: bool) -> None:
        self.doing = f"loading policy version {weights.version}"
        t0 = time.perf_counter()
        named = weights.verified(self.mailbox.source, self.name)
        self.engine.load_weights(named)
        skipped = weights.version - self.version - 1 if self.version >= 0 else 0  # the first load skips none
        with self._stats_lock:  # the version and its counts change together for `take_stats`
            self.version = weights.version
            self._add_locked(loads=1, skipped=skipped, load_s=time.perf_counter() - t0,
                             load_bytes=weights.nbytes, in_flight_updates=int(in_flight))  # fmt: skip

    def _refill(self, in_flight: int) -> list[_Slot]:
        groups = min((self.slots - in_flight) // self.n, self.ledger.admissible(self.version))
        if groups <= 0:
            return []
        self.doing = f"admitting {groups} prompt group(s)"
        first_rows, prompts = self.admit(groups, self.version)
        return [_Slot(first + j, prompt) for first, prompt in zip(first_rows, prompts, strict=True)
                for j in range(self.n)]  # fmt: skip

    def _chunk(self, active: list[_Slot]) -> list[_Slot]:
        """Decode one chunk of every response in flight; finished ones go to the dock. The ones left."""
        self.doing = f"decoding {len(active)} response(s) under policy version {self.version}"
        t0 = time.perf_counter()
        ages = torch.zeros(len(active), dtype=torch.int64)  # never forced: the budget ends a response
        out = partial_round(
            self.engine, [s.prompt for s in active], ages, [(s.tokens, s.logps, s.versions) for s in active],
            self.sampling, partial_max_tokens=self.chunk, max_age=2**31, version=self.version,
            pad_token_id=self.pad, generator=self.generator,
        )  # fmt: skip
        lengths = out.columns["response_length"].tolist()
        parts = {name: torch.split(out.columns[name][0], lengths)
                 for name in ("responses", "rollout_log_prob", "policy_version")}  # fmt: skip
        done: list[_Slot] = []
        left: list[_Slot] = []
        for i, slot in enumerate(active):
            slot.tokens, slot.logps = parts["responses"][i], parts["rollout_log_prob"][i]
            slot.versions = parts["policy_version"][i]
            (done if bool(out.completed[i]) else left).append(slot)
        if done:
            self._put(done)
        self._add(tokens=out.new_tokens, busy_s=time.perf_counter() - t0)
        finished = self._finished_groups(done, left)
        if finished:
            self.doing = f"scoring {len(finished)} group(s)"
            self._score([g + j for g in finished for j in range(self.n)])
            self.ledger.finish(finished)
        return left

    def _trajectories(self, active: list[_Slot]) -> list[_Slot]:
        """Run the multi-turn trajectories of every slot to their end; put, score and finish them all."""
        assert self.multiturn is not None  # the loop calls this only then
        self.doing = f"running {len(active)} trajectories under policy version {self.version}"
        t0 = time.perf_counter()
        rows = torch.tensor([s.row for s in active], dtype=torch.int64)
        texts = self.dock.peek(["prompt_text", "answer"], rows, layout="packed")
        starts = trajectory_starts(texts, [s.prompt for s in active])
        trajectories, metrics = self.multiturn.run(
            self.engine, starts, self.sampling, pad_token_id=self.pad, generator=self.generator,
            version=self.version,
        )  # fmt: skip
        columns = trajectory_columns(trajectories)
        lengths = columns["response_length"]
        versions = torch.full((int(lengths.sum()),), self.version, dtype=torch.int32)
        self.dock.put({**columns, "policy_version": (versions, lengths)}, rows)
        self._add(tokens=int(metrics["rollout_tokens"]), busy_s=time.perf_counter() - t0)
        with self._stats_lock:
            self._stats.multiturn.add(metrics)
        finished = sorted({s.row - s.row % self.n for s in active})
        self.doing = f"scoring {len(finished)} group(s)"
        self._score([g + j for g in finished for j in range(self.n)])
        self.ledger.finish(finished)
        return []

    def _score(self, rows: list[int]) -> None:
        """Score `rows`; the reward stage's counters add to the figures since the last `take_stats`."""
        self._add_reward(self.score(rows))

    def _put(self, done: list[_Slot]) -> None:
        lengths = torch.tensor([s.tokens.numel() for s in done], dtype=torch.int64)
        self.dock.put(
            {
                "responses": (torch.cat([s.tokens for s in done]), lengths),
                "response_length": lengths,
                "rollout_log_prob": (torch.cat([s.logps for s in done]).float(), lengths),
                "policy_version": (torch.cat([s.versions for s in done]).int(), lengths),
            },
            torch.tensor([s.row for s in done], dtype=torch.int64),
        )

    def _finished_groups(self, done: list[_Slot], left: list[_Slot]) -> list[int]:
        """First rows of the groups whose last response just finished."""
        still = {s.row - s.row % self.n for s in left}
        touched = sorted({s.row - s.row % self.n for s in done})
        return [g for g in touched if g not in still]

    def _add_reward(self, stats: Mapping[str, float] | None) -> None:
        """Add the scorer's counters (verdicts, cache hits) to the figures since the last step."""
        with self._stats_lock:
            for key, value in (stats or {}).items():
                if key.startswith("reward/"):
                    self._stats.reward[key] = self._stats.reward.get(key, 0.0) + value

    def _add(self, **amounts: float) -> None:
        with self._stats_lock:
            self._add_locked(**amounts)

    def _add_locked(self, **amounts: float) -> None:
        for key, value in amounts.items():
            setattr(self._stats, key, getattr(self._stats, key) + value)
