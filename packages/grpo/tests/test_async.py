"""Asynchronous training runs (`trainer.mode: async`, one process): the bound, the order, the failures.

Each test trains a few steps of the embedded default with small steps; the rollout decodes 2 tokens
per chunk so that responses (8-9 tokens) span several chunks and meet new weights mid-response.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from entrepot.grpo import load_config
from entrepot.grpo.errors import RolloutLostError, WeightSyncError
from entrepot.grpo.trainer import Trainer

pytestmark = pytest.mark.integration  # training runs

P = 8  # prompts a step
FAST = [
    "trainer.mode=async", "trainer.chunk_tokens=2", f"rollout.prompts_per_step={P}",
    "rollout.n_samples_per_prompt=4", "eval.every=0", "eval.num_prompts=8", "checkpoint.save_every=0",
    "logging.tensorboard=false", "logging.samples_every=0",
]  # fmt: skip


def _trainer(tmp_path: Path, *overrides: str, name: str = "run") -> Trainer:
    return Trainer(load_config(None, [*FAST, *overrides]), tmp_path / name)


def _trained_prompts(run_dir: Path) -> list[list[int]]:
    lines = (run_dir / "prompts.jsonl").read_text().splitlines()
    return [json.loads(line)["prompts"] for line in lines if line]


def _ages(rows: list[dict[str, Any]]) -> set[int]:
    return {
        int(k.rsplit("_", 1)[1])
        for r in rows
        for k, v in r.items()
        if k.startswith("async/tokens_age_") and v
    }


class _HoldUntilNewWeights:
    """Holds the rollout thread right after it admits new prompts, until the trainer publishes newer
    weights, whenever the trainer needs nothing more from the rollout to publish them (every group of
    the step it trains is finished): the new responses are then mid-decode when the weights change,
    whatever the machine's load. Each policy version is held once; a hold gives up after 60 s."""

    def __init__(self, worker: Any) -> None:
        self.worker, self.admit, self.score = worker, worker._admit, worker._score
        self.admitted: list[list[int]] = []  # [first_row, finished] in admission order (rows are reused)
        self.held: set[int] = set()
        worker._admit, worker._score = self._admit, self._score

    def _score(self, rows: list[int]) -> None:
        self.score(rows)
        firsts = set(rows[:: self.worker.config.rollout.n_samples_per_prompt])
        for group in self.admitted:
            if group[0] in firsts and not group[1]:
                group[1], firsts = 1, firsts - {group[0]}

    def _admit(self, groups: int, version: int) -> tuple[list[int], list[Any]]:
        needed = self.admitted[: P * (version + 1)]  # the groups of the steps up to update version + 1
        if version not in self.held and len(needed) == P * (version + 1) and all(g[1] for g in needed):
            self.held.add(version)
            deadline = time.monotonic() + 60
            while self.worker.mailbox.latest().version <= version and time.monotonic() < deadline:
                time.sleep(0.01)
        first_rows, prompts = self.admit(groups, version)
        self.admitted += [[row, 0] for row in first_rows]
        return first_rows, prompts


def test_async_trains_in_prompt_order_within_the_bound_and_updates_in_flight(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, "trainer.max_staleness=1", "max_steps=6")
    _HoldUntilNewWeights(trainer.grpo_step.sampling.rollouts.workers[0])  # type: ignore[attr-defined]
    try:
        before = trainer.parameters()
        rows = trainer.fit()
        after = trainer.parameters()
    finally:
        trainer.close()
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    # wait policy: step s trains the s-th batch of prompts drawn, each prompt once
    assert _trained_prompts(tmp_path / "run") == [list(range(s * P, (s + 1) * P)) for s in range(6)]
    assert _ages(rows) <= {0, 1} and 1 in _ages(rows)  # one version behind at most, and it ran ahead
    # Every version up to the rollout's was loaded or, published while it was busy, skipped for a newer
    # one (the mailbox keeps the newest only), and the version it holds at the last step is within the
    # bound; a load after the last step's figures is not counted. So the number of loads depends on the
    # timing (issue 58 saw 5, not >= 6, at load 12-22) and is not asserted.
    versions = [r["async/rollout_version"] for r in rows]
    assert versions == sorted(versions) and versions[-1] >= 6 - 1 - 1
    assert sum(r["async/weight_loads"] + r["async/weight_versions_skipped"] for r in rows) == versions[-1] + 1
    assert sum(r["async/in_flight_updates"] for r in rows) >= 1  # responses continued under new weights
    assert all(0.0 < r["offpolicy/is_weight_mean"] <= 2.0 for r in rows)  # tis, cap 2: on by default
    assert all(r["async/weight_sync_gbps"] > 0 for r in rows if r["async/weight_loads"])
    assert all(0.0 <= r["async/trainer_idle_frac"] <= 1.0 and 0.0 <= r["async/rollout_idle_frac"] <= 1.0
               for r in rows)  # fmt: skip


