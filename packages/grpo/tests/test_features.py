"""Trainer features end to end, each checked by an effect that a no-op would not produce."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from entrepot.grpo import load_config, train
from entrepot.grpo.errors import StageError
from entrepot.grpo.run.metrics import read_metrics
from entrepot.grpo.trainer import Trainer

pytestmark = pytest.mark.integration  # training runs, some on Ray

LOCAL = ["resources.use_ray=false", "logging.tensorboard=false", "eval.every=0", "rollout.prompts_per_step=4",
         "checkpoint.keep_last=0"]  # fmt: skip


def _steps(tmp_path: Path, overrides: list[str], steps: int = 1) -> list[dict]:  # type: ignore[type-arg]
    trainer = Trainer(load_config(None, [*LOCAL, *overrides]), tmp_path)
    try:
        return [trainer.train_step() for _ in range(steps)]
    finally:
        trainer.close()


def test_dynamic_sampling_drops_and_refills(tmp_path: Path) -> None:
    reward = ["reward.custom={odd_zero: 'tests_support_rewards:varied_if_answer_even'}",
              "reward.verifiers={odd_zero: 1.0}", "algorithm.dynamic_sampling=true"]  # fmt: skip
    (step,) = _steps(tmp_path / "refill", [*reward, "algorithm.max_resample_rounds=20"])
    assert step["sampling/groups_dropped"] > 0 and step["sampling/rounds"] >= 1
    assert step["sampling/groups_kept"] == 4  # refilled to prompts_per_step varied groups
    assert step["dock/actor_train/rows"] == 4 * 8  # only kept groups were trained on
    assert step["dock/actor_rollout/rows"] == 8 * (4 + step["sampling/groups_dropped"])
    (capped,) = _steps(tmp_path / "capped", [*reward, "algorithm.max_resample_rounds=0"])
    assert capped["sampling/rounds"] == 0
    assert capped["dock/actor_train/rows"] == 8 * capped["sampling/groups_kept"] < 4 * 8 + 1


def test_kl_in_reward_shapes_the_advantages(tmp_path: Path) -> None:
    steps = _steps(tmp_path, ["algorithm.kl_in_reward=true", "algorithm.kl_coef=0.5", "algorithm.lr=1e-2"], 2)
    assert steps[0]["reward/kl_penalty"] == 0.0  # the policy still equals the reference
    assert steps[1]["reward/kl_penalty"] > 0.0
    assert "time/old_logp" in steps[1] and "kl" not in steps[1]  # KL left the loss


def test_epochs_and_mini_batches_clip(tmp_path: Path) -> None:
    (step,) = _steps(tmp_path, ["algorithm.epochs=2", "algorithm.mini_batch_size=16", "algorithm.lr=3e-2"])
    assert "time/old_logp" in step  # old log-probs were computed: the policy moves within the step
    assert step["clip_frac"] > 0.0


def test_offload_releases_training_weights_during_rollout(tmp_path: Path) -> None:
    (kept,) = _steps(tmp_path / "kept", ["engine.offload_params=false"])
    (offloaded,) = _steps(
        tmp_path / "off",
        ["engine.offload_params=true", "engine.offload_grads=true", "engine.offload_optimizer=true"],
    )
    assert kept["memory/train_param_bytes_in_rollout"] > 0
    assert offloaded["memory/train_param_bytes_in_rollout"] == 0


def test_plain_baseline_matches_the_full_system_first_step(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from plain_loop import plain_step

    from entrepot.grpo.engines.policy import build_policy

    config = load_config(None, [*LOCAL, "algorithm.lr=1e-2"])
    trainer = Trainer(config, tmp_path)
    try:
        full = trainer.train_step()
        full_grads, full_params = trainer.gradients(), trainer.parameters()
    finally:
        trainer.close()
    policy = build_policy(config)
    plain = plain_step(policy, config, 0)
    assert plain["pg_loss"] == pytest.approx(full["pg_loss"], abs=1e-7)
    for name, grad in full_grads.items():
        params = policy.trainer.named_parameters()
        torch.testing.assert_close(params[name].grad, grad, atol=1e-7, rtol=0)
        torch.testing.assert_close(params[name].detach(), full_params[name])


RAY = [
    "resources.use_ray=true",
    "logging.tensorboard=false",
    "eval.every=0",
    "rollout.prompts_per_step=4",
    "checkpoint.keep_last=0",
]


def test_overlapping_stages_overlap_and_agree(ray_session, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Without blocking the reward worker waits in the dock while the actor generates; same weights after."""
    results = {}
    for blocking in ("true", "false"):
        trainer = Trainer(load_config(None, [*RAY, f"resources.blocking={blocking}"]), tmp_path / blocking)
        try:
            steps = [trainer.train_step() for _ in range(2)]
            results[blocking] = (steps, trainer.parameters())
        finally:
            trainer.close()
    # Without blocking, the reward stage's get reached the dock before the responses it reads (it
    # waited there); with blocking it is sent once they are stored, and a get whose rows are ready
    # waits not at all. (How long it waited is timing: on a fast host generation takes ~15 ms.)
    waits = {mode: [step["dock/rule_reward/wait_s"] for step in results[mode][0]] for mode in results}
    assert max(waits["false"]) > 0, waits
    assert waits["true"] == [0.0, 0.0], waits
    for name, value in results["true"][1].items():
        assert torch.equal(value, results["false"][1][name]), name


def test_a_failing_stage_fails_the_step_fast_and_keeps_the_checkpoint(ray_session, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    flaky = ["reward.custom={flaky: 'tests_support_rewards:fails_after_64_calls'}",
             "reward.verifiers={flaky: 1.0}", "reward.accuracy_verifier=flaky"]  # fmt: skip
    config = load_config(
        None,
        [*RAY, "resources.blocking=false", "max_steps=5", "checkpoint.save_every=1",
         "resources.stage_timeout_s=300", *flaky],
    )  # fmt: skip
    start = time.perf_counter()
    with pytest.raises(StageError) as failure:
        train(config, tmp_path / "run")
    elapsed = time.perf_counter() - start
    message = str(failure.value)
    assert "'rule_reward'" in message and "reward rank 0" in message and "rows [" in message
    assert "verifier crashed" in message
    assert elapsed < 150, elapsed  # not a silent hang until the stage timeout (300 s; start-up included)
    # 32 responses x 2 verifier calls (reward + accuracy) per step: step 1 completes, step 2 fails
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_000001"]
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1]


def test_deterministic_engine_turns_on_deterministic_kernels(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        (step,) = _steps(tmp_path, ["engine.deterministic=true"])
        assert torch.are_deterministic_algorithms_enabled()  # set in the (in-process) actor worker
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert step["train_tokens"] > 0  # every kernel of a step has a deterministic implementation
    finally:
        torch.use_deterministic_algorithms(False)
