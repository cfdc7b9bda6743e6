"""Asynchronous training's parts, each alone: the ledger's staleness bound, the weight sync, the config.

No training run here (test_async.py runs them): the ledger and the mailbox are driven by hand, the
config is only validated.
"""

from __future__ import annotations

import threading

import pytest
import torch

from entrepot.grpo import load_config
from entrepot.grpo.asynchronous.ledger import Ledger
from entrepot.grpo.engines.weight_sync import WeightMailbox, publish
from entrepot.grpo.errors import GRPOConfigError, RolloutLostError, WeightSyncError


def _alive() -> None:
    pass


def _admit(ledger: Ledger, version: int, groups: int, n: int = 2) -> list[int]:
    positions = ledger.positions(groups)
    first = [p * n for p in positions]
    ledger.admit(first, positions, version)
    return first


def test_wait_admits_only_what_trains_within_the_bound_and_trains_in_admission_order() -> None:
    ledger = Ledger(prompts_per_step=2, max_staleness=1, policy="wait")
    # version 0, nothing trained: steps 0 and 1 may be sampled by version 0 (bound 1) -> 4 groups
    assert ledger.admissible(0) == 4
    _admit(ledger, 0, 4)
    assert ledger.admissible(0) == 0
    ledger.finish([6, 2])  # groups 1 and 3 finish first; step 0 still waits for group 0
    with pytest.raises(TimeoutError, match=r"prompts still generating: \[0, 2\]"):
        ledger.take(0.05, _alive)
    ledger.finish([0])
    taken = ledger.take(1.0, _alive)
    assert [g.position for g in taken.groups] == [0, 1] and not taken.dropped
    ledger.trained()
    ledger.release(2)
    # the rollout still at version 0: step 2 would be 2 versions past it -> nothing more
    assert ledger.admissible(0) == 0
    assert ledger.admissible(1) == 2  # with version 1 loaded: step 2 is within the bound
    assert ledger.outstanding() == [2, 3]


def test_zero_staleness_is_lockstep() -> None:
    ledger = Ledger(prompts_per_step=3, max_staleness=0, policy="wait")
    assert ledger.admissible(0) == 3
    _admit(ledger, 0, 3)
    assert ledger.admissible(0) == 0
    ledger.finish([0, 2, 4])
    ledger.take(1.0, _alive)
    ledger.trained()
    ledger.release(3)
    assert ledger.admissible(0) == 0  # the rollout must load version 1 first
    assert ledger.admissible(1) == 3


def test_drop_trains_the_first_finished_and_drops_the_stale() -> None:
    ledger = Ledger(prompts_per_step=1, max_staleness=1, policy="drop")
    assert ledger.admissible(0) == 2
    _admit(ledger, 0, 2, n=1)  # positions 0, 1 at version 0
    ledger.finish([1])
    assert [g.position for g in ledger.take(1.0, _alive).groups] == [1]  # finished first, trained first
    ledger.trained()
    ledger.release(1)
    ledger.trained()  # version 2: group 0 (version 0) is now 2 versions old
    _admit(ledger, 2, 1, n=1)  # position 2 at version 2
    ledger.finish([0, 2])
    taken = ledger.take(1.0, _alive)
    assert [g.position for g in taken.dropped] == [0]
    assert [g.position for g in taken.groups] == [2]


def test_a_dead_rollout_ends_the_wait_at_once() -> None:
    ledger = Ledger(prompts_per_step=1, max_staleness=0, policy="wait")

    def dead() -> None:
        raise RolloutLostError("rollout rank 0", "RuntimeError: boom")

    with pytest.raises(RolloutLostError, match="rollout rank 0 failed: RuntimeError: boom"):
        ledger.take(60.0, dead)


def test_outstanding_prompts_are_admitted_again_first_after_a_restore() -> None:
    ledger = Ledger(prompts_per_step=2, max_staleness=1, policy="wait")
    ledger.restore(trained_version=3, next_position=10, outstanding=[7, 6, 9])
    assert ledger.positions(2) == [6, 7]
    assert ledger.positions(3) == [9, 10, 11]
    assert ledger.next_position == 12


def test_published_weights_come_back_verified_and_bucketed() -> None:
    weights = {"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int64), "c": torch.randn(7)}
    published = publish(4, weights)
    assert published.version == 4 and len(published.buckets) == 2  # one per dtype
    weights["a"].zero_()  # training goes on: the published copy does not change
    back = published.verified("actor rank 0", "rollout rank 0")
    assert set(back) == {"a", "b", "c"}
    assert torch.equal(back["b"], torch.arange(5)) and not torch.equal(back["a"], weights["a"])


def test_a_corrupted_bucket_is_refused_naming_both_ranks() -> None:
    published = publish(2, {"w": torch.randn(64), "v": torch.randn(8)})
    published.buckets[0][3] += 1.0
    with pytest.raises(WeightSyncError, match=r"version 2 from actor rank 0 to rollout rank 0: checksum"):
        published.verified("actor rank 0", "rollout rank 0")


def test_the_mailbox_waits_for_newer_weights_with_a_timeout() -> None:
    mailbox = WeightMailbox(timeout=0.2)
    mailbox.put(publish(0, {"w": torch.zeros(2)}))
    with pytest.raises(WeightSyncError, match=r"nothing newer published within 0\.2 s"):
        mailbox.wait_newer(0, "rollout rank 0")
    threading.Timer(0.05, lambda: mailbox.put(publish(1, {"w": torch.ones(2)}))).start()
    mailbox.timeout = 5.0
    assert mailbox.wait_newer(0, "rollout rank 0").version == 1
    with pytest.raises(ValueError, match="not newer"):
        mailbox.put(publish(1, {"w": torch.ones(2)}))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("resources.colocate=false", "resources.colocate"),
        ("trainer.rollout_resources={CPU: 1}", "trainer.rollout_resources.CPU"),
        ("parallel.infer.tensor=2", "parallel.infer.tensor"),
        ("rollout.partial_max_tokens=4", "rollout.partial_max_tokens"),
        ("algorithm.dynamic_sampling=true", "algorithm.dynamic_sampling"),
        ("model.lora.rank=4", "model.lora.rank"),
        ("trainer.max_staleness=-1", "trainer.max_staleness"),
        ("trainer.staleness_policy=skip", "trainer.staleness_policy"),
        ("trainer.chunk_tokens=0", "trainer.chunk_tokens"),
    ],
)
def test_what_async_does_not_run_yet_is_refused_naming_the_key(override: str, key: str) -> None:
    with pytest.raises(GRPOConfigError, match=key.replace(".", r"\.")):
        load_config(None, ["trainer.mode=async", override])


def test_the_default_is_synchronous() -> None:
    config = load_config(None, [])
    assert config.trainer.mode == "sync" and not config.trainer.asynchronous


def test_a_checkpoint_keeps_prompts_drawn_but_not_yet_admitted() -> None:
    ledger = Ledger(prompts_per_step=2, max_staleness=1, policy="wait")
    _admit(ledger, 0, 2)
    drawn = ledger.positions(2)  # the rollout is putting these into the dock right now
    assert ledger.snapshot() == ([0, 1, *drawn], 4)  # a save in between loses none of them
    ledger.restore(trained_version=0, next_position=4, outstanding=[0, 1, 2, 3])
    assert ledger.snapshot() == ([0, 1, 2, 3], 4)  # waiting to be admitted again still counts
