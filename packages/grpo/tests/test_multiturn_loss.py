"""The loss of multi-turn rows: no term at the environment's tokens (whatever their old, reference and
behaviour log-probs), equal to `policy_loss` on the model's tokens alone with model-token counts, while
the environment's tokens still condition the model's later tokens in the forward pass."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from entrepot.grpo import load_config
from entrepot.grpo.algo.correction import correction_weights
from entrepot.grpo.algo.losses import loss_normalizer, policy_loss, token_weights
from entrepot.grpo.algo.optim import build_optimizer
from entrepot.grpo.algo.sequences import ResponseBatch, response_logprobs
from entrepot.grpo.algo.update import UpdateInputs, micro_batch_loss, mini_batch_counts, ppo_update
from entrepot.grpo.config import AlgorithmConfig, CorrectionConfig, GRPOConfig
from entrepot.grpo.config.correction import resolve
from entrepot.grpo.engines.models import build_model

VOCAB = 16
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
SURROGATES = ("ppo_clip", "gspo", "cispo")
T, F = True, False
# Four rows: model turns and environment messages interleaved (row 3 is a single model turn).
MASKS = [[T, T, T, F, F, T, T], [T, F, F, F, T], [T, T, F, F, T, T], [T, T, T, T]]
PROMPT_LENGTHS = [3, 2, 4, 3]
ADVANTAGES = torch.tensor([1.0, -0.5, 0.7, -1.2])
HORIZON = 8


def _config(*overrides: str) -> GRPOConfig:
    return load_config(None, ["model.max_positions=64", "algorithm.grad_clip=null", *overrides])


def _model(config: GRPOConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1)


def _batch(seed: int = 0) -> ResponseBatch:
    gen = torch.Generator().manual_seed(seed)
    p, r = torch.tensor(PROMPT_LENGTHS), torch.tensor([len(m) for m in MASKS])
    return ResponseBatch.from_packed(
        torch.randint(2, VOCAB, (int(p.sum()),), generator=gen), p,
        torch.randint(2, VOCAB, (int(r.sum()),), generator=gen), r,
    )  # fmt: skip


MODEL_MASK = torch.tensor([m for row in MASKS for m in row])  # [R]
MODEL_LENGTHS = torch.tensor([sum(row) for row in MASKS])  # [B] 5, 2, 4, 4


def _algo(loss: str, loss_agg: str) -> AlgorithmConfig:
    return AlgorithmConfig(
        loss=loss, loss_agg=loss_agg, kl_coef=0.1, kl_kind="low_var_kl", entropy_coef=0.01,  # type: ignore[arg-type]
        clip_low=0.2, clip_high=0.28,
    )  # fmt: skip


def _inputs(
    batch: ResponseBatch, current: torch.Tensor, correction: CorrectionConfig, seed: int = 1
) -> UpdateInputs:
    """Old, reference and behaviour log-probs near `current` [R] (so ratios, KL and the correction
    weights are not all 1), a model mask, one mini-batch of every row."""
    gen = torch.Generator().manual_seed(seed)
    old = current + 0.3 * torch.randn(current.shape, generator=gen)
    ref = current + 0.3 * torch.randn(current.shape, generator=gen)
    behaviour = old + 0.5 * torch.randn(current.shape, generator=gen)
    return UpdateInputs(
        batch, ADVANTAGES, old, ref, [torch.arange(batch.num_rows)], horizon=HORIZON,
        behaviour_logp=behaviour, correction=correction, model_mask=MODEL_MASK,
    )  # fmt: skip


def _scrambled(inputs: UpdateInputs, seed: int = 7) -> UpdateInputs:
    """`inputs` with random old, reference and behaviour log-probs at the environment's tokens."""
    gen = torch.Generator().manual_seed(seed)
    env = ~MODEL_MASK

    def scramble(values: torch.Tensor) -> torch.Tensor:
        return torch.where(env, -10 * torch.rand(values.shape, generator=gen), values)

    return dataclasses.replace(
        inputs, old_logp=scramble(inputs.old_logp), ref_logp=scramble(inputs.ref_logp),  # type: ignore[arg-type]
        behaviour_logp=scramble(inputs.behaviour_logp),  # type: ignore[arg-type]
    )  # fmt: skip


CORRECTIONS = {
    "tis-token": resolve(CorrectionConfig(), asynchronous=True),  # the automatic async choice
    "mis-sequence": CorrectionConfig(kind="mis", level="sequence", low=0.2, high=5.0),
}


@pytest.mark.parametrize("correction", sorted(CORRECTIONS))
@pytest.mark.parametrize("loss", SURROGATES)
@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
def test_the_loss_has_no_term_at_environment_tokens(loss_agg: str, loss: str, correction: str) -> None:
    config = _config()
    model = _model(config)
    algo = _algo(loss, loss_agg)
    batch = _batch()
    rows = torch.arange(batch.num_rows)
    params = [p for p in model.parameters() if p.requires_grad]
    logp, entropy = response_logprobs(model, batch, packed=True, with_entropy=True, entropy_grad=True)
    inputs = _inputs(batch, logp.detach(), CORRECTIONS[correction])
    assert inputs.corrected
    gen = torch.Generator().manual_seed(3)
    env = (~MODEL_MASK).float()
    results = []
    for variant, values_at_env in ((inputs, 0.0), (_scrambled(inputs), 1.0)):
        # The scrambled variant also moves the current log-probs and entropies at the environment's
        # tokens (their gradient is left as it is): no term may read them either.
        shift = values_at_env * env * torch.randn(env.shape, generator=gen)
        normalizer, num_tokens = mini_batch_counts(variant, rows, algo, None)
        current, current_entropy = logp + shift, entropy + shift  # type: ignore[operator]
        out = micro_batch_loss(variant, rows, batch, current, current_entropy, algo, normalizer, num_tokens)
        grads = torch.autograd.grad(out.loss, params, retain_graph=True)
        results.append((out, grads))
    (first, first_grads), (second, second_grads) = results
    assert float(first.loss.detach()) != 0.0 and first.metrics["kl"] > 0  # every term is live
    assert any(g.abs().sum() > 0 for g in first_grads)
    torch.testing.assert_close(second.loss, first.loss, atol=1e-7, rtol=0)
    assert second.metrics == pytest.approx(first.metrics, abs=1e-7)
    for a, b in zip(first_grads, second_grads, strict=True):
        torch.testing.assert_close(b, a, atol=1e-7, rtol=0)


