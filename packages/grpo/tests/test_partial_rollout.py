"""Partial rollout: rounds of `rollout.partial_max_tokens`, policy versions, behaviour log-probs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from entrepot.grpo import GRPOConfigError, load_config, train
from entrepot.grpo.data.checks import check_task_fits
from entrepot.grpo.data.lengths import partial_max_age
from entrepot.grpo.engines.base import SamplingParams
from entrepot.grpo.engines.rollout_embedded import GPT2RolloutEngine
from entrepot.grpo.run.metrics import read_metrics
from entrepot.grpo.workers._partial_rollout import partial_round

SMALL = ["eval.num_prompts=16", "logging.tensorboard=false", "checkpoint.keep_last=0", "eval.every=0",
         "resources.use_ray=false", "rollout.prompts_per_step=8", "checkpoint.save_every=0"]  # fmt: skip
PARTIAL = [*SMALL, "rollout.partial_max_tokens=3"]  # reverse 8 digits: up to 3 steps per response


def _engine() -> GPT2RolloutEngine:
    engine = GPT2RolloutEngine(num_layers=2, num_heads=2, hidden=16, vocab=11, positions=40)
    generator = torch.Generator().manual_seed(0)
    engine.load_weights(
        {name: torch.randn(shape, generator=generator) * 0.5 for name, (shape, _) in engine.meta.items()}
    )
    return engine


def test_rounds_continue_exactly_where_a_whole_response_would() -> None:
    """Greedy rounds of 5 tokens give the tokens (and log-probs) of one uninterrupted 12-token response."""
    engine, greedy = _engine(), SamplingParams(temperature=0.0, max_new_tokens=12)
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]
    rollout = engine.generate(prompts, greedy)
    whole, whole_logp = [r.tolist() for r in rollout.responses()], rollout.response_logprobs()
    empty = (torch.zeros(0, dtype=torch.long), torch.zeros(0), torch.zeros(0, dtype=torch.int32))
    previous, ages = [empty, empty], torch.zeros(2, dtype=torch.int32)
    for version, expect_done in ((7, False), (8, False), (9, True)):
        out = partial_round(engine, prompts, ages, previous, greedy, partial_max_tokens=5, max_age=10,
                            version=version, pad_token_id=0, generator=torch.Generator())  # fmt: skip
        assert out.completed.tolist() == [expect_done] * 2
        lengths = out.columns["response_length"]
        parts = [torch.split(out.columns[c][0], lengths.tolist()) for c in ("responses", "rollout_log_prob",
                                                                              "policy_version")]  # fmt: skip
        previous = list(zip(*parts, strict=True))
        ages = ages + 1
    for row in range(2):
        assert previous[row][0].tolist() == whole[row]
        torch.testing.assert_close(previous[row][1], whole_logp[row], atol=1e-5, rtol=0)
        assert previous[row][2].tolist() == [7] * 5 + [8] * 5 + [9] * 2  # the version of every token


def test_a_response_at_max_age_is_forced_to_finish() -> None:
    engine, sampling = _engine(), SamplingParams(temperature=0.0, max_new_tokens=12)
    empty = (torch.zeros(0, dtype=torch.long), torch.zeros(0), torch.zeros(0, dtype=torch.int32))
    out = partial_round(engine, [torch.tensor([1, 2])], torch.tensor([1]), [empty], sampling,
                        partial_max_tokens=4, max_age=2, version=0, pad_token_id=0,
                        generator=torch.Generator())  # fmt: skip
    assert out.completed.tolist() == [True] and out.columns["response_length"].tolist() == [12]
    assert out.forced == 1 and out.new_tokens == 12


@pytest.mark.integration  # training runs
@pytest.mark.parametrize("engine", ["torch", "megatron"])
def test_every_prompt_trains_once_with_versions_and_behaviour_ratios(engine: str, tmp_path: Path) -> None:
    """Groups carry over between steps, finish, and train once; stale tokens move the PPO ratio."""
    config = load_config(None, [*PARTIAL, "max_steps=6", "algorithm.lr=3e-3", f"engine.train={engine}"])
    train(config, tmp_path / "run")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    finished = sum(r["partial/groups_finished"] for r in rows)
    assert finished + rows[-1]["partial/groups_in_flight"] == 6 * 8  # each prompt: trained or in flight
    assert sum(r.get("partial/tokens_age_2", 0.0) for r in rows) > 0  # responses spanning three steps
    max_age = partial_max_age(config.data, config.rollout)
    assert all(f"partial/tokens_age_{max_age}" not in r for r in rows)  # max_age bounds ages
    assert any(r["partial/rows_continued"] > 0 for r in rows)
    # steps 1-2 finish no group (a response takes up to 3 steps), so the policy first moves in step 3
    stale_steps = [r for r in rows[3:] if r.get("partial/tokens_age_1", 0.0) > 0]
    # the ratio divides by each token's behaviour log-prob: an older policy's, so it moves off 1
    # (with the current policy as "old", one epoch of one mini-batch has a ratio of exactly 1)
    assert stale_steps and all(r["ratio_max"] > 1 + 1e-3 for r in stale_steps)


@pytest.mark.integration  # training runs
def test_max_age_forces_completions_and_staleness_drops_old_groups(tmp_path: Path) -> None:
    forced = load_config(None, [*SMALL, "max_steps=4", "rollout.partial_max_tokens=2", "rollout.max_age=2"])
    train(forced, tmp_path / "forced")
    rows = read_metrics(tmp_path / "forced" / "metrics.jsonl")
    assert sum(r["partial/forced_completions"] for r in rows) > 0
    assert all("partial/tokens_age_2" not in r for r in rows)
    strict = load_config(
        None, [*PARTIAL, "max_steps=6", "trainer.max_staleness=1", "rollout.n_samples_per_prompt=2"]
    )
    train(strict, tmp_path / "strict")
    rows = read_metrics(tmp_path / "strict" / "metrics.jsonl")
    assert sum(r["partial/groups_dropped_stale"] for r in rows) > 0  # groups needing a third step
    assert sum(r["partial/groups_finished"] for r in rows) > 0  # groups done within two
    ages = {k for r in rows for k in r if k.startswith("partial/tokens_age_")}
    assert ages == {"partial/tokens_age_0", "partial/tokens_age_1"}


@pytest.mark.integration  # training runs
def test_resume_with_responses_in_flight_is_bit_identical(tmp_path: Path) -> None:
    """The checkpoint's dock holds the unfinished responses, their log-probs and versions."""
    config = load_config(None, [*PARTIAL, "max_steps=4", "checkpoint.save_every=2"])
    full = tmp_path / "full"
    train(config, full)
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000004")
    train(config, resumed, resume=True)
    a = load_file(str(full / "checkpoints" / "step_000004" / "model.safetensors"))
    b = load_file(str(resumed / "checkpoints" / "step_000004" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert read_metrics(full / "metrics.jsonl")[2]["partial/rows_continued"] > 0  # step 3 continued some


@pytest.mark.integration  # training runs on Ray
def test_overlapping_stages_through_ray_train_the_same_groups(ray_session, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """With resources.blocking=false the reward stage runs beside the rollout and must wait for rows
    still being continued (the rollout holds them under a lease), not end early."""
    overrides = [*PARTIAL, "max_steps=3", "resources.use_ray=true", "engine.deterministic=true"]
    runs = {}
    for blocking in ("true", "false"):
        train(load_config(None, [*overrides, f"resources.blocking={blocking}"]), tmp_path / blocking)
        runs[blocking] = read_metrics(tmp_path / blocking / "metrics.jsonl")
    for key in ("partial/groups_finished", "reward_mean", "partial/tokens_age_1"):
        assert [r.get(key) for r in runs["true"]] == [r.get(key) for r in runs["false"]], key


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["rollout.partial_max_tokens=8"], "rollout.partial_max_tokens"),  # >= the 8-token budget
        (["rollout.partial_max_tokens=3", "algorithm.dynamic_sampling=true"], "algorithm.dynamic_sampling"),
        (
            [
                "rollout.partial_max_tokens=3",
                "engine.rollout=vllm",
                "engine.train=megatron",
                "model.num_heads=2",
                "parallel.train.tensor=2",
                "parallel.infer.tensor=2",
                "resources.use_ray=true",
            ],
            "parallel.infer.tensor (2) must be 1 with rollout.partial_max_tokens",
        ),
        (["trainer.max_staleness=1"], "trainer.max_staleness"),  # sync: only partial rollout is stale
        (["rollout.max_age=2"], "rollout.max_age"),
    ],
)
def test_config_refuses_what_partial_rollout_does_not_run(overrides: list[str], key: str) -> None:
    with pytest.raises(GRPOConfigError, match=re.escape(key)):  # the budget's check is the data wing's
        check_task_fits(load_config(None, overrides))


def test_the_docs_partial_rollout_command_loads() -> None:
    """training-modes.md's partial rollout command (its staleness bound on trainer.max_staleness) loads."""
    page = (Path(__file__).parents[1] / "docs" / "training-modes.md").read_text()
    (command,) = [line for line in page.splitlines() if line.startswith("rl grpo train rollout.partial")]
    config = load_config(None, command.split()[3:])
    assert config.rollout.partial_max_tokens == 3 and config.trainer.max_staleness == 2
