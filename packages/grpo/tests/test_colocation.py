"""Full co-location and its alternative: reward models, a reference of its own, each model per stage.

Every test runs the real workers (in this process, or on Ray for separate workers) on the embedded
reverse task, with a tiny reward model the test builds and saves as a local directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests_support_models import built_default_dir, tiny_reward_model_dir

from entrepot.grpo import load_config, train
from entrepot.grpo.run.metrics import read_metrics

SMALL = ["eval.num_prompts=16", "logging.tensorboard=false", "eval.every=0", "rollout.prompts_per_step=4"]
LOCAL = [*SMALL, "resources.use_ray=false"]


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # a Qwen2 classifier reading bytes: the reverse task's digits are one token each
    return tiny_reward_model_dir(tmp_path_factory.mktemp("rm") / "rm", "classifier", "qwen2")


def _texts(trainer, rows: torch.Tensor) -> tuple[list[str], list[str], list[str]]:  # type: ignore[no-untyped-def]
    """Prompt texts, response texts and answers of `rows`, decoded as the reward stage decodes them."""
    from entrepot.grpo.workers import tensor_text

    batch = trainer.dock.peek(["prompts", "responses", "answer"], rows, layout="packed")
    tok = trainer.setup.tokenizer

    def split(name: str) -> list[torch.Tensor]:
        return list(torch.split(batch.data[name], batch.lengths[name].tolist()))

    prompts = [tok.decode(p.tolist(), skip_special_tokens=False) for p in split("prompts")]
    responses = [tok.decode(r.tolist(), skip_special_tokens=True) for r in split("responses")]
    return prompts, responses, [tensor_text(a) for a in split("answer")]


@pytest.mark.integration  # a trainer's stages
@pytest.mark.parametrize("mix", ["verifiers", "models", "both"])
def test_the_reward_stage_gives_the_weighted_sum_whatever_the_mix(
    mix: str, reward_model_dir: Path, tmp_path: Path
) -> None:
    from entrepot.grpo.data import rewards
    from entrepot.grpo.engines.reward_model import load_reward_model
    from entrepot.grpo.trainer import Trainer

    overrides = {
        "verifiers": ["reward.verifiers={partial_credit: 1.0}"],
        "models": ["reward.verifiers={}", f"reward.models={{{reward_model_dir}: 0.5}}"],
        "both": ["reward.verifiers={partial_credit: 1.0}", f"reward.models={{{reward_model_dir}: 0.5}}"],
    }[mix]
    trainer = Trainer(load_config(None, [*LOCAL, *overrides]), tmp_path / mix)
    try:
        rows, _ = trainer.grpo_step.generate(4, version=0)  # prompts, rollout, [reward models], rule reward
        out = trainer.dock.peek(["rm_scores", "accuracy"], rows).data  # the same columns for every mix
        prompts, responses, answers = _texts(trainer, rows)
    finally:
        trainer.close()
    expected = torch.zeros(rows.numel())
    if mix != "models":
        expected += torch.tensor(rewards.score(responses, answers, {"partial_credit": 1.0}))
    if mix != "verifiers":  # the model run directly on the same texts
        expected += 0.5 * load_reward_model(reward_model_dir).score(prompts, responses)
    torch.testing.assert_close(out["rm_scores"], expected, rtol=0, atol=1e-5)
    correct = rewards.score(responses, answers, {"exact_match": 1.0})
    assert out["accuracy"].tolist() == [float(c >= 1) for c in correct]


@pytest.mark.integration  # training runs
def test_reference_from_its_own_path_is_used_and_kept_on_resume(tmp_path: Path) -> None:
    ref_dir = built_default_dir(tmp_path / "ref", seed=123)
    ref = load_file(str(ref_dir / "model.safetensors"))
    overrides = [
        *LOCAL,
        "checkpoint.save_every=1",
        "checkpoint.keep_last=0",
        f"model.ref_model_load_path={ref_dir}",
    ]
    run = tmp_path / "run"
    train(load_config(None, [*overrides, "max_steps=1"]), run)
    train(load_config(None, [*overrides, "max_steps=2"]), run, resume=True)
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[0]["kl"] > 1e-3  # a reference other than the initial policy: KL from the first step
    for step in ("step_000001", "step_000002"):  # saved, then restored and saved again by the resumed run
        saved = load_file(str(run / "checkpoints" / step / "reference.safetensors"))
        assert saved.keys() <= ref.keys() and saved
        assert all(torch.equal(saved[k], ref[k]) for k in saved), step
    policy = load_file(str(run / "checkpoints" / "step_000001" / "model.safetensors"))
    assert any(not torch.equal(policy[k], ref[k]) for k in policy)


def test_a_reference_of_another_vocabulary_is_refused_before_start(tmp_path: Path) -> None:
    from tests_support_models import tiny_model_dir

    from entrepot.grpo.errors import DataError
    from entrepot.grpo.run.preflight import check_inputs

    other = tiny_model_dir(tmp_path / "words")  # 11 tokens; the reverse task has its own vocabulary
    config = load_config(None, [*LOCAL, f"model.ref_model_load_path={other}"])
    with pytest.raises(DataError, match=r"^model\.ref_model_load_path \(.*words.*vocab_size"):
        check_inputs(config)


def test_a_bad_reward_model_directory_is_refused_before_start(tmp_path: Path) -> None:
    from tests_support_models import tiny_model_dir

    from entrepot.grpo.errors import RewardModelError
    from entrepot.grpo.run.preflight import check_inputs

    causal = tiny_model_dir(tmp_path / "causal")  # a causal LM without a value head scores nothing
    config = load_config(None, [*LOCAL, f"reward.models={{{causal}: 1.0}}"])
    with pytest.raises(RewardModelError, match="causal"):
        check_inputs(config)


TRAINING_STATE = [f"engine.offload_{part}=true" for part in ("params", "grads", "optimizer")]
FROZEN_MODELS = ["engine.offload_reference=true", "engine.offload_reward_models=true"]


@pytest.mark.integration  # trainers' steps
def test_co_located_models_are_on_the_device_only_for_their_stage(
    reward_model_dir: Path, tmp_path: Path
) -> None:
    """Offloaded, the reference and the reward model hold 0 bytes between their stages and all of it in
    them: each phase's peak is lower than with them resident by exactly the models it does not use,
    and the trained weights are bit-identical."""
    from entrepot.grpo.trainer import Trainer

    base = [*LOCAL, f"reward.models={{{reward_model_dir}: 0.5}}", *TRAINING_STATE]
    results = {}
    for name, extra in (("resident", []), ("offloaded", FROZEN_MODELS)):
        trainer = Trainer(load_config(None, [*base, *extra]), tmp_path / name)
        try:
            metrics = [trainer.train_step(), trainer.train_step()][-1]
            worker = trainer.actors.workers[0]  # type: ignore[attr-defined]
            results[name] = (metrics, worker.frozen_device_bytes(), trainer.parameters())
            sizes = {
                "reference": sum(p.numel() * p.element_size() for p in worker.trainer.reference.parameters()),
                "reward_models": sum(p.numel() * p.element_size() for p in worker.model_rewards.params()),
            }
        finally:
            trainer.close()
    (resident, held, resident_params), (offloaded, freed, offloaded_params) = results.values()
    assert held == sizes  # resident: both stay on the device
    assert freed == {"reference": 0, "reward_models": 0}  # offloaded: nothing outside their stage
    others = {  # the frozen models a phase does not use: on the device only when resident
        "reward_model": sizes["reference"],
        "ref_log_prob": sizes["reward_models"],
        "rollout": sizes["reference"] + sizes["reward_models"],  # its resharding's peak (a record)
        "update": sizes["reference"] + sizes["reward_models"],
    }
    for phase, other in others.items():  # a phase's own model counts whole; the others not at all
        key = f"memory/{phase}_peak_bytes"
        assert resident[key] - offloaded[key] == other, phase
    assert all(torch.equal(resident_params[k], offloaded_params[k]) for k in resident_params)


@pytest.mark.integration  # workers on Ray
def test_separate_reference_and_reward_model_workers_on_ray(  # type: ignore[no-untyped-def]
    ray_session, reward_model_dir: Path, tmp_path: Path
) -> None:
    from entrepot.grpo.trainer import Trainer
    from entrepot.grpo.workers import ActorWorker, ReferenceWorker, wait_all

    config = load_config(None, [
        *SMALL, "resources.colocate=false", "resources.blocking=false",
        f"reward.models={{{reward_model_dir}: 0.5}}",
    ])  # fmt: skip
    trainer = Trainer(config, tmp_path / "run")
    try:
        first, second = trainer.train_step(), trainer.train_step()
        cluster = trainer.cluster
        assert cluster.references is not None and cluster.reward_models is not None
        reference = wait_all([cluster.references.call(ReferenceWorker.reference_digest)], 60)[0][0]
        actor_reference = wait_all([trainer.actors.call(ActorWorker.frozen_device_bytes)], 60)[0][0]
    finally:
        trainer.close()
    assert abs(first["kl"]) < 1e-6  # the separate reference starts from the policy's initial weights
    assert second["kl"] > 0
    assert "reward/model_mean" in first and "time/ref" in first
    assert actor_reference == {"reference": 0, "reward_models": 0}  # the actor holds neither
    assert reference  # the reference worker holds the whole model