def test_lockstep_bound_trains_only_fresh_tokens(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, "trainer.max_staleness=0", "max_steps=3")
    try:
        rows = trainer.fit()
    finally:
        trainer.close()
    assert _ages(rows) == {0}


def test_drop_policy_trains_first_finished_and_drops_past_the_bound(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, "trainer.staleness_policy=drop", "trainer.max_staleness=0", "max_steps=4")
    try:
        rows = trainer.fit()
    finally:
        trainer.close()
    assert _ages(rows) == {0}  # nothing older than the bound was trained
    trained = [p for step in _trained_prompts(tmp_path / "run") for p in step]
    assert len(trained) == len(set(trained)) == 4 * P  # each prompt trained at most once
    assert all("async/groups_dropped" in r for r in rows)


def test_a_rollout_that_dies_mid_generation_fails_the_step_naming_it(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, "max_steps=5")
    try:
        trainer.train_step()
        loop = trainer.grpo_step.sampling.rollouts.workers[0].loop  # type: ignore[attr-defined]

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the device fell off the bus")

        loop.engine.generate = broken
        t0 = time.monotonic()
        with pytest.raises(RolloutLostError, match=r"rollout rank 0 failed: RuntimeError: the device fell"):
            for _ in range(4):
                trainer.train_step()
        assert time.monotonic() - t0 < 30
    finally:
        trainer.close()


def test_a_rollout_that_stops_answering_fails_the_step_within_the_timeout(tmp_path: Path) -> None:
    trainer = _trainer(
        tmp_path, "max_steps=5", "resources.stage_timeout_s=1", "trainer.weight_sync_timeout_s=1"
    )
    try:
        trainer.train_step()
        loop = trainer.grpo_step.sampling.rollouts.workers[0].loop  # type: ignore[attr-defined]
        stuck = loop._stop  # the loop's own stop event: close() releases it

        def hangs(*args: Any, **kwargs: Any) -> Any:
            stuck.wait()
            raise InterruptedError

        loop.engine.generate = hangs
        t0 = time.monotonic()
        with pytest.raises(RolloutLostError, match=r"rollout rank 0 failed: no step's worth .* decoding"):
            for _ in range(4):
                trainer.train_step()
        assert time.monotonic() - t0 < 15
    finally:
        trainer.close()


def test_weights_corrupted_in_a_sync_fail_the_run_naming_both_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from entrepot.grpo.workers import ActorWorker

    trainer = _trainer(tmp_path, "max_steps=5")
    try:
        trainer.train_step()
        publish = ActorWorker.publish_weights

        def corrupted(worker: ActorWorker, version: int) -> Any:
            weights = publish(worker, version)
            weights.buckets[0][0] += 1.0  # a bit flipped between the trainer and the rollout
            return weights

        monkeypatch.setattr(ActorWorker, "publish_weights", corrupted)
        with pytest.raises(WeightSyncError, match=r"from actor rank 0 to rollout rank 0: checksum mismatch"):
            for _ in range(4):
                trainer.train_step()
    finally:
        trainer.close()


def test_resume_redoes_the_prompts_in_flight_and_skips_none(tmp_path: Path) -> None:
    first = _trainer(tmp_path, "max_steps=5", "checkpoint.save_every=2")
    try:
        for _ in range(3):  # checkpoint at step 2; step 3 trains and its checkpoint never comes
            first.train_step()
            if first.step == 2:
                first.save()
        outstanding = first.grpo_step.sampling.state()["outstanding"]  # type: ignore[attr-defined]
    finally:
        first.close()
    assert outstanding  # the rollout had prompts in flight when it stopped
    from entrepot.grpo.run.resume import resume_point

    config = load_config(None, [*FAST, "max_steps=5"])
    point = resume_point(tmp_path / "run", config)
    assert point.step == 2
    second = Trainer(config, tmp_path / "run", resume=point)
    try:
        second.fit()
    finally:
        second.close()
    # steps 3-5 of the resumed run train the prompts after step 2's, in order, each once: those the
    # first run had in flight (and trained in its step 3, never checkpointed) are redone
    assert _trained_prompts(tmp_path / "run") == [list(range(s * P, (s + 1) * P)) for s in range(2, 5)]


