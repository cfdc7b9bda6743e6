"""Advantage estimators (`algorithm.advantage`) against NumPy references written here, and their refusals."""

from __future__ import annotations

import math
import re
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from entrepot.grpo.algo.advantages import ESTIMATORS, choose_estimator, whiten
from entrepot.grpo.algo.losses import group_advantages as reexported
from entrepot.grpo.algo.losses import row_sums
from entrepot.grpo.config import AlgorithmConfig, load_config
from entrepot.grpo.config.algorithm import AdvantageKind
from entrepot.grpo.errors import GRPOConfigError

EPS = 1e-6
REWARDS = np.array([1.0, 0.0, 0.5, 1.0, 0.2, 0.9, 0.9, 0.4, 2.0, 2.0, 2.0, 2.0])  # 3 groups of 4
LENGTHS = np.array([3, 5, 2, 4, 1, 6, 3, 2, 4, 4, 1, 7])


def _np_grpo(r: np.ndarray, g: int, std: bool = True) -> np.ndarray:
    out = np.empty_like(r)
    for start in range(0, len(r), g):
        group = r[start : start + g]
        centred = group - group.mean()
        out[start : start + g] = centred / (group.std(ddof=1) + EPS) if std else centred
    return out


def _np_rloo(r: np.ndarray, g: int) -> np.ndarray:
    out = np.empty_like(r)
    for i in range(len(r)):
        start = i - i % g
        others = [r[j] for j in range(start, start + g) if j != i]
        out[i] = r[i] - np.mean(others)
    return out


def _np_whiten_tokens(values: np.ndarray, token_values: np.ndarray) -> np.ndarray:
    """Whitening with the statistics of `token_values`: each trained token's copy of its row's value."""
    return (values - token_values.mean()) / (token_values.std() + EPS)


def _estimate(name: str, rewards: np.ndarray, g: int, counts: torch.Tensor) -> np.ndarray:
    out = choose_estimator(name)(torch.tensor(rewards, dtype=torch.float32), g, counts)
    assert out.shape == (len(rewards),) and out.dtype == torch.float32
    return out.numpy()


def test_every_config_estimator_is_registered() -> None:
    assert set(typing.get_args(AdvantageKind)) <= set(ESTIMATORS)
    assert reexported(torch.tensor([1.0, 0.0]), 2).tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)


def test_grpo_is_the_group_normalised_reward_and_dr_grpo_the_centred_one() -> None:
    counts = torch.tensor(LENGTHS)
    np.testing.assert_allclose(_estimate("grpo", REWARDS, 4, counts), _np_grpo(REWARDS, 4), rtol=1e-5)
    dr = choose_estimator("grpo", normalize_std=False)(torch.tensor(REWARDS), 4, counts).numpy()
    np.testing.assert_allclose(dr, _np_grpo(REWARDS, 4, std=False), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("g", [2, 4])
def test_rloo_subtracts_the_mean_of_the_others(g: int) -> None:
    got = _estimate("rloo", REWARDS, g, torch.tensor(LENGTHS))
    np.testing.assert_allclose(got, _np_rloo(REWARDS, g), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got, g / (g - 1) * _np_grpo(REWARDS, g, std=False), rtol=1e-5, atol=1e-6)
    if g == 2:  # a pair: each response against the other
        np.testing.assert_allclose(got[:2], [1.0, -1.0])


def test_reinforce_pp_whitens_over_every_response_token() -> None:
    token_rewards = np.repeat(REWARDS, LENGTHS)  # single-turn: each row's reward on each of its tokens
    got = _estimate("reinforce_pp", REWARDS, 4, torch.tensor(LENGTHS))
    np.testing.assert_allclose(got, _np_whiten_tokens(REWARDS, token_rewards), rtol=1e-5)
    # token-weighted, not a mean over responses
    assert not np.allclose(got, (REWARDS - REWARDS.mean()) / (REWARDS.std() + EPS))


def test_reinforce_pp_baseline_centres_per_group_then_whitens() -> None:
    centred = _np_grpo(REWARDS, 4, std=False)
    got = _estimate("reinforce_pp_baseline", REWARDS, 4, torch.tensor(LENGTHS))
    np.testing.assert_allclose(
        got, _np_whiten_tokens(centred, np.repeat(centred, LENGTHS)), rtol=1e-5, atol=1e-6
    )


def test_multiturn_whitening_counts_only_model_tokens() -> None:
    """Packed per-token model masks (0 at the environment's tokens), counted as the step counts them."""
    generator = np.random.default_rng(0)
    lengths = np.array([6, 4, 5, 3, 7, 2, 4, 5])
    mask = (generator.random(lengths.sum()) < 0.6).astype(np.int64)  # [R], packed row after row
    mask[:6] = [1, 1, 0, 0, 0, 1]  # row 0: an observation in the middle
    mask[15:18] = 0  # row 3 is all environment: it weighs nothing
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 0.3, 0.3, 0.8, 0.1])
    counts = row_sums(torch.tensor(mask), torch.tensor(lengths))
    assert counts[3] == 0 and counts.tolist() == [
        int(m.sum()) for m in np.split(mask, np.cumsum(lengths)[:-1])
    ]

    row_of_token = np.repeat(np.arange(len(lengths)), lengths)
    model_rows = row_of_token[mask == 1]  # the row of each model token
    plain = _estimate("reinforce_pp", rewards, 2, counts)
    np.testing.assert_allclose(plain, _np_whiten_tokens(rewards, rewards[model_rows]), rtol=1e-5)
    centred = _np_grpo(rewards, 2, std=False)
    baseline = _estimate("reinforce_pp_baseline", rewards, 2, counts)
    np.testing.assert_allclose(
        baseline, _np_whiten_tokens(centred, centred[model_rows]), rtol=1e-5, atol=1e-6
    )
    # all tokens counted would give other statistics
    assert not np.allclose(plain, _np_whiten_tokens(rewards, rewards[row_of_token]))


