"""Advantages, KL estimators, the PPO-clip loss and aggregation against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from entrepot.grpo.algorithm import (
    aggregate_loss,
    group_advantages,
    keep_varied_groups,
    kl_penalty,
    lr_lambda,
    policy_loss,
)


def test_group_advantages_by_hand() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(rewards, 4)
    std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-6)
    torch.testing.assert_close(adv[:4], expected)
    assert torch.equal(adv[4:], torch.zeros(4))  # a uniform group carries no signal
    torch.testing.assert_close(
        group_advantages(rewards, 4, normalize_std=False)[:4], torch.tensor([0.5, -0.5, -0.5, 0.5])
    )


def test_group_advantages_rejects_ragged_batch() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        group_advantages(torch.zeros(6), 4)


def test_keep_varied_groups() -> None:
    mask = keep_varied_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 3.0, 3.0]), 2)
    assert mask.tolist() == [False, False, True, True, False, False]


def test_kl_kinds_by_hand() -> None:
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    d = math.log(2.0)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(d)
    assert kl_penalty(ref, logp, "abs").item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "mse").item() == pytest.approx(0.5 * d * d)
    k3 = math.exp(-d) - (-d) - 1  # exp(ref - logp) - (ref - logp) - 1
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(k3)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(k3)
    assert kl_penalty(torch.tensor([[30.0]]), torch.tensor([[0.0]]), "clamped").item() == 10.0


def test_aggregation_modes_by_hand() -> None:
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate_loss(per_token, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate_loss(per_token, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate_loss(per_token, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)


def test_policy_loss_clips_low_and_high_separately() -> None:
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.7]])).requires_grad_()
    mask = torch.ones(1, 4)
    out = policy_loss(logp, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.28)
    # A > 0: min(r, clip(r)) -> [1.28, 0.5, 1.1, 0.7]
    assert out.loss.item() == pytest.approx(-(1.28 + 0.5 + 1.1 + 0.7) / 4)
    assert out.metrics["clip_frac"] == pytest.approx(0.25)
    out_neg = policy_loss(logp, old, torch.tensor([-1.0]), mask, clip_low=0.2, clip_high=0.28)
    # A < 0: -min(-r, -clip(r)) = max(r, clip(r)) -> [1.5, 0.8, 1.1, 0.8]
    assert out_neg.loss.item() == pytest.approx((1.5 + 0.8 + 1.1 + 0.8) / 4)
    out.loss.backward()
    assert logp.grad is not None and logp.grad[0, 0] == 0  # the clipped token gets no gradient


def test_policy_loss_kl_and_entropy_terms() -> None:
    logp = torch.full((2, 3), math.log(0.5))
    ref = torch.full((2, 3), math.log(0.25))
    entropy = torch.full((2, 3), 2.0)
    mask = torch.ones(2, 3)
    out = policy_loss(logp, logp, torch.zeros(2), mask, ref_logp=ref, kl_coef=0.1, kl_kind="k1",
                      entropy=entropy, entropy_coef=0.01)  # fmt: skip
    assert out.loss.item() == pytest.approx(0.1 * math.log(2) - 0.01 * 2.0)
    assert out.metrics["kl"] == pytest.approx(math.log(2))
    assert out.metrics["entropy"] == pytest.approx(2.0)
    assert out.metrics["ratio_mean"] == pytest.approx(1.0)


def test_lr_warmup_then_constant_or_cosine() -> None:
    assert [lr_lambda(s, warmup_steps=4, total_steps=10) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert lr_lambda(4, warmup_steps=4, total_steps=10, schedule="cosine") == pytest.approx(1.0)
    assert lr_lambda(10, warmup_steps=4, total_steps=10, schedule="cosine") == pytest.approx(0.0)
