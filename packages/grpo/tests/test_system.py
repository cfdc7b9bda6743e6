"""The full system end to end: through Ray (reward rises), data parallel with 2 ranks, exact resume."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from entrepot.grpo import load_config, train
from entrepot.grpo.run.metrics import read_metrics

pytestmark = pytest.mark.integration  # training runs, some on Ray

SMALL = ["eval.num_prompts=64", "logging.tensorboard=false", "checkpoint.keep_last=0"]


def test_reward_rises_through_ray(  # type: ignore[no-untyped-def]
    ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also: the dock actor saves and loads only inside the run directory, given relative to the driver.

    (The relative run directory was a test of its own, two 1-step runs; here the run stops at step 49,
    whose final checkpoint holds the dock's state, and a resume trains step 50: resume is bit-exact,
    see test_resume_gives_bit_identical_parameters, so the 50 steps are those of one run.)
    """
    monkeypatch.chdir(tmp_path)
    overrides = [
        *SMALL,
        "resources.use_ray=true",
        "eval.every=0",
        "checkpoint.save_every=0",
        "algorithm.lr=3e-3",
        "data.num_digits=4",
    ]
    first = train(load_config(None, [*overrides, "max_steps=49"]), Path("run"))
    assert first.steps == 49
    assert (tmp_path / "run" / "checkpoints" / "step_000049" / "dock.pt").is_file()  # in the run directory
    result = train(load_config(None, [*overrides, "max_steps=50"]), Path("run"), resume=True)
    assert result.steps == 50 and len(result.history) == 1
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 50 and result.steps == 50
    first_mean = sum(r["reward_mean"] for r in rows[:10]) / 10
    last_mean = sum(r["reward_mean"] for r in rows[-10:]) / 10
    assert last_mean > first_mean + 0.1, (first_mean, last_mean)
    for key in ("kl", "clip_frac", "entropy", "grad_norm", "lr", "tokens_per_s", "time/generate", "time/ref"):
        assert key in rows[-1]
    assert "accuracy" in rows[-1]  # the final step evaluates
    assert (result.checkpoint / "model.safetensors").is_file()  # type: ignore[operator]


def test_two_data_parallel_ranks_stay_in_sync(ray_session, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from entrepot.dock.sharded import ShardedDockClient
    from entrepot.grpo.trainer import Trainer
    from entrepot.grpo.workers import ActorWorker, wait_all

    # dock.shards=2 on one machine: the sharded dock (two shard actors here) serves the ranks
    config = load_config(None, [*SMALL, "max_steps=2", "resources.num_actor_workers=2",
                                "rollout.prompts_per_step=8", "eval.every=0", "dock.shards=2"])  # fmt: skip
    trainer = Trainer(config, tmp_path / "dp")
    try:
        assert isinstance(trainer.dock, ShardedDockClient) and len(trainer.dock.shards) == 2
        before = trainer.parameters(0)
        trainer.train_step()
        step = trainer.train_step()
        rank0, rank1 = trainer.parameters(0), trainer.parameters(1)
        infos = wait_all([trainer.actors.call(ActorWorker.runtime_info)], 60)[0]
    finally:
        trainer.close()
    assert step["dp/token_imbalance"] < 0.05  # the driver's plan spread tokens evenly over the ranks
    assert step["dock/actor_train/rows"] == 64  # both ranks read their planned rows
    assert {i["omp_wait_policy"] for i in infos} == {"PASSIVE"}  # set before torch loaded in the worker
    assert {i["torch_threads"] for i in infos} == {1} and infos[0]["pid"] != infos[1]["pid"]
    for name, value in rank0.items():
        assert torch.equal(value, rank1[name]), name  # averaged gradients keep replicas identical
        assert not torch.equal(value, before[name]), name  # every trainable parameter moved


OFFLOADED = ("engine.offload_params=true", "engine.offload_grads=true", "engine.offload_optimizer=true")


@pytest.mark.parametrize("offload", [(), OFFLOADED], ids=["resident", "offloaded"])
def test_resume_gives_bit_identical_parameters(offload: tuple[str, ...], tmp_path: Path) -> None:
    """Offloaded: the checkpoint reads (and resume writes) optimizer state that sits in host memory."""
    overrides = [*SMALL, "max_steps=3", "checkpoint.save_every=2", "eval.every=0", "resources.use_ray=false",
                 "rollout.prompts_per_step=8", *offload]  # fmt: skip
    config = load_config(None, overrides)
    full = tmp_path / "full"
    train(config, full)
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000003")
    result = train(config, resumed, resume=True)
    assert result.steps == 3 and len(result.history) == 1  # only step 3 ran again
    assert [r["step"] for r in read_metrics(resumed / "metrics.jsonl")] == [1, 2, 3]  # no duplicate step 3
    a = load_file(str(full / "checkpoints" / "step_000003" / "model.safetensors"))
    b = load_file(str(resumed / "checkpoints" / "step_000003" / "model.safetensors"))
    start = load_file(str(full / "checkpoints" / "step_000002" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], start[k]) for k in a)  # step 3 did change the weights


