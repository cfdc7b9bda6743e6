"""The KV-cache rollout engine: greedy equals no-cache greedy, sampling knobs, weights via the resharder."""

from __future__ import annotations

import pytest
import torch

from entrepot.grpo.config import ModelConfig
from entrepot.grpo.embedded.gpt2_layout import gpt2_hf_to_infer
from entrepot.grpo.engines.base import Rollout, SamplingParams
from entrepot.grpo.engines.models import build_hf_config, build_model
from entrepot.grpo.engines.rollout_embedded import GPT2RolloutEngine
from entrepot.resharding.errors import UnknownArchitectureError


def _model_and_engine() -> tuple[torch.nn.Module, GPT2RolloutEngine]:
    torch.manual_seed(0)
    model = build_model(ModelConfig(init_std=0.3), 14, pad_token_id=0, eos_token_id=1).eval()
    engine = GPT2RolloutEngine.from_hf_config(model.config)
    engine.load_weights(gpt2_hf_to_infer(dict(model.state_dict())))
    return model, engine


def _rows(out: Rollout) -> list[list[int]]:
    """The responses of a rollout as token lists."""
    return [row.tolist() for row in out.responses()]


@torch.no_grad()
def _greedy_no_cache(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    for _ in range(steps):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def test_kv_cache_greedy_equals_no_cache_greedy() -> None:
    model, engine = _model_and_engine()
    prompts = [[2, 3, 4, 5, 6], [7, 8, 9], [10, 11, 2, 3]]  # ragged: left padding must not leak
    out = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=6))
    assert _rows(out) == [_greedy_no_cache(model, p, 6) for p in prompts]
    assert out.tokens.dtype == torch.int64 and out.lengths.tolist() == [6, 6, 6]
    assert out.logprobs.dtype == torch.float32 and out.logprobs.shape == out.tokens.shape


def test_stop_tokens_and_sampling_knobs() -> None:
    _, engine = _model_and_engine()
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(1,))
    out = _rows(engine.generate([[2, 3]] * 64, params, generator=gen))
    assert all(1 not in r[:-1] for r in out) and any(len(r) < 8 for r in out)  # stopped rows end at eos
    top1 = _rows(engine.generate([[2, 3]] * 8, SamplingParams(top_k=1, max_new_tokens=4), generator=gen))
    greedy = _rows(engine.generate([[2, 3]], SamplingParams(temperature=0.0, max_new_tokens=4)))
    assert all(r == greedy[0] for r in top1)
    nucleus = _rows(
        engine.generate([[2, 3]] * 8, SamplingParams(top_p=1e-6, max_new_tokens=4), generator=gen)
    )
    assert all(r == greedy[0] for r in nucleus)


def test_resharding_adaptor_gives_the_same_inference_weights() -> None:
    from entrepot.resharding.adaptors import get_adaptor

    model, _ = _model_and_engine()
    adaptor = get_adaptor("GPT2LMHeadModel", model.config)
    hf = {n: p.detach() for n, p in model.named_parameters()}
    via_adaptor = adaptor.train_to_infer(adaptor.hf_to_train(hf))
    direct = gpt2_hf_to_infer(hf)
    assert sorted(via_adaptor) == sorted(direct)
    for name, tensor in direct.items():
        assert torch.equal(via_adaptor[name], tensor), name


