"""Asynchronous training as a sampling mode: the step takes finished groups from a rollout running beside it.

`AsyncSampling` is the `sampling.Sampling` of `trainer.mode: async`. It owns the rollout
(`rollout_loop.RolloutLoop`, on a thread with its own engine), the `ledger.Ledger` of groups between
rollout and training, and the `engines.weight_sync.WeightMailbox`. A step's `sample` takes the next
finished groups
(waiting for them under the stage timeout, failing at once if the rollout died); after the update,
`updated` publishes the new weights and tells the ledger, which may let the rollout start more prompts.
The step's importance ratio divides by the rollout's own log-probs of each token (the behaviour policy,
possibly several versions in one response); the loss's off-policy correction (`algorithm.correction`)
reweighs by the trainer's log-probs over them.

In one process only for now: the rollout thread and the trainer share the process's cores.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from entrepot.grpo.asynchronous.ledger import Ledger
from entrepot.grpo.asynchronous.rollout_loop import RolloutLoop, RolloutStats
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data.sources import TaskSetup, encode_prompt
from entrepot.grpo.engines.weight_sync import WeightMailbox
from entrepot.grpo.errors import RolloutLostError
from entrepot.grpo.sampling import Prompts, Sampled, StageStart

__all__ = ["AsyncSampling"]


@dataclass
class AsyncSampling:
    """The sampling of asynchronous training (see the module docstring).

    Built by `AsyncSampling.build`; the rollout thread starts at the first `sample`, after a resumed
    run restored its state.
    """

    config: GRPOConfig
    cluster: Any
    setup: TaskSetup
    ledger: Ledger
    mailbox: WeightMailbox
    loop: RolloutLoop | None = None
    log_probs_after: bool = True
    behaviour_ratio: bool = True
    explicit_rows: bool = True
    dock_in_checkpoint: bool = False
    columns: tuple[str, ...] = ("policy_version",)
    _wall: float = field(default_factory=time.perf_counter)
    _trained_groups: list[int] = field(default_factory=list)

    @staticmethod
    def build(config: GRPOConfig, cluster: Any, setup: TaskSetup) -> AsyncSampling:
        trainer = config.trainer
        ledger = Ledger(config.rollout.prompts_per_step, trainer.max_staleness, trainer.staleness_policy)
        return AsyncSampling(
            config, cluster, setup, ledger, WeightMailbox(timeout=trainer.weight_sync_timeout_s)
        )

    # -- the step's side ------------------------------------------------------------------------

    def sample(self, prompts: Prompts, step: int, also: Sequence[StageStart]) -> Sampled:
        """The next `prompts_per_step` finished groups (the ledger's order and staleness policy)."""
        if self.loop is None:
            self._start(step)
        assert self.loop is not None
        timeout = self.config.resources.stage_timeout_s + self.config.trainer.weight_sync_timeout_s
        try:
            taken = self.ledger.take(timeout, self.loop.check)
        except TimeoutError as error:
            self.loop.check()
            raise RolloutLostError(self.loop.name, f"no step's worth of groups in {timeout:g} s: {error} "
                                   f"(it was {self.loop.doing})") from None  # fmt: skip
        n = self.config.rollout.n_samples_per_prompt
        if taken.dropped:
            self.cluster.dock.clear(_rows(taken.dropped, n))
            self.ledger.release(len(taken.dropped))
        rows = _rows(taken.groups, n)
        self._trained_groups = [g.position for g in taken.groups]
        metrics = {
            "async/groups_dropped": float(len(taken.dropped)),
            "async/trainer_wait_s": taken.waited_s,
            "async/groups_outstanding": float(len(self.ledger.outstanding())),
        }
        return Sampled(rows, [], metrics)

    def updated(self, version: int) -> dict[str, float]:
        """The update to `version` is done: publish its weights, let the rollout go on."""
        seconds, nbytes = self._publish(version)
        self.ledger.trained()
        return {"async/publish_s": seconds, "async/publish_bytes": float(nbytes)}

    def clear(self, dock: Any, rows: torch.Tensor) -> None:
        """Only the step's rows leave the dock: the others are in flight or wait for a later step."""
        if rows.numel():
            dock.clear(rows)
            self.ledger.release(rows.numel() // self.config.rollout.n_samples_per_prompt)

    def after_clear(self, dock: Any, step: int, stats: Any) -> dict[str, float]:
        """Tokens trained per policy-version age, the rollout's figures since the last step."""
        out: dict[str, float] = {}
        if stats is not None:
            ages = step - stats.columns["policy_version"].long()  # [T] every trained token
            for age, tokens in enumerate(torch.bincount(ages.clamp(min=0)).tolist()):
                out[f"async/tokens_age_{age}"] = float(tokens)
        now = time.perf_counter()
        rollout: RolloutStats = self.loop.take_stats() if self.loop is not None else RolloutStats()
        out.update(rollout.metrics(now - self._wall))
        self._wall = now
        return out

    def trained_prompts(self) -> list[int]:
        """The data positions of the prompts the last step trained."""
        return list(self._trained_groups)

    @property
    def data_position(self) -> int:
        return self.ledger.next_position

    # -- checkpoints and the end ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the prompts admitted but not trained (redone on resume: their
        responses are generated again), the next new prompt, and the rollout's policy version."""
        version = self.loop.version if self.loop is not None else -1
        return {"outstanding": self.ledger.outstanding(), "next_position": self.ledger.next_position,
                "rollout_version": version}  # fmt: skip

    def restore(self, state: dict[str, Any], step: int) -> None:
        self.ledger.restore(step, int(state["next_position"]), [int(p) for p in state["outstanding"]])

    def close(self) -> None:
        if self.loop is not None:
            self.loop.stop()

    # -- internals ------------------------------------------------------------------------------

    def _start(self, step: int) -> None:
        from entrepot.grpo.engines.policy import initial_model, sampling_generator
        from entrepot.grpo.engines.registry import choose_engines

        config = self.config
        self.ledger.trained_version = step
        model, _ = initial_model(config)
        engine, _ = choose_engines(config.engine).rollout.build(config, model, None, True, 1)
        del model
        actor = self.cluster.actors.workers[0]
        self._publish(step)
        rollout = config.rollout
        self.loop = RolloutLoop(
            engine, actor.policy.sampling, self.cluster.dock, self.ledger, self.mailbox, self._admit,
            self._score, group_size=rollout.n_samples_per_prompt,
            slots=config.trainer.rollout_slots or rollout.batch_size,
            chunk_tokens=config.trainer.chunk_tokens,
            pad_token_id=int(self.setup.tokenizer.pad_token_id),
            generator=sampling_generator(config.seed + step),
        )  # fmt: skip
        self._wall = time.perf_counter()
        self.loop.start()

    def _publish(self, version: int) -> tuple[float, int]:
        weights = self.cluster.actors.workers[0].publish_weights(version)
        self.mailbox.put(weights)
        return weights.seconds, weights.nbytes

    def _admit(self, groups: int, version: int) -> tuple[list[int], list[torch.Tensor]]:
        """Put the next `groups` prompts into the dock (rows of n each); their first rows and tokens."""
        from entrepot.grpo.workers import text_tensor

        positions = self.ledger.positions(groups)
        samples = [self.setup.source.batch(p, 1)[0] for p in positions]
        limit = self.config.data.max_prompt_tokens
        prompts = [torch.tensor(encode_prompt(self.setup, s.prompt, limit)) for s in samples]
        n = self.config.rollout.n_samples_per_prompt
        rows = self.cluster.dock.put_prompts(
            prompts, n, extra={"answer": [text_tensor(s.answer) for s in samples]}
        )
        first_rows = rows.view(-1, n)[:, 0].tolist()
        self.ledger.admit(first_rows, positions, version)
        return first_rows, prompts

    def _score(self, rows: Sequence[int]) -> None:
        self.cluster.rewards.workers[0].score_rows(self.cluster.dock, list(rows))


def _rows(groups: Sequence[Any], n: int) -> torch.Tensor:
    return torch.tensor([g.first_row + j for g in groups for j in range(n)], dtype=torch.int64)
