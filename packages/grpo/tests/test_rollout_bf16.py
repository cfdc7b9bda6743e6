"""`engine.rollout_dtype: bfloat16`: the rollout engines' own bfloat16 copy, refreshed on every load.

Against a bfloat16 HF model's `generate` (greedy tokens), the float32 engine (log-probs within the
bfloat16 tolerance `BF16_LOGP_ATOL`), through the infer-mode switch (the copy follows the policy's
float32 weights), and the key's validation. Tiny random Llama / Qwen2 / Qwen3 models of
`test_rollout_llama`, and the default embedded GPT-2.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch
from test_rollout_llama import ARCHITECTURES, PROMPTS, QWEN2_RUN, _hf_generate, _tiny

from entrepot.grpo import load_config
from entrepot.grpo.engines.base import SamplingParams
from entrepot.grpo.engines.rollout_llama import LlamaRolloutEngine
from entrepot.grpo.errors import GRPOConfigError

BF16_LOGP_ATOL = 0.1
"""How far a bfloat16 engine's log-prob of a token may sit from another engine's on the same prefix.

bfloat16 keeps 8 mantissa bits (a relative rounding of 2^-9 a value); these tiny models' weights
(std 0.3) make large activations, so on them a bfloat16 HF model's own log-probs sit up to 0.065 from
the float32 model's, and ours up to 0.07 from the bfloat16 HF model's and 0.095 from float32."""

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
AGREED = 3  # greedy tokens every row must share before rounding may tip a near-tie argmax


def _bf16(model: torch.nn.Module) -> LlamaRolloutEngine:
    engine = LlamaRolloutEngine.of(model, dtype=torch.bfloat16)
    engine.load_weights(dict(model.state_dict()))  # float32 tensors, rounded into the copy
    return engine


def _assert_close_on_the_shared_prefix(
    tokens: torch.Tensor, logp: torch.Tensor, other_tokens: torch.Tensor, other_logp: torch.Tensor
) -> None:
    """Tokens [B, T] agree on each row's first `AGREED`; log-probs [B, T] up to the first divergence."""
    shared = (tokens == other_tokens).long().cumprod(1).bool()  # [B, T] before the first divergence
    assert shared[:, :AGREED].all(), shared.sum(1).tolist()
    torch.testing.assert_close(logp[shared], other_logp[shared], atol=BF16_LOGP_ATOL, rtol=0)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_bf16_greedy_tokens_and_log_probs_are_a_bf16_hf_models(architecture: str) -> None:
    """Against bfloat16 HF generate (its kernels round elsewhere: no bit-exact match is claimed)."""
    model = _tiny(architecture)
    tokens, logp = _hf_generate(copy.deepcopy(model).to(torch.bfloat16), PROMPTS, 8)
    out = _bf16(model).generate(PROMPTS, GREEDY)
    assert out.logprobs.dtype == torch.float32  # upcast logits -> float32 log-softmax
    _assert_close_on_the_shared_prefix(out.tokens.view(len(PROMPTS), 8), out.logprobs.view(len(PROMPTS), 8),
                                       tokens, logp)  # fmt: skip


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_bf16_log_probs_are_the_float32_engines_within_bf16_rounding(architecture: str) -> None:
    model = _tiny(architecture)
    fp32 = LlamaRolloutEngine.reading(model).generate(PROMPTS, GREEDY)
    engine = _bf16(model)
    assert engine.resident_bytes() * 2 == sum(t.numel() * 4 for t in engine._storage.values())
    out = engine.generate(PROMPTS, GREEDY)
    rows = len(PROMPTS)
    _assert_close_on_the_shared_prefix(out.tokens.view(rows, 8), out.logprobs.view(rows, 8),
                                       fp32.tokens.view(rows, 8), fp32.logprobs.view(rows, 8))  # fmt: skip


def test_the_bf16_copy_follows_the_policy_through_the_mode_switch() -> None:
    from entrepot.grpo.engines.policy import build_policy

    policy = build_policy(load_config(None, [*QWEN2_RUN, "engine.rollout_dtype=bfloat16"]))
    engine = policy.engine
    assert isinstance(engine, LlamaRolloutEngine) and not engine.reads_policy
    assert engine.dtype == torch.bfloat16 and "bfloat16" in engine.description
    model: Any = policy.trainer.model
    assert next(model.parameters()).dtype == torch.float32  # the trainer (old log-probs) stays float32
    with policy.manager.mode("infer"):
        before = engine.generate(PROMPTS, GREEDY)
    with policy.manager.mode("train"), torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.3)  # an optimizer step, in place
    with policy.manager.mode("infer"):
        after = engine.generate(PROMPTS, GREEDY)
    assert not torch.allclose(before.logprobs, after.logprobs)  # refreshed on load
    assert after.logprobs.dtype == torch.float32
    fresh = _bf16(model).generate(PROMPTS, GREEDY)  # a copy made from the new weights
    assert torch.equal(after.tokens, fresh.tokens) and torch.equal(after.logprobs, fresh.logprobs)


