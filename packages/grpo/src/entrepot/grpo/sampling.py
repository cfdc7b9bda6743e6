"""How a step gets the rows it trains: plain, dynamic sampling, or partial rollout, chosen once.

Each mode is a small strategy object; `step.GRPOStep` calls it and does not know which one runs:
- `PlainSampling`: put a step's prompts, roll them out, score them; every group trains.
- `DynamicSampling` (`algorithm.dynamic_sampling`): drop groups whose rewards all agree (they carry
  no advantage) and refill with new prompts, up to `algorithm.max_resample_rounds` rounds. The
  log-prob stages wait until the kept rows are final.
- `PartialSampling` (`rollout.partial_max_tokens`): every unfinished response gets one round of new
  tokens under this step's policy; the step trains the groups that finished, the rest stay in the dock.
  The importance ratio divides by each token's behaviour log-prob (the version that sampled it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from entrepot.grpo.algo.losses import keep_varied_groups
from entrepot.grpo.config import AlgorithmConfig, RolloutConfig

__all__ = [
    "DynamicSampling",
    "PartialSampling",
    "PlainSampling",
    "Sampled",
    "Sampling",
    "StageStart",
    "choose_sampling",
]

StageStart = Callable[[], Any]
"""Starts one stage on a worker group and returns its pending call (`workers.Pending`)."""


@dataclass
class Sampled:
    """The rows a step trains (dock indexes, whole groups, group after group), the stages' per-rank
    stats and the sampling metrics."""

    rows: torch.Tensor
    stats: list[dict[str, float]]
    metrics: dict[str, float] = field(default_factory=dict)


class Prompts(Protocol):
    """What a sampling strategy needs of the step: the dock, and new prompts rolled out and scored."""

    dock: Any

    def generate(
        self, count: int, version: int, also: Sequence[StageStart] = ()
    ) -> tuple[torch.Tensor, list[dict[str, float]]]:
        """Put `count` new prompts, roll them out by policy `version` and score them (running `also` in
        the same phase); their rows and the stages' stats."""
        ...


class Sampling(Protocol):
    """One sampling mode.

    Attributes:
        log_probs_after: the log-prob stages start only once the rows are final (else they run in
            the rollout's phase, waiting in the dock for responses).
        behaviour_ratio: the update's importance ratio divides by the rollout's own log-probs.
        explicit_rows: the log-prob stages read exactly the step's rows (the dock holds others too:
            asynchronous training), not whatever rows they have not read yet.
        columns: extra dock columns the step's metrics read.
    """

    @property
    def log_probs_after(self) -> bool: ...

    @property
    def behaviour_ratio(self) -> bool: ...

    @property
    def explicit_rows(self) -> bool: ...

    @property
    def columns(self) -> tuple[str, ...]: ...

    @property
    def data_position(self) -> int | None:
        """Prompts drawn from the data stream when the mode draws them itself (None: the step does)."""
        ...

    def updated(self, version: int) -> dict[str, float]:
        """The update to policy `version` is done (asynchronous training publishes its weights)."""
        ...

    def clear(self, dock: Any, rows: torch.Tensor) -> None:
        """End the step in the dock: `rows` were trained."""
        ...

    @property
    def dock_in_checkpoint(self) -> bool:
        """A checkpoint saves the dock (else the mode's `state` says what to redo)."""
        ...

    def trained_prompts(self) -> list[int] | None:
        """The data positions of the prompts the last step trained (None: the mode does not track them)."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the mode (JSON-able)."""
        ...

    def restore(self, state: dict[str, Any], step: int) -> None:
        """Continue from a checkpoint's `state` at `step`."""
        ...

    def close(self) -> None:
        """Stop what the mode runs (the asynchronous rollout)."""
        ...

    def sample(self, prompts: Prompts, step: int, also: Sequence[StageStart]) -> Sampled:
        """This step's rows; `also` starts in the rollout's phase."""
        ...

    def after_clear(self, dock: Any, step: int, stats: Any) -> dict[str, float]:
        """Metrics read after the step's clear (what stays in flight); `step` is the version that
        sampled this step, `stats` the batch of the step's `columns` (None: no rows)."""
        ...


