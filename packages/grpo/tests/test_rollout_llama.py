"""The Llama-family KV-cache engine and packed forward: HF generate's tokens, HF's log-probs and gradients.

Tiny random Llama (llama3 RoPE scaling, untied head, attention and MLP biases), Qwen2 (qkv bias,
tied head) and Qwen3 (q/k norm, yarn RoPE, one key/value head) models built here, fp32.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_gpt2_forward import DISTINCT, SHARED, assert_written_out_is_hf

from entrepot.grpo.algo.sequences import ResponseBatch, response_logprobs
from entrepot.grpo.embedded import llama_forward
from entrepot.grpo.engines.base import SamplingParams
from entrepot.grpo.engines.registry import rollout_description
from entrepot.grpo.engines.rollout_llama import LlamaRolloutEngine
from entrepot.grpo.errors import GRPOConfigError

VOCAB = 40
SIZES = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "max_position_embeddings": 128}  # fmt: skip


def _tiny(architecture: str, **overrides: Any) -> Any:
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    if architecture == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}  # fmt: skip
        config: Any = LlamaConfig(**SIZES, num_key_value_heads=2, rope_parameters=rope,
                                  tie_word_embeddings=False, attention_bias=True, mlp_bias=True)  # fmt: skip
        cls: Any = LlamaForCausalLM
    elif architecture == "qwen2":
        config, cls = Qwen2Config(**SIZES, num_key_value_heads=2, tie_word_embeddings=True), Qwen2ForCausalLM
    else:
        rope = {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 2.0,
            "original_max_position_embeddings": 64,
        }
        config = Qwen3Config(**SIZES, num_key_value_heads=1, head_dim=16, rope_parameters=rope,
                             tie_word_embeddings=True)  # fmt: skip
        cls = Qwen3ForCausalLM
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():  # weights large enough for peaked, distinct logits
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.3)
    return model


ARCHITECTURES = ["llama", "qwen2", "qwen3"]
PROMPTS = [[3, 4, 5, 6], [7, 8], [3, 4, 5, 6], [9, 10, 11]]


def _hf_generate(model: Any, prompts: list[list[int]], steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF generate's greedy tokens [B, steps] and their log-probs under its logits (left-padded batch)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :], mask[row, width - len(p) :] = torch.tensor(p), 1
    settings = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None, "output_logits": True,
                "return_dict_in_generate": True}  # fmt: skip
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, **settings)
    tokens = out.sequences[:, width:]
    logp = torch.stack(out.logits, 1).float().log_softmax(-1).gather(2, tokens[:, :, None]).squeeze(2)
    return tokens, logp


def _owned(model: torch.nn.Module, lanes: int = 1) -> LlamaRolloutEngine:
    engine = LlamaRolloutEngine.of(model, lanes=lanes)
    engine.load_weights(dict(model.state_dict()))
    return engine


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_greedy_tokens_and_log_probs_are_hf_generates(architecture: str) -> None:
    model = _tiny(architecture)
    tokens, logp = _hf_generate(model, PROMPTS, 8)
    for engine in (_owned(model), LlamaRolloutEngine.reading(model)):
        out = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=8))
        assert torch.equal(out.tokens.view(len(PROMPTS), 8), tokens)
        torch.testing.assert_close(out.logprobs.view(len(PROMPTS), 8), logp, atol=1e-5, rtol=0)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_sampled_log_probs_are_the_models(architecture: str) -> None:
    """The log-prob the engine reports for each sampled token is HF's (the packed pass's) for it."""
    model = _tiny(architecture)
    engine = LlamaRolloutEngine.reading(model)
    out = engine.generate(
        PROMPTS, SamplingParams(max_new_tokens=6), generator=torch.Generator().manual_seed(1)
    )
    batch = ResponseBatch.from_packed(
        torch.tensor([t for p in PROMPTS for t in p]), torch.tensor([len(p) for p in PROMPTS]),
        out.tokens, out.lengths,
    )  # fmt: skip
    with torch.no_grad():
        theirs, _ = response_logprobs(model, batch, packed=False)  # HF's forward on the padded grid
    torch.testing.assert_close(out.logprobs, theirs, atol=1e-5, rtol=0)


def test_prefix_sharing_and_lanes_do_not_change_the_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    from entrepot.grpo.engines import kv_decoding

    model = _tiny("qwen2")
    prefilled: list[int] = []
    one = _owned(model)
    forward = one._forward

    def counting(ids: torch.Tensor, *args: Any) -> torch.Tensor:
        prefilled.append(ids.shape[0])
        return forward(ids, *args)

    one._forward = counting  # type: ignore[method-assign, assignment]
    group = [p for p in PROMPTS[:2] for _ in range(4)]  # 2 prompts x 4 samples
    params = SamplingParams(max_new_tokens=6)
    shared = one.generate(group, params, generator=torch.Generator().manual_seed(3))
    assert prefilled[0] == 2  # each distinct prompt prefilled once
    two = _owned(model, lanes=2).generate(group, params, generator=torch.Generator().manual_seed(3))
    every_row = list(range(len(group)))
    monkeypatch.setattr(kv_decoding, "distinct_rows", lambda flat, lengths: (every_row, every_row))
    prefilled.clear()
    unshared = one.generate(group, params, generator=torch.Generator().manual_seed(3))
    assert prefilled[0] == len(group)  # every row prefilled
    for other in (two, unshared):
        assert torch.equal(shared.tokens, other.tokens) and torch.equal(shared.lengths, other.lengths)
        torch.testing.assert_close(shared.logprobs, other.logprobs, atol=1e-5, rtol=0)


def test_the_engine_reading_the_policy_sees_an_optimizer_step() -> None:
    model = _tiny("llama")
    engine = LlamaRolloutEngine.reading(model)
    assert engine.resident_bytes() == 0  # no copy: the policy's parameters
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    before = engine.generate(PROMPTS, greedy).logprobs
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    model(input_ids=torch.tensor([PROMPTS[0]]), labels=torch.tensor([PROMPTS[0]])).loss.backward()
    optimizer.step()
    model.eval()
    after = engine.generate(PROMPTS, greedy)
    assert not torch.allclose(before, after.logprobs)
    tokens, logp = _hf_generate(model, PROMPTS, 4)  # the updated weights' samples
    assert torch.equal(after.tokens.view(len(PROMPTS), 4), tokens)
    torch.testing.assert_close(after.logprobs.view(len(PROMPTS), 4), logp, atol=1e-5, rtol=0)


def test_fused_inference_names_load_like_hf_names() -> None:
    """A megatron `Resharder` writes qkv_proj / gate_up_proj: the engine splits them into its storage."""
    from entrepot.resharding import LocalResharder
    from entrepot.resharding.adaptors import get_adaptor
    from entrepot.resharding.engines.torch import TorchTrainingEngine

    model = _tiny("qwen3")
    adaptor = get_adaptor("Qwen3ForCausalLM", model.config)
    fused = LocalResharder(adaptor, "infer").reshard(
        TorchTrainingEngine(model, adaptor).named_train_parameters()
    )
    assert any(".qkv_proj." in name for name in fused)
    engine = LlamaRolloutEngine.of(model)
    engine.load_weights(fused)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=5)
    assert torch.equal(
        engine.generate(PROMPTS, greedy).tokens, _owned(model).generate(PROMPTS, greedy).tokens
    )
    hf = engine.hf_weights()
    for name, p in model.named_parameters():
        assert torch.equal(hf[name], p), name


def _batch(prompts: list[list[int]], response_lengths: list[int]) -> ResponseBatch:
    gen = torch.Generator().manual_seed(5)
    responses = torch.randint(2, VOCAB, (sum(response_lengths),), generator=gen)
    flat = torch.tensor([t for p in prompts for t in p])
    return ResponseBatch.from_packed(flat, torch.tensor([len(p) for p in prompts]), responses,
                                     torch.tensor(response_lengths))  # fmt: skip


@pytest.mark.parametrize("rows", [SHARED, DISTINCT], ids=["shared-prefix", "varlen"])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_written_out_forward_gives_hf_log_probs_and_gradients(architecture: str, rows: tuple) -> None:
    model = _tiny(architecture).train()
    assert llama_forward.supports(model)
    assert_written_out_is_hf(model, _batch(*rows))


def test_packed_hidden_through_the_head_is_packed_logits() -> None:
    model = _tiny("qwen3")
    ids, positions, keep = torch.tensor([3, 4, 5, 6, 7]), torch.arange(5), torch.tensor([1, 4])
    from entrepot.batching import packed_causal_attention

    cu = torch.tensor([0, 5], dtype=torch.int32)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return packed_causal_attention(q, k, v, cu, 5)

    hidden = llama_forward.packed_hidden(model, ids, positions, keep, attend)
    assert hidden.shape == (2, 32)
    logits = llama_forward.packed_logits(model, ids, positions, keep, attend)
    torch.testing.assert_close(hidden @ llama_forward.head_weight(model).T, logits)
    torch.testing.assert_close(logits, model(input_ids=ids[None]).logits[0, keep], atol=1e-5, rtol=0)


def test_models_it_does_not_reproduce_are_refused_or_keep_the_hf_forward() -> None:
    dynamic = _tiny("qwen2")
    dynamic.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    assert not llama_forward.supports(dynamic)
    with pytest.raises(GRPOConfigError, match=r"rope_type='dynamic' is not supported"):
        LlamaRolloutEngine.of(dynamic)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    windowed = Qwen2Config(**SIZES, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                           max_window_layers=0)  # fmt: skip
    sliding = Qwen2ForCausalLM(windowed)
    assert not llama_forward.supports(sliding)
    with pytest.raises(GRPOConfigError, match=r"sliding-window attention"):
        LlamaRolloutEngine.of(sliding)
    checkpointing = _tiny("llama").train()
    checkpointing.activation_checkpointing_enable()
    assert not llama_forward.supports(checkpointing)


def test_the_start_up_line_names_the_engine() -> None:
    from entrepot.grpo.config import EngineConfig

    torch_engine = EngineConfig()
    assert (
        rollout_description(torch_engine, "Qwen3ForCausalLM")
        == "rollout engine: llama kv-cache (Qwen3ForCausalLM), float32"
    )
    auto = EngineConfig(rollout_dtype="auto")
    assert rollout_description(auto, "Qwen3ForCausalLM", "bfloat16") == (
        "rollout engine: llama kv-cache (Qwen3ForCausalLM), bfloat16 (engine.rollout_dtype: auto)"
    )
    assert rollout_description(torch_engine, "GemmaForCausalLM") == (
        "rollout engine: HF generate (fallback for GemmaForCausalLM)"
    )


QWEN2_RUN = ["model.architecture=qwen2", "model.hidden_size=32", "model.num_heads=4", "model.num_kv_heads=2",
             "model.intermediate_size=48", "model.num_layers=2"]  # fmt: skip


def test_in_one_process_the_rollout_reads_the_policys_parameters_through_the_mode_switch() -> None:
    from entrepot.grpo import load_config
    from entrepot.grpo.engines.policy import build_policy

    policy = build_policy(load_config(None, QWEN2_RUN))
    engine = policy.engine
    assert isinstance(engine, LlamaRolloutEngine) and engine.reads_policy
    model: Any = policy.trainer.model
    loaded: list[dict[str, torch.Tensor]] = []
    load = engine.load_weights
    engine.load_weights = lambda weights: (loaded.append(dict(weights)), load(weights))[1]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
    with policy.manager.mode("infer"):
        before = engine.generate(PROMPTS, greedy)
    params = dict(model.named_parameters())
    assert loaded[0].keys() == params.keys()  # handed over by HF name, unconverted, uncopied
    assert all(t.data_ptr() == params[name].data_ptr() for name, t in loaded[0].items())
    assert engine.resident_bytes() == 0
    with policy.manager.mode("train"), torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.3)  # what an optimizer step does: in place
    with policy.manager.mode("infer"):
        after = engine.generate(PROMPTS, greedy)
    assert not torch.allclose(before.logprobs, after.logprobs)
    tokens, logp = _hf_generate(model.eval(), PROMPTS, 4)
    assert torch.equal(after.tokens.view(len(PROMPTS), 4), tokens)
    torch.testing.assert_close(after.logprobs.view(len(PROMPTS), 4), logp, atol=1e-5, rtol=0)


@pytest.mark.parametrize("override", ["model.lora.rank=4", "engine.offload_params=true"])
def test_lora_or_offloaded_parameters_give_the_engine_its_own_copy(override: str) -> None:
    from entrepot.grpo import load_config
    from entrepot.grpo.engines.policy import build_policy

    extra = ["engine.offload_grads=true", "engine.offload_optimizer=true"] if "offload" in override else []
    policy = build_policy(load_config(None, [*QWEN2_RUN, override, *extra]))
    engine = policy.engine
    assert isinstance(engine, LlamaRolloutEngine) and not engine.reads_policy
    with policy.manager.mode("infer"):
        out = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=3))
        assert engine.resident_bytes() > 0
    assert out.lengths.tolist() == [3] * len(PROMPTS)