def test_the_embedded_gpt2_engine_runs_bf16_within_bf16_rounding() -> None:
    from entrepot.grpo.engines.policy import build_policy

    outs = []
    for dtype in ("float32", "bfloat16"):
        policy = build_policy(load_config(None, [f"engine.rollout_dtype={dtype}"]))
        engine: Any = policy.engine
        assert next(iter(engine.weights.values())).dtype == getattr(torch, dtype)
        with policy.manager.mode("infer"):
            outs.append(engine.generate(PROMPTS, GREEDY))
    fp32, bf16 = outs
    assert bf16.logprobs.dtype == torch.float32
    _assert_close_on_the_shared_prefix(*(t.view(len(PROMPTS), -1) for t in (bf16.tokens, bf16.logprobs,
                                       fp32.tokens, fp32.logprobs)))  # fmt: skip


def test_the_hf_generate_fallback_refuses_bf16() -> None:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from entrepot.grpo.engines.rollout_hf import build_hf_engine

    config = GPTNeoXConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                           intermediate_size=48)  # fmt: skip
    engine = load_config(None, ["engine.rollout_dtype=bfloat16"]).engine
    with pytest.raises(GRPOConfigError, match=r"engine\.rollout_dtype"):
        build_hf_engine(engine, GPTNeoXForCausalLM(config), copy_module=False)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["engine.rollout_dtype=float16"], "engine.rollout_dtype"),
        (["engine.rollout_dtype=bfloat16", "engine.rollout=vllm"], "engine.rollout_dtype"),
        (["engine.rollout_dtype=bfloat16", "engine.train=megatron"], "engine.rollout_dtype"),
        (["engine.rollout_dtype=bfloat16", "rollout.partial_max_tokens=4", "algorithm.correction.kind=none"],
         "algorithm.correction.kind"),
    ],
)  # fmt: skip
def test_the_key_is_validated(overrides: list[str], key: str) -> None:
    with pytest.raises(GRPOConfigError, match=re.escape(key)):
        load_config(None, overrides)


def test_partial_rollout_with_a_correction_accepts_bf16() -> None:
    config = load_config(None, ["engine.rollout_dtype=bfloat16", "rollout.partial_max_tokens=4",
                                "algorithm.correction.kind=tis"])  # fmt: skip
    assert config.engine.rollout_dtype == "bfloat16"


def test_the_memory_estimate_halves_the_rollout_copy_and_kv_cache() -> None:
    from entrepot.grpo.run.memory import estimate_memory

    fp32 = estimate_memory(load_config(None, QWEN2_RUN))
    bf16 = estimate_memory(load_config(None, [*QWEN2_RUN, "engine.rollout_dtype=bfloat16"]))
    assert fp32.rollout_weights == 0  # reads the policy's parameters
    assert bf16.rollout_weights * 2 == fp32.params  # a bfloat16 copy of its own
    assert bf16.kv_cache * 2 == fp32.kv_cache
    gpt2_fp32, gpt2_bf16 = (estimate_memory(load_config(None, [f"engine.rollout_dtype={d}"]))
                            for d in ("float32", "bfloat16"))  # fmt: skip
    assert gpt2_bf16.rollout_weights * 2 == gpt2_fp32.rollout_weights
    assert gpt2_bf16.kv_cache * 2 == gpt2_fp32.kv_cache


def test_auto_never_picks_bf16_where_a_bf16_copy_would_be_refused() -> None:
    from entrepot.grpo.engines.rollout_dtype import resolved_rollout_dtype

    for overrides in (["engine.rollout=vllm"], ["engine.train=megatron"],
                      ["rollout.partial_max_tokens=4", "algorithm.correction.kind=none"]):  # fmt: skip
        config = load_config(None, ["engine.rollout_dtype=auto", *overrides])  # accepted, unlike bfloat16
        assert resolved_rollout_dtype(config) == "float32"


def test_auto_takes_bf16_only_where_this_machine_multiplies_it_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from entrepot.grpo.engines import rollout_dtype
    from entrepot.grpo.engines.policy import build_policy

    speedup = rollout_dtype.bf16_speedup("cpu")  # timed for real: > 0, cached for the process
    assert speedup > 0 and rollout_dtype.bf16_speedup("cpu") == speedup
    config = load_config(None, ["engine.rollout_dtype=auto"])
    expected = "bfloat16" if speedup >= rollout_dtype.MIN_SPEEDUP else "float32"
    assert rollout_dtype.resolved_rollout_dtype(config) == expected
    engine: Any = build_policy(config).engine  # the embedded GPT-2 engine builds the resolved dtype
    assert next(iter(engine.weights.values())).dtype == getattr(torch, expected)
    for measured, chosen in ((0.02, "float32"), (2.5, "bfloat16")):  # an AVX2-only CPU, one with AMX
        monkeypatch.setattr(rollout_dtype, "bf16_speedup", lambda device, s=measured: s)
        assert rollout_dtype.resolved_rollout_dtype(config) == chosen
    for dtype in ("float32", "bfloat16"):  # a dtype set by name is never second-guessed
        named = load_config(None, [f"engine.rollout_dtype={dtype}"])
        assert rollout_dtype.resolved_rollout_dtype(named) == dtype