def test_evaluate_a_run_directory(tmp_path: Path) -> None:
    from entrepot.grpo import evaluate

    config = load_config(
        None, [*SMALL, "max_steps=1", "resources.use_ray=false", "rollout.prompts_per_step=4"]
    )
    train(config, tmp_path / "run")
    result = evaluate(tmp_path / "run", num_prompts=16)
    assert 0.0 <= result["accuracy"] <= 1.0 and result["step"] == 1.0
    assert result["eval_prompts"] == 16.0
    assert evaluate(tmp_path / "run")["eval_prompts"] == 64.0  # the run's eval.num_prompts (SMALL)


def test_ctrl_c_saves_a_checkpoint_and_returns(tmp_path: Path) -> None:
    config = load_config(None, [*SMALL, "max_steps=10", "eval.every=0", "resources.use_ray=false",
                                "rollout.prompts_per_step=4", "checkpoint.save_every=0"])  # fmt: skip

    def interrupt_at_two(metrics: dict) -> None:  # type: ignore[type-arg]
        if metrics["step"] == 2:
            raise KeyboardInterrupt

    result = train(config, tmp_path / "run", on_step=interrupt_at_two)
    assert result.interrupted and result.steps == 2
    assert result.checkpoint is not None and result.checkpoint.name == "step_000002"
    assert (result.checkpoint / "model.safetensors").is_file()


def test_offloading_while_generating_changes_nothing(tmp_path: Path) -> None:
    from entrepot.grpo.trainer import Trainer

    base = [*SMALL, "resources.use_ray=false", "rollout.prompts_per_step=4", "eval.every=0"]
    params = []
    for offload in ("false", "true"):
        trainer = Trainer(
            load_config(
                None,
                [*base, *(f"engine.offload_{part}={offload}" for part in ("params", "grads", "optimizer"))],
            ),
            tmp_path / offload,
        )
        try:
            trainer.train_step()
            trainer.train_step()
            params.append(trainer.parameters())
        finally:
            trainer.close()
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])


def test_startup_is_reported_as_it_happens_and_timed_apart_from_step_one(tmp_path: Path) -> None:
    overrides = [*SMALL, "max_steps=2", "checkpoint.save_every=1", "eval.every=0", "resources.use_ray=false",
                 "rollout.prompts_per_step=4"]  # fmt: skip
    config = load_config(None, overrides)
    lines: list[str] = []
    first = train(config, tmp_path, on_startup=lines.append)
    assert lines[:2] == [
        "loading the trainer",
        "starting 1 actor rank(s) + 1 reward worker(s) in this process",
    ]
    assert re.fullmatch(
        r"started in [\d.]+ s \((imports [\d.]+ s, )?dock and workers built [\d.]+ s\)", lines[-1]
    )
    assert first.history[0]["time/startup"] > 0 and "time/startup" not in first.history[1]
    lines.clear()
    more = load_config(None, [*overrides, "max_steps=3"])
    resumed = train(more, tmp_path, resume=True, on_startup=lines.append)
    assert "restoring the newest checkpoint" in lines  # the resumed session times its own start-up
    assert [r["step"] for r in resumed.history] == [3] and resumed.history[0]["time/startup"] > 0


def test_a_worker_that_fails_to_start_on_ray_raises_its_own_error(ray_session, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from entrepot.grpo.errors import RewardError
    from entrepot.grpo.trainer import Trainer

    # the driver-side check is skipped (Trainer, not train): a verifier importable only in the
    # driver fails the same way inside the reward worker
    bad = ["reward.custom={mine: no_such_module:score}", "reward.verifiers={mine: 1.0}"]
    with pytest.raises(RewardError, match=r"^reward\.custom\.mine \('no_such_module:score'\) cannot be"):
        Trainer(load_config(None, [*SMALL, *bad, "resources.use_ray=true"]), tmp_path / "run")