def test_equal_rewards() -> None:
    counts = torch.tensor(LENGTHS)
    flat = np.full(12, 0.7)
    for name in ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"):
        np.testing.assert_allclose(_estimate(name, flat, 4, counts), np.zeros(12), atol=1e-5)
    # the equal group (the last) gets nothing from a group baseline, but REINFORCE++ still rewards it
    for name in ("grpo", "rloo"):
        assert np.all(_estimate(name, REWARDS, 4, counts)[8:] == 0)
    assert np.all(_estimate("reinforce_pp", REWARDS, 4, counts)[8:] > 1)


def test_whiten_with_no_trained_token_is_zero_and_shapes_are_checked() -> None:
    assert whiten(torch.tensor([1.0, 3.0]), torch.tensor([0, 0])).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="token_counts"):
        whiten(torch.ones(3), torch.ones(2))
    with pytest.raises(ValueError, match="multiple of 4"):
        choose_estimator("rloo")(torch.zeros(6), 4, torch.ones(6))


def test_config_key_and_refusals() -> None:
    assert load_config(None, []).algorithm.advantage == "grpo"
    assert load_config(None, ["algorithm.advantage=reinforce_pp"]).algorithm.advantage == "reinforce_pp"
    with pytest.raises(GRPOConfigError, match=r"rollout\.n_samples_per_prompt \(1\) must be >= 2 .*rloo"):
        load_config(None, ["algorithm.advantage=rloo", "rollout.n_samples_per_prompt=1"])
    with pytest.raises(
        GRPOConfigError, match=r"algorithm\.advantage \('gae'\) must be one of 'grpo', 'rloo'"
    ):
        load_config(None, ["algorithm.advantage=gae"])
    with pytest.raises(
        GRPOConfigError, match=r"algorithm\.advantage \('gae'\).*needs a value model \(PPO critic\)"
    ):
        AlgorithmConfig(advantage="gae")  # type: ignore[arg-type]
    with pytest.raises(GRPOConfigError, match=r"algorithm\.normalize_std \(False\) must be true unless"):
        load_config(None, ["algorithm.advantage=rloo", "algorithm.normalize_std=false"])
    with pytest.raises(ValueError, match="known: grpo, dr_grpo, rloo"):
        choose_estimator("gae")


def test_the_docs_yaml_block_is_a_valid_config() -> None:
    import yaml

    from entrepot.grpo.config import config_from_dict

    text = (Path(__file__).parents[1] / "docs" / "advantages.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)^```", text, re.M | re.S)
    assert blocks
    for block in blocks:
        assert config_from_dict(yaml.safe_load(block)).algorithm.advantage == "reinforce_pp_baseline"


TWO_STEPS = [
    "max_steps=2", "resources.use_ray=false", "logging.tensorboard=false", "eval.every=0",
    "eval.num_prompts=8", "rollout.prompts_per_step=4", "logging.samples_every=0", "checkpoint.save_every=0",
]  # fmt: skip


def _two_steps(run_dir: Path, *overrides: str) -> list[dict[str, Any]]:
    from entrepot.grpo.trainer import Trainer

    trainer = Trainer(load_config(None, [*TWO_STEPS, *overrides]), run_dir)
    try:
        return trainer.fit()
    finally:
        trainer.close()


@pytest.mark.integration
def test_estimators_train_end_to_end(tmp_path: Path) -> None:
    """rloo and reinforce_pp run 2 steps on the embedded default, reinforce_pp_baseline multi-turn.

    At the first step the update starts at the rollout's policy (ratio 1), so the token-mean PPO loss
    is minus the token mean of the advantages: 0 for REINFORCE++ (whitened over exactly the tokens the
    loss counts, the model's tokens in multi-turn), not 0 for RLOO (a mean over responses)."""
    from tests_support_envs import CALCULATOR

    rloo = _two_steps(tmp_path / "rloo", "algorithm.advantage=rloo")
    plain = _two_steps(tmp_path / "plain", "algorithm.advantage=reinforce_pp")
    multiturn = _two_steps(tmp_path / "multiturn", "algorithm.advantage=reinforce_pp_baseline", *CALCULATOR)
    for rows in (rloo, plain, multiturn):
        assert [r["step"] for r in rows] == [1, 2]
        assert all(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in rows)
    assert rloo[1]["kl"] > 0 and plain[1]["kl"] > 0  # the first update moved the policy off the reference
    assert abs(rloo[0]["pg_loss"]) > 1e-4
    assert plain[0]["pg_loss"] == pytest.approx(0.0, abs=1e-5)
    assert multiturn[0]["multiturn/env_token_frac"] > 0
    assert multiturn[0]["pg_loss"] == pytest.approx(0.0, abs=1e-5)
