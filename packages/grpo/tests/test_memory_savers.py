"""model.reference_dtype and engine.activation_checkpointing: validated, and what they change."""

from __future__ import annotations

import pytest
import torch
from test_shared_prefix import VOCAB, _batch

from entrepot.grpo import load_config
from entrepot.grpo.algo.sequences import response_logprobs
from entrepot.grpo.embedded import checkpointing
from entrepot.grpo.errors import GRPOConfigError


def test_reference_dtype_is_validated_naming_the_key() -> None:
    assert load_config(None, []).model.reference_dtype == "float32"
    assert load_config(None, ["model.reference_dtype=bfloat16"]).model.reference_dtype == "bfloat16"
    with pytest.raises(GRPOConfigError, match=r"model\.reference_dtype.*'float32', 'bfloat16'"):
        load_config(None, ["model.reference_dtype=float16"])
    with pytest.raises(GRPOConfigError, match=r"model\.reference_dtype.*engine\.train='megatron'"):
        load_config(None, ["model.reference_dtype=bfloat16", "engine.train=megatron"])


def test_activation_checkpointing_is_validated_naming_the_key() -> None:
    assert load_config(None, []).engine.activation_checkpointing is False
    with pytest.raises(GRPOConfigError, match=r"engine\.activation_checkpointing.*engine\.train='megatron'"):
        load_config(None, ["engine.activation_checkpointing=true", "engine.train=megatron"])


def test_the_built_reference_is_frozen_in_its_dtype_and_not_the_policy() -> None:
    from entrepot.grpo.engines.policy import build_policy

    policy = build_policy(load_config(None, ["model.reference_dtype=bfloat16"]))
    trainer = policy.trainer
    reference, model = trainer.reference, trainer.model  # type: ignore[attr-defined]
    params = list(reference.parameters())
    assert params and all(p.dtype == torch.bfloat16 and not p.requires_grad for p in params)
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())
    ours = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert ours.isdisjoint(p.untyped_storage().data_ptr() for p in params)  # its own copy, held once
    batch = _rows_of(policy)
    logp = trainer.logprobs(batch, "ref_log_prob", reference=True)
    assert logp.dtype == torch.float32 and not logp.requires_grad
    exact = trainer.logprobs(batch, "old_log_prob", reference=False)  # the same weights in float32
    assert (logp - exact).abs().max() < 0.05  # bfloat16 weights, float32 log-softmax


def _rows_of(policy: object) -> object:
    from entrepot.grpo.algo.sequences import ResponseBatch

    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, 10, (12,), generator=gen)
    responses = torch.randint(2, 10, (10,), generator=gen)
    return ResponseBatch.from_packed(prompts, torch.tensor([4, 4, 4]), responses, torch.tensor([3, 3, 4]))


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _gpt2() -> torch.nn.Module:
    from entrepot.grpo.engines.models import build_model

    torch.manual_seed(0)
    return build_model(
        load_config(None, ["model.max_positions=64"]).model, VOCAB, pad_token_id=0, eos_token_id=1
    )


def _grads(model: torch.nn.Module, packed: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward and backward inside the attention switch, as the update runs them (`algo.update`)."""
    from entrepot.grpo.algo.update import _attention

    model.zero_grad(set_to_none=True)
    with _attention(model, packed):
        logp, entropy = response_logprobs(
            model, _batch(), packed=packed, with_entropy=True, entropy_grad=True
        )
        assert entropy is not None
        (torch.linspace(-1.0, 1.0, logp.numel()) * logp + 0.1 * entropy).sum().backward()
    return logp.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["hf-llama", "embedded-gpt2"])
def test_checkpointed_layers_give_the_same_log_probs_and_gradients(build: object, packed: bool) -> None:
    model = build()  # type: ignore[operator]
    plain_logp, plain = _grads(model, packed)
    wrapped = checkpointing.enable(model)
    assert wrapped >= (3 if build is _llama else 2)  # every decoder layer (the GPT-2's HF view's blocks)
    calls = []
    original = torch.utils.checkpoint.checkpoint

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpointing, "checkpoint", counting)
        ours_logp, ours = _grads(model, packed)
        assert len(calls) >= 2  # the layers did run checkpointed
        calls.clear()
        with torch.no_grad():
            response_logprobs(model, _batch(), packed=packed)
        assert not calls  # a no-grad pass (log-probs) runs plain
    torch.testing.assert_close(ours_logp, plain_logp, atol=0, rtol=0)
    assert ours.keys() == plain.keys()
    for name, grad in ours.items():
        torch.testing.assert_close(grad, plain[name], atol=1e-6, rtol=1e-6, msg=name)
