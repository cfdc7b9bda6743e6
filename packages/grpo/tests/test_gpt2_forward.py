"""The written-out GPT-2 forward of packed passes: HF's log-probs and gradients, or HF's forward."""

from __future__ import annotations

import pytest
import torch
from test_shared_prefix import VOCAB, _batch

from entrepot.grpo import load_config
from entrepot.grpo.algo.sequences import ResponseBatch, response_logprobs
from entrepot.grpo.embedded.gpt2_forward import supports
from entrepot.grpo.engines.models import build_model


def _gpt2(**config_overrides: object) -> torch.nn.Module:
    config = load_config(None, ["model.max_positions=64"])
    torch.manual_seed(0)
    model = build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1)
    for key, value in config_overrides.items():
        setattr(model.config, key, value)
    return model


def _logprobs_and_grads(model: torch.nn.Module, batch: ResponseBatch, packed: bool) -> tuple:
    model.zero_grad(set_to_none=True)
    logp, _ = response_logprobs(model, batch, packed=packed)
    (logp * torch.linspace(-1.0, 1.0, logp.numel())).sum().backward()
    return logp.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_written_out_is_hf(model: torch.nn.Module, batch: ResponseBatch) -> None:
    """The packed pass (written out) gives the padded pass's (HF's forward) log-probs and gradients."""
    packed_logp, packed_grads = _logprobs_and_grads(model, batch, packed=True)
    padded_logp, padded_grads = _logprobs_and_grads(model, batch, packed=False)
    torch.testing.assert_close(packed_logp, padded_logp, atol=1e-5, rtol=0)
    assert packed_grads.keys() == padded_grads.keys()
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grad, padded_grads[name], atol=1e-5, rtol=1e-4, msg=name)


SHARED = ([[2, 3, 4], [5, 6], [2, 3, 4], [5, 6]], [4, 3, 2, 5])  # prompt groups: the shared-prefix row
DISTINCT = ([[2, 3, 4], [5, 6], [7, 8, 9]], [4, 3, 2])  # no repeated prompt: the varlen packed row


@pytest.mark.parametrize("rows", [SHARED, DISTINCT], ids=["shared-prefix", "varlen"])
@pytest.mark.parametrize("activation", ["gelu", "gelu_new"])
def test_the_written_out_forward_gives_hf_log_probs_and_gradients(rows: tuple, activation: str) -> None:
    model = _gpt2(activation_function=activation)
    if activation == "gelu_new":  # HF picks the activation module at build time
        from transformers.activations import ACT2FN

        for block in model.transformer.h:
            block.mlp.act = ACT2FN[activation]
    assert supports(model)
    assert_written_out_is_hf(model, _batch(*rows))


def test_models_it_does_not_reproduce_keep_the_hf_forward() -> None:
    assert supports(_gpt2())  # the embedded default: no dropout, exact GELU
    assert not supports(_gpt2(scale_attn_by_inverse_layer_idx=True))
    assert not supports(_gpt2(activation_function="relu"))
    dropout = _gpt2(resid_pdrop=0.1)
    assert not supports(dropout.train())  # dropout would apply
    assert supports(dropout.eval())  # it does not in eval mode
    config = load_config(None, ["model.max_positions=64", "model.architecture=qwen2"])
    assert not supports(build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1))