def test_a_llama_model_rolls_out_asynchronously_through_the_llama_engine(tmp_path: Path) -> None:
    """The actor hands its parameters over by HF name (its engine reads them); the rollout rank's own
    copy loads each published version."""
    from tests_support_models import tiny_model_dir

    model = tiny_model_dir(tmp_path / "llama", architecture="llama")
    data = tmp_path / "train.jsonl"
    lines = [json.dumps({"prompt": f"what is {i % 3 + 1} ?", "answer": str(i % 3 + 1)}) for i in range(64)]
    data.write_text("\n".join(lines))
    trainer = _trainer(
        tmp_path, f"model.path={model}", "data.task=jsonl", f"data.train_path={data}",
        "rollout.prompts_per_step=2", "rollout.max_new_tokens=6", "max_steps=3",
        "reward.verifiers={exact_match: 1.0, partial_credit: 0.5}",
    )  # fmt: skip
    try:
        engine = trainer.grpo_step.sampling.rollouts.workers[0].engine  # type: ignore[attr-defined]
        rows = trainer.fit()
    finally:
        trainer.close()
    assert type(engine).__name__ == "LlamaRolloutEngine"
    assert [r["step"] for r in rows] == [1, 2, 3] and _ages(rows) <= {0, 1}


@pytest.mark.parametrize(
    "layout",
    [["resources.num_actor_workers=2"], ["engine.train=megatron", "parallel.train.tensor=2"]],
    ids=["torch-dp2", "megatron-tp2"],
)
def test_on_ray_the_rollout_rank_gets_each_update_over_the_weight_channel(
    ray_session: Any, tmp_path: Path, layout: list[str]
) -> None:
    """Two actor ranks (data- or tensor-parallel) and the rollout rank, each a Ray actor: rank 0 sends
    every update's weights over the signed channel; the reference stage reads the step's rows."""
    trainer = _trainer(tmp_path, "resources.use_ray=true", "max_steps=3", *layout)
    try:
        rows = trainer.fit()
    finally:
        trainer.close()
    assert [r["step"] for r in rows] == [1, 2, 3] and _ages(rows) <= {0, 1}
    assert all(r["async/channel_gbps"] > 0 and r["async/publish_bytes"] > 0 for r in rows)  # not Ray
    assert _trained_prompts(tmp_path / "run") == [list(range(s * P, (s + 1) * P)) for s in range(3)]
    assert all(r["dock/ref_log_prob/rows"] == P * 4 for r in rows)  # every row of the step, once


def test_on_ray_a_rollout_rank_that_dies_mid_sync_fails_the_step_naming_it(
    ray_session: Any, tmp_path: Path
) -> None:
    from entrepot.grpo.errors import StageError

    trainer = _trainer(tmp_path, "resources.use_ray=true", "max_steps=5", "trainer.weight_sync_timeout_s=5")
    try:
        trainer.train_step()
        sampling = trainer.grpo_step.sampling
        updated = sampling.updated

        def dies_first(version: int) -> dict[str, float]:  # the rollout process dies as the sync begins
            ray_session.kill(sampling.rollouts.actors[0])  # type: ignore[attr-defined]
            return updated(version)

        sampling.updated = dies_first  # type: ignore[method-assign]
        t0 = time.monotonic()
        with pytest.raises((StageError, WeightSyncError), match=r"rollout rank 0"):
            trainer.train_step()
        assert time.monotonic() - t0 < 30
    finally:
        trainer.close()


def test_on_ray_a_rollout_rank_killed_mid_generation_fails_the_next_step_naming_its_node(
    ray_session: Any, tmp_path: Path
) -> None:
    from entrepot.grpo.errors import StageError

    trainer = _trainer(tmp_path, "resources.use_ray=true", "max_steps=5")
    try:
        trainer.train_step()  # the rollout goes on decoding the next step's groups
        ray_session.kill(trainer.grpo_step.sampling.rollouts.actors[0])  # type: ignore[attr-defined]
        with pytest.raises(StageError, match=r"rollout rank 0 on node .*: the worker process died"):
            trainer.train_step()
    finally:
        trainer.close()