class _Lockstep:
    """What the synchronous modes share: the step draws the prompts, and a step's end clears the dock
    but for unfinished groups (partial rollout's)."""

    explicit_rows = False
    data_position = None
    dock_in_checkpoint = True

    def updated(self, version: int) -> dict[str, float]:
        return {}

    def clear(self, dock: Any, rows: torch.Tensor) -> None:
        dock.clear()

    def trained_prompts(self) -> list[int] | None:
        return None

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class PlainSampling(_Lockstep):
    """Every prompt of the step trains."""

    prompts_per_step: int
    log_probs_after: bool = False
    behaviour_ratio: bool = False
    columns: tuple[str, ...] = ()

    def sample(self, prompts: Prompts, step: int, also: Sequence[StageStart]) -> Sampled:
        rows, stats = prompts.generate(self.prompts_per_step, step, also)
        return Sampled(rows, stats)

    def after_clear(self, dock: Any, step: int, stats: Any) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class DynamicSampling(_Lockstep):
    """Drop zero-variance groups and refill, up to `max_rounds` rounds."""

    prompts_per_step: int
    group_size: int
    max_rounds: int
    log_probs_after: bool = True
    behaviour_ratio: bool = False
    columns: tuple[str, ...] = ()

    def sample(self, prompts: Prompts, step: int, also: Sequence[StageStart]) -> Sampled:
        n, wanted = self.group_size, self.prompts_per_step
        rows, stats = prompts.generate(wanted, step, also)
        kept, dropped, rounds = self._keep(prompts.dock, rows), 0, 0
        dropped += (rows.numel() - kept.numel()) // n
        while kept.numel() < wanted * n and rounds < self.max_rounds:
            rounds += 1
            new_rows, more = prompts.generate(wanted - kept.numel() // n, step)
            stats += more
            new_kept = self._keep(prompts.dock, new_rows)
            dropped += (new_rows.numel() - new_kept.numel()) // n
            kept = torch.cat([kept, new_kept])
        metrics = {
            "sampling/groups_dropped": float(dropped),
            "sampling/rounds": float(rounds),
            "sampling/groups_kept": float(kept.numel() // n),
        }
        return Sampled(kept, stats, metrics)

    def _keep(self, dock: Any, rows: torch.Tensor) -> torch.Tensor:
        """Clear the groups of `rows` whose rewards all agree from the dock; return the kept rows."""
        scores = dock.peek(["rm_scores"], rows).columns["rm_scores"]
        keep = keep_varied_groups(scores, self.group_size)
        if not bool(keep.all()):
            dock.clear(rows[~keep])
        return rows[keep]

    def after_clear(self, dock: Any, step: int, stats: Any) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class PartialSampling(_Lockstep):
    """One round of at most `rollout.partial_max_tokens` tokens a step; finished groups train."""

    prompts_per_step: int
    group_size: int
    log_probs_after: bool = False
    behaviour_ratio: bool = True
    columns: tuple[str, ...] = ("policy_version",)

    def sample(self, prompts: Prompts, step: int, also: Sequence[StageStart]) -> Sampled:
        """New prompts join the responses carried over, everything gets one round by this step's
        policy (version = steps trained), and the step takes the groups that finished."""
        n = self.group_size
        stale = prompts.dock.set_policy_version(step)  # drops groups that would exceed max_staleness
        _, stats = prompts.generate(self.prompts_per_step, step, also)
        rows = prompts.dock.finished_rows()
        metrics = {"partial/groups_finished": float(rows.numel() // n),
                   "partial/groups_dropped_stale": float(stale // n)}  # fmt: skip
        return Sampled(rows, stats, metrics)

    def after_clear(self, dock: Any, step: int, stats: Any) -> dict[str, float]:
        """Tokens trained this step per policy-version age (steps behind the policy they train), and
        the groups still in flight after the step's clear."""
        in_flight = dock.progress("actor_rollout")["live"] // self.group_size
        out = {"partial/groups_in_flight": float(in_flight)}
        if stats is not None:
            ages = step - stats.columns["policy_version"].long()  # [T] every trained token
            for age, tokens in enumerate(torch.bincount(ages).tolist()):
                out[f"partial/tokens_age_{age}"] = float(tokens)
        return out


def choose_sampling(rollout: RolloutConfig, algorithm: AlgorithmConfig) -> Sampling:
    """The sampling mode of a run: partial rollout, dynamic sampling, or plain."""
    if rollout.partial_max_tokens is not None:
        return PartialSampling(rollout.prompts_per_step, rollout.n_samples_per_prompt)
    if algorithm.dynamic_sampling:
        return DynamicSampling(rollout.prompts_per_step, rollout.n_samples_per_prompt,
                               algorithm.max_resample_rounds)  # fmt: skip
    return PlainSampling(rollout.prompts_per_step)
