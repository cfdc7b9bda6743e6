"""The rollout rank of asynchronous training: its own engine, the rollout thread, the ledger, the weights.

One `RolloutWorker` runs the whole rollout side, wherever it is placed: an object in the driver's
process (one-process runs), or a Ray actor on a node of its own (Ray runs; threaded, so that a step's
`take` and a weight `receive_from_trainer` are served while the rollout thread decodes). It draws the
prompts itself (the same data source as the trainer's, by position), puts them into the run's dock,
scores each finished group with the rule verifiers (a `RewardWorker` object of its own) and keeps the
ledger the trainer takes groups from.

Weights arrive either as a `PublishedWeights` object handed over in one process (`receive`), or over
a `WeightChannel` from the trainer's rank 0 (`receive_from_trainer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from entrepot.grpo.asynchronous.ledger import Ledger, Taken
from entrepot.grpo.asynchronous.rollout_loop import RolloutLoop, RolloutStats
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data.sources import encode_prompt
from entrepot.grpo.embedded.threads import configure_threads
from entrepot.grpo.engines.weight_channel import WeightChannel
from entrepot.grpo.engines.weight_sync import PublishedWeights, WeightMailbox
from entrepot.grpo.errors import RolloutLostError
from entrepot.grpo.workers import RewardWorker, prompt_extras, wants_prompt_text
from entrepot.grpo.workers.ranks import RankInfo

__all__ = ["RolloutWorker"]


class RolloutWorker:
    """The rollout side of asynchronous training (see the module docstring).

    Args:
        config: the run's config.
        rank: its place (one rollout rank).
        channel: ``host:port`` of the trainer's weight channel (Ray runs); None in one process.
        secret: the run's secret the channel's messages are signed with (given with `channel`).
    """

    role = "rollout"

    def __init__(
        self,
        config: GRPOConfig,
        rank: RankInfo | None = None,
        channel: str | None = None,
        secret: bytes = b"",
    ) -> None:
        import torch

        from entrepot.grpo.engines.policy import initial_model
        from entrepot.grpo.engines.registry import choose_engines

        configure_threads(config.threads, interop=True)
        self.config, self.rank = config, rank or RankInfo(rank=0, world_size=1)
        self.name = f"rollout {self.rank.name}"
        model, self.setup = initial_model(config)
        self.engine, _ = choose_engines(config.engine).rollout.build(config, model, None, True, 1)
        del model
        self.scorer = RewardWorker(config)
        trainer = config.trainer
        bound = trainer.async_max_staleness
        self.ledger = Ledger(config.rollout.prompts_per_step, bound, trainer.staleness_policy)
        self.mailbox = WeightMailbox(timeout=trainer.weight_sync_timeout_s)
        self.channel_address, self._secret = channel, secret
        self._channel: WeightChannel | None = None
        self.loop: RolloutLoop | None = None
        self._dock: Any = None
        self._torch = torch

    def ready(self) -> bool:
        return True

    def start(self, dock: Any, step: int) -> None:
        """Start the rollout thread (once weights of version `step` are or will be in the mailbox)."""
        from entrepot.grpo.agents import build_rollout
        from entrepot.grpo.engines.base import SamplingParams
        from entrepot.grpo.engines.policy import sampling_generator

        config, tok = self.config, self.setup.tokenizer
        rollout = config.rollout
        self._dock = dock
        self.ledger.trained_version = step
        sampling = SamplingParams(
            temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
            max_new_tokens=self.setup.max_new_tokens,
            stop_token_ids=(tok.eos_token_id,) if rollout.stop_on_eos else (),
        )  # fmt: skip
        self.loop = RolloutLoop(
            self.engine, sampling, dock, self.ledger, self.mailbox, self._admit, self._score,
            group_size=rollout.n_samples_per_prompt,
            slots=config.trainer.rollout_slots or (self.ledger.max_staleness + 1) * rollout.batch_size,
            chunk_tokens=config.trainer.chunk_tokens, pad_token_id=int(tok.pad_token_id),
            generator=sampling_generator(config.seed + step), name=self.name,
            multiturn=build_rollout(config.multiturn, tok),
        )  # fmt: skip
        self.loop.start()

    # -- weights --------------------------------------------------------------------------------

    def receive(self, weights: PublishedWeights) -> None:
        """Weights handed over in this process (the rollout thread loads them at its next chunk)."""
        self.mailbox.put(weights)

    def receive_from_trainer(self, version: int) -> float:
        """Receive version `version` over the weight channel; the seconds the transfer took."""
        if self._channel is None:
            assert self.channel_address is not None  # Ray runs give the address
            self._channel = WeightChannel(
                self.channel_address, self._secret, sender=False,
                timeout=self.config.trainer.weight_sync_timeout_s, source="actor rank 0", target=self.name,
            )  # fmt: skip
        weights = self._channel.receive(version)
        self.mailbox.put(weights)
        return weights.seconds

    # -- the trainer's calls --------------------------------------------------------------------

    def take(self, timeout: float) -> Taken:
        """The next step's groups (`Ledger.take`); a dead or stuck rollout is `RolloutLostError`."""
        assert self.loop is not None
        try:
            return self.ledger.take(timeout, self.loop.check)
        except TimeoutError as error:
            self.loop.check()
            raise RolloutLostError(self.name, f"no step's worth of groups in {timeout:g} s: {error} "
                                   f"(it was {self.loop.doing})") from None  # fmt: skip

    def trained(self) -> None:
        self.ledger.trained()

    def release(self, groups: int) -> None:
        self.ledger.release(groups)

    def stats(self) -> RolloutStats:
        return self.loop.take_stats() if self.loop is not None else RolloutStats()

    def outstanding(self) -> int:
        return len(self.ledger.outstanding())

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the prompts admitted but not trained (their responses are generated
        again after a resume), the next new prompt, and the rollout's policy version."""
        version = self.loop.version if self.loop is not None else -1
        outstanding, next_position = self.ledger.snapshot()
        return {"outstanding": outstanding, "next_position": next_position, "rollout_version": version}

    def restore(self, state: dict[str, Any], step: int) -> None:
        self.ledger.restore(step, int(state["next_position"]), [int(p) for p in state["outstanding"]])

    def data_position(self) -> int:
        return self.ledger.next_position

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.stop()

    def shutdown(self) -> None:
        self.stop()

    # -- the rollout thread's callbacks ---------------------------------------------------------

    def _admit(self, groups: int, version: int) -> tuple[list[int], list[Any]]:
        """Put the next `groups` prompts into the dock (rows of n each); their first rows and tokens."""
        torch = self._torch
        positions = self.ledger.positions(groups)
        samples = [self.setup.source.batch(p, 1)[0] for p in positions]
        limit = self.config.data.max_prompt_tokens
        prompts = [torch.tensor(encode_prompt(self.setup, s.prompt, limit)) for s in samples]
        n = self.config.rollout.n_samples_per_prompt
        extra = prompt_extras(samples, with_prompt_text=wants_prompt_text(self.config))
        rows = self._dock.put_prompts(prompts, n, extra=extra)
        first_rows = rows.view(-1, n)[:, 0].tolist()
        self.ledger.admit(first_rows, positions, version)
        return first_rows, prompts

    def _score(self, rows: Sequence[int]) -> dict[str, float]:
        return self.scorer.score_rows(self._dock, rows)
