"""Advantages, KL estimators, the PPO-clip loss and aggregation against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from entrepot.grpo.algo.losses import (
    group_advantages,
    keep_varied_groups,
    kl_penalty,
    loss_normalizer,
    policy_loss,
    sequence_kl,
    token_weights,
)
from entrepot.grpo.algo.optim import lr_lambda


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


def _aggregate(per_token: torch.Tensor, lengths: torch.Tensor, mode: str) -> float:
    weights = token_weights(lengths, mode, loss_normalizer(lengths, mode))  # type: ignore[arg-type]
    return float((weights * per_token).sum())


def test_aggregation_modes_by_hand() -> None:
    per_token = torch.tensor([1.0, 2.0, 3.0, 4.0])  # row 0: [1, 2, 3], row 1: [4]
    lengths = torch.tensor([3, 1])
    assert _aggregate(per_token, lengths, "token-mean") == pytest.approx(10 / 4)
    assert _aggregate(per_token, lengths, "seq-mean-token-mean") == pytest.approx((2 + 4) / 2)
    assert _aggregate(per_token, lengths, "seq-mean-token-sum") == pytest.approx((6 + 4) / 2)
    with pytest.raises(ValueError, match="loss_agg"):
        loss_normalizer(lengths, "mean")  # type: ignore[arg-type]


def test_weights_split_over_parts_add_up_to_the_whole() -> None:
    """With a global normalizer the parts' weighted sums add up to the whole batch's loss."""
    per_token = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    lengths = torch.tensor([1, 1, 4])
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        whole = _aggregate(per_token, lengths, mode)
        norm = loss_normalizer(lengths, mode)  # type: ignore[arg-type]
        first = (token_weights(lengths[:2], mode, norm) * per_token[:2]).sum()  # type: ignore[arg-type]
        second = (token_weights(lengths[2:], mode, norm) * per_token[2:]).sum()  # type: ignore[arg-type]
        assert float(first + second) == pytest.approx(whole), mode
        local_means = (float(per_token[:2].mean()) + float(per_token[2:].mean())) / 2
        if mode == "token-mean":
            assert whole != pytest.approx(local_means)  # a mean of per-part means is not the mean


def test_sequence_kl_sums_each_response() -> None:
    logp = torch.log(torch.tensor([0.5, 0.5, 0.5]))
    ref = torch.log(torch.tensor([0.25, 0.25, 0.5]))
    kl = sequence_kl(logp, ref, torch.tensor([2, 1]), "k1")
    torch.testing.assert_close(kl, torch.tensor([2 * math.log(2), 0.0]))


def test_policy_loss_clips_low_and_high_separately() -> None:
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.7])).requires_grad_()
    weights = torch.full((4,), 0.25)  # token-mean over 4 tokens
    out = policy_loss(logp, old, torch.ones(4), weights, clip_low=0.2, clip_high=0.28)
    # A > 0: min(r, clip(r)) -> [1.28, 0.5, 1.1, 0.7]
    assert out.loss.item() == pytest.approx(-(1.28 + 0.5 + 1.1 + 0.7) / 4)
    assert out.metrics["clip_frac"] == pytest.approx(0.25)
    out_neg = policy_loss(logp, old, -torch.ones(4), weights, clip_low=0.2, clip_high=0.28)
    # A < 0: -min(-r, -clip(r)) = max(r, clip(r)) -> [1.5, 0.8, 1.1, 0.8]
    assert out_neg.loss.item() == pytest.approx((1.5 + 0.8 + 1.1 + 0.8) / 4)
    out.loss.backward()
    assert logp.grad is not None and logp.grad[0] == 0  # the clipped token gets no gradient


def test_policy_loss_kl_and_entropy_terms() -> None:
    logp = torch.full((6,), math.log(0.5))
    ref = torch.full((6,), math.log(0.25))
    entropy = torch.full((6,), 2.0)
    weights = torch.full((6,), 1 / 6)
    out = policy_loss(logp, logp, torch.zeros(6), weights, ref_logp=ref, kl_coef=0.1, kl_kind="k1",
                      entropy=entropy, entropy_coef=0.01)  # fmt: skip
    assert out.loss.item() == pytest.approx(0.1 * math.log(2) - 0.01 * 2.0)
    assert out.metrics["kl"] == pytest.approx(math.log(2))
    assert out.metrics["entropy"] == pytest.approx(2.0)
    assert out.metrics["ratio_mean"] == pytest.approx(1.0)


def test_lr_warmup_then_constant_or_cosine() -> None:
    assert [lr_lambda(s, warmup_steps=4, total_steps=10) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert lr_lambda(4, warmup_steps=4, total_steps=10, schedule="cosine") == pytest.approx(1.0)
    assert lr_lambda(10, warmup_steps=4, total_steps=10, schedule="cosine") == pytest.approx(0.0)