@pytest.mark.parametrize("loss", SURROGATES)
@pytest.mark.parametrize("loss_agg", AGGREGATIONS)
def test_the_loss_is_policy_loss_on_the_model_tokens_alone(loss_agg: str, loss: str) -> None:
    config = _config()
    model = _model(config)
    algo = _algo(loss, loss_agg)
    batch = _batch()
    rows = torch.arange(batch.num_rows)
    logp, entropy = response_logprobs(model, batch, packed=True, with_entropy=True, entropy_grad=True)
    correction = CORRECTIONS["mis-sequence"]
    inputs = _inputs(batch, logp.detach(), correction)
    assert entropy is not None and inputs.old_logp is not None and inputs.ref_logp is not None
    assert inputs.behaviour_logp is not None

    normalizer, num_tokens = mini_batch_counts(inputs, rows, algo, None)
    assert inputs.model_lengths(rows).tolist() == MODEL_LENGTHS.tolist() == [5, 2, 4, 4]
    assert num_tokens == 15.0  # of 22 response tokens
    assert normalizer == loss_normalizer(MODEL_LENGTHS, loss_agg, HORIZON)  # type: ignore[arg-type]
    if loss_agg == "token-mean":
        assert normalizer == 15.0
    got = micro_batch_loss(inputs, rows, batch, logp, entropy, algo, normalizer, num_tokens)

    m = MODEL_MASK
    old = inputs.old_logp[m]
    weights = token_weights(MODEL_LENGTHS, loss_agg, normalizer)  # type: ignore[arg-type]
    assert weights.numel() == 15
    expected = policy_loss(
        logp[m], old, ADVANTAGES.repeat_interleave(MODEL_LENGTHS), weights,
        response_lengths=MODEL_LENGTHS, loss=loss, num_tokens=15.0,  # type: ignore[arg-type]
        clip_low=0.2, clip_high=0.28, ref_logp=inputs.ref_logp[m], kl_coef=0.1, kl_kind="low_var_kl",
        entropy=entropy[m], entropy_coef=0.01,
        correction=correction_weights(old, inputs.behaviour_logp[m], MODEL_LENGTHS, correction).weights,
    )  # fmt: skip
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-7, rtol=0)
    assert {k: v for k, v in got.metrics.items() if not k.startswith("offpolicy/")} == pytest.approx(
        expected.metrics, abs=1e-7
    )


def test_ppo_update_ignores_the_environment_tokens_values() -> None:
    """One optimiser step over two micro-batches: the same gradients and weights whatever the old,
    reference and behaviour log-probs at the environment's tokens."""
    config = _config(
        "batching.dynamic_batch_size=false", "batching.micro_batch_size=2",
        "algorithm.kl_coef=0.1", "algorithm.entropy_coef=0.01",
    )  # fmt: skip
    batch = _batch()
    with torch.no_grad():
        current, _ = response_logprobs(_model(config), batch, packed=True)
    inputs = _inputs(batch, current, CORRECTIONS["tis-token"])
    inputs.mini_batches = [torch.tensor([2, 0, 3, 1])]  # out of order: the mask must follow the rows
    outcomes = []
    for variant in (inputs, _scrambled(inputs)):
        model = _model(config)
        optimizer, scheduler = build_optimizer(model, config.algorithm, total_steps=1)
        metrics = ppo_update(model, optimizer, scheduler, variant, config.algorithm, config.batching)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        outcomes.append((metrics, grads, {n: p.detach().clone() for n, p in model.named_parameters()}))
    (metrics_a, grads_a, weights_a), (metrics_b, grads_b, weights_b) = outcomes
    assert metrics_a["micro_batches"] == 2.0 and metrics_a["grad_norm"] > 0
    assert metrics_b == pytest.approx(metrics_a, abs=1e-7)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, atol=1e-7, rtol=0, msg=name)
        torch.testing.assert_close(weights_b[name], weights_a[name], atol=1e-7, rtol=0, msg=name)


@pytest.mark.parametrize("packed", [True, False])
def test_environment_tokens_condition_the_later_model_tokens(packed: bool) -> None:
    model = _model(_config())
    batch = _batch()
    # Row 0's response: model [0, 3), environment [3, 5), model [5, 7); swap the environment's tokens.
    start = int(batch.prompt_lengths[0])
    tokens = batch.tokens.clone()
    tokens[start + 3 : start + 5] = (tokens[start + 3 : start + 5] - 2 + 5) % (VOCAB - 2) + 2
    assert not torch.equal(tokens, batch.tokens)
    changed = dataclasses.replace(batch, tokens=tokens)
    with torch.no_grad():
        before, _ = response_logprobs(model, batch, packed=packed)
        after, _ = response_logprobs(model, changed, packed=packed)
    assert torch.equal(before[:3], after[:3])  # causal: the turn before the message is untouched
    assert (before[5:7] - after[5:7]).abs().min() > 1e-4  # the model's next turn reads the message
    assert torch.equal(before[7:], after[7:])  # other rows are their own sequences