@pytest.mark.parametrize("activation", ["gelu", "gelu_new", "relu"])
def test_the_engine_follows_the_checkpoints_activation(activation: str) -> None:
    """A GPT-2 checkpoint's activation_function is what the engine computes (next-token logits agree)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf_config = build_hf_config(ModelConfig(init_std=0.3), 14, pad_token_id=0, eos_token_id=1)
    hf_config.activation_function = activation
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager").eval()
    engine = GPT2RolloutEngine.from_hf_config(model.config)
    engine.load_weights(gpt2_hf_to_infer(dict(model.state_dict())))
    logp = engine.generate(
        [[2, 3, 4, 5]], SamplingParams(temperature=0.0, max_new_tokens=1)
    ).response_logprobs()
    with torch.no_grad():
        expected = torch.log_softmax(model(input_ids=torch.tensor([[2, 3, 4, 5]])).logits[0, -1], -1).max()
    torch.testing.assert_close(torch.as_tensor(logp[0][0]), expected, atol=1e-5, rtol=1e-5)


def test_an_unknown_activation_is_refused_by_name() -> None:
    hf_config = build_hf_config(ModelConfig(), 14, pad_token_id=0, eos_token_id=1)
    hf_config.activation_function = "gelu_10"
    with pytest.raises(UnknownArchitectureError, match=r"activation_function 'gelu_10' is not supported"):
        GPT2RolloutEngine.from_hf_config(hf_config)


def test_a_repeated_prompt_is_prefilled_once_and_decodes_like_a_distinct_one() -> None:
    model, engine = _model_and_engine()
    prompts = [[2, 3, 4, 5, 6], [7, 8, 9], [2, 3, 4, 5, 6], [7, 8, 9], [2, 3, 4, 5, 6]]  # 2 distinct
    rows_prefilled: list[int] = []
    forward = engine._forward

    def counting_forward(ids: torch.Tensor, *args: object) -> torch.Tensor:
        rows_prefilled.append(ids.shape[0])
        return forward(ids, *args)  # type: ignore[arg-type]

    engine._forward = counting_forward  # type: ignore[method-assign]
    rollout = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=6))
    out, logp = _rows(rollout), rollout.response_logprobs()
    assert rows_prefilled[0] == 2  # the prefill ran the distinct prompts; decoding runs every row
    assert rows_prefilled[1:] and set(rows_prefilled[1:]) == {5}
    assert out == [_greedy_no_cache(model, p, 6) for p in prompts]
    torch.testing.assert_close(logp[0], logp[2])
    torch.testing.assert_close(logp[1], logp[3])


def test_gumbel_sampling_draws_the_softmax_distribution() -> None:
    _, engine = _model_and_engine()
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0] + [-30.0] * (engine.vocab - 4))
    params = SamplingParams(temperature=0.7, max_new_tokens=1)
    rows = 40_000
    noise = engine.sampler.draw(rows, 1, engine.vocab, params, torch.Generator().manual_seed(0))
    assert noise is not None
    tokens = engine.sampler.sample(logits.expand(rows, -1), params, noise[0])
    observed = torch.bincount(tokens, minlength=engine.vocab).double() / rows
    expected = (logits / 0.7).softmax(-1).double()
    # within 4 standard errors of a multinomial proportion, for every token
    assert torch.all((observed - expected).abs() <= 4 * (expected * (1 - expected) / rows).sqrt() + 1e-9)


def test_decoding_lanes_do_not_change_the_samples() -> None:
    model, one_lane = _model_and_engine()
    two_lanes = GPT2RolloutEngine.from_hf_config(model.config, lanes=2)
    two_lanes.load_weights(gpt2_hf_to_infer(dict(model.state_dict())))
    prompts = [[2, 3, 4], [5, 6], [2, 3, 4], [7, 8, 9, 10], [5, 6]]
    params = SamplingParams(max_new_tokens=6, stop_token_ids=(1,))
    one = one_lane.generate(prompts, params, generator=torch.Generator().manual_seed(3))
    two = two_lanes.generate(prompts, params, generator=torch.Generator().manual_seed(3))
    assert torch.equal(one.tokens, two.tokens) and torch.equal(one.lengths, two.lengths)
    torch.testing.assert_close(one.logprobs, two.logprobs)


def test_the_noise_gives_the_samples_torch_multinomial_drew() -> None:
    """The sampling stream is the previous release's: multinomial draws argmax(p / E) step by step."""
    _, engine = _model_and_engine()
    params = SamplingParams(max_new_tokens=3)
    logits = torch.randn(3, 16, engine.vocab, generator=torch.Generator().manual_seed(1))
    noise = engine.sampler.draw(16, 3, engine.vocab, params, torch.Generator().manual_seed(7))
    assert noise is not None
    ours = torch.stack([engine.sampler.sample(logits[t], params, noise[t]) for t in range(3)])
    gen = torch.Generator().manual_seed(7)
    theirs = torch.stack(
        [torch.multinomial(logits[t].softmax(-1), 1, generator=gen).squeeze(-1) for t in range(3)]
    )
    assert torch.equal(ours, theirs)


def test_noise_past_its_budget_is_drawn_step_by_step_with_the_same_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from entrepot.grpo.engines import kv_decoding

    model, one_lane = _model_and_engine()
    two_lanes = GPT2RolloutEngine.from_hf_config(model.config, lanes=2)
    two_lanes.load_weights(gpt2_hf_to_infer(dict(model.state_dict())))
    prompts = [[2, 3, 4], [5, 6], [7, 8, 9, 10], [5, 6]]
    params = SamplingParams(max_new_tokens=5)
    expected = one_lane.generate(prompts, params, generator=torch.Generator().manual_seed(4))
    monkeypatch.setattr(kv_decoding, "NOISE_BYTES", 0)  # as a 50k vocabulary and long budget would be
    got = two_lanes.generate(prompts, params, generator=torch.Generator().manual_seed(4))
    assert torch.equal(got.tokens, expected.tokens) and torch.equal(got.lengths, expected.lengths)
