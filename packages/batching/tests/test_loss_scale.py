"""Micro-batched gradients with loss_scale_factors equal the one-big-batch gradient."""

from __future__ import annotations

import pytest
import torch

from entrepot.batching import InvalidArgumentError, loss_scale_factors, plan_micro_batches


def _data() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 30, (23,), generator=gen).tolist()
    features = [torch.randn(n, 5, generator=gen, dtype=torch.float64) for n in lengths]
    targets = [torch.randn(n, generator=gen, dtype=torch.float64) for n in lengths]
    return features, targets


def _token_losses(weight: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x @ weight - y) ** 2  # [n_i]


def _local_loss(
    weight: torch.Tensor, xs: list[torch.Tensor], ys: list[torch.Tensor], mode: str
) -> torch.Tensor:
    losses = [_token_losses(weight, x, y) for x, y in zip(xs, ys, strict=True)]
    if mode == "sample_mean":
        return torch.stack([loss.mean() for loss in losses]).mean()
    return torch.cat(losses).mean()


@pytest.mark.parametrize("mode", ["sample_mean", "token_mean"])
def test_micro_batch_gradients_equal_big_batch(mode: str) -> None:
    features, targets = _data()
    lengths = [x.shape[0] for x in features]
    weight = torch.randn(5, dtype=torch.float64, requires_grad=True)
    _local_loss(weight, features, targets, mode).backward()
    assert weight.grad is not None
    expected = weight.grad.clone()
    weight.grad = None

    plan = plan_micro_batches(lengths, max_token_len=60)
    assert plan.num_micro_batches > 3
    scales = loss_scale_factors(plan.micro_batches, mode=mode, num_loss_tokens=lengths)  # type: ignore[arg-type]
    for part, scale in zip(plan.micro_batches, scales, strict=True):
        loss = _local_loss(weight, [features[i] for i in part], [targets[i] for i in part], mode)
        (loss * scale).backward()
    torch.testing.assert_close(weight.grad, expected, atol=1e-12, rtol=1e-10)
    weight.grad = None  # without the scales, accumulation sums k local means: a different gradient
    for part in plan.micro_batches:
        _local_loss(weight, [features[i] for i in part], [targets[i] for i in part], mode).backward()
    assert not torch.allclose(weight.grad, expected)


def test_scale_values_and_errors() -> None:
    assert loss_scale_factors([[0, 1], [2]], mode="sample_mean") == pytest.approx([2 / 3, 1 / 3])
    assert loss_scale_factors([[0, 1], [2]], "token_mean", [1, 1, 2]) == pytest.approx([0.5, 0.5])
    assert loss_scale_factors([[0], []], "sample_mean", denominator=4) == [0.25, 0.0]
    with pytest.raises(InvalidArgumentError, match="needs num_loss_tokens"):
        loss_scale_factors([[0]], "token_mean")
    with pytest.raises(InvalidArgumentError, match="mode must be"):
        loss_scale_factors([[0]], "mean")  # type: ignore[arg-type]
