"""The inverse-CDF token sampler (the Llama engine's): the distribution it draws, top-p over candidates."""

from __future__ import annotations

import torch

from entrepot.grpo.engines.base import SamplingParams
from entrepot.grpo.engines.token_sampling import CANDIDATES, InverseCdfSampler

ROWS = 20_000
VOCAB = 512  # > CANDIDATES, so a flat row's nucleus reaches past the candidates


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The full-sort reference: the renormalised nucleus probabilities [V] of one row of logits."""
    probs = logits.softmax(-1)
    sorted_probs, order = probs.sort(descending=True)
    keep = sorted_probs.cumsum(-1) - sorted_probs <= top_p
    kept = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return kept / kept.sum()


def _frequencies(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=VOCAB).double() / tokens.numel()


def _within_four_standard_errors(observed: torch.Tensor, expected: torch.Tensor) -> bool:
    """Every token's frequency within 4.5 standard errors of its probability (the normal approximation:
    the tests' logits keep each kept token's expected count in the tens or more)."""
    se = (expected * (1 - expected) / ROWS).sqrt()
    return bool(torch.all((observed - expected).abs() <= 4.5 * se + 1e-9))


def _draw(logits: torch.Tensor, params: SamplingParams, seed: int) -> torch.Tensor:
    sampler = InverseCdfSampler()
    uniforms = sampler.draw(ROWS, 1, VOCAB, params, torch.Generator().manual_seed(seed))
    assert uniforms is not None and uniforms.shape == (1, ROWS)
    return sampler.sample(logits.expand(ROWS, -1), params, uniforms[0])


def test_it_draws_the_tempered_softmax() -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)) * 0.5
    tokens = _draw(logits, SamplingParams(temperature=0.7), seed=1)
    assert _within_four_standard_errors(_frequencies(tokens), (logits / 0.7).softmax(-1).double())


def test_top_p_is_the_full_sorts_nucleus_inside_and_past_the_candidates() -> None:
    peaked = torch.randn(VOCAB, generator=torch.Generator().manual_seed(2)) * 4  # nucleus: a few tokens
    flat = torch.randn(VOCAB, generator=torch.Generator().manual_seed(3)) * 0.1  # nucleus: most of V
    params = SamplingParams(temperature=1.0, top_p=0.9)
    for logits, inside in ((peaked, True), (flat, False)):
        expected = _nucleus(logits, 0.9)
        assert (int((expected > 0).sum()) <= CANDIDATES) is inside
        observed = _frequencies(_draw(logits, params, seed=4))
        assert not bool((observed[expected == 0] > 0).any())  # nothing outside the nucleus, ever
        assert _within_four_standard_errors(observed, expected.double())


def test_a_batch_mixing_both_kinds_of_rows_gives_each_row_its_nucleus() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.cat([torch.randn(8, VOCAB, generator=gen) * 4, torch.randn(8, VOCAB, generator=gen) * 0.1])
    sampler = InverseCdfSampler()
    params = SamplingParams(temperature=1.0, top_p=0.5)
    for step in range(20):
        uniforms = sampler.draw(16, 1, VOCAB, params, torch.Generator().manual_seed(step))
        assert uniforms is not None
        tokens = sampler.sample(logits, params, uniforms[0])
        for row, token in enumerate(tokens.tolist()):
            assert _nucleus(logits[row], 0.5)[token] > 0


def test_top_k_then_top_p_stays_inside_the_top_k() -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(6)) * 0.1
    params = SamplingParams(temperature=1.0, top_k=20, top_p=0.5)
    top = logits.topk(20).values
    expected = _nucleus(torch.full_like(logits, float("-inf")).scatter(0, logits.topk(20).indices, top), 0.5)
    observed = _frequencies(_draw(logits, params, seed=7))
    assert not bool((observed[expected == 0] > 0).any())
    assert _within_four_standard_errors(observed, expected.double())


def test_greedy_takes_the_argmax_and_draws_nothing() -> None:
    sampler = InverseCdfSampler()
    greedy = SamplingParams(temperature=0.0)
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(8))
    assert sampler.draw(4, 3, VOCAB, greedy, None) is None
    assert torch.equal(sampler.sample(logits, greedy, None), logits.argmax(-1))
