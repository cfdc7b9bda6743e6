"""The chunked LM head: log-probs, entropy and their gradients equal the whole-logits path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_shared_prefix import VOCAB, _batch

from entrepot.grpo.algo import sequences
from entrepot.grpo.algo.chunked_head import chunk_rows, chunked_logprobs
from entrepot.grpo.algo.hidden_states import head_weight


def _whole(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Today's unchunked maths: [R, V] logits, log_softmax, gather, -sum p log p."""
    log_probs = F.log_softmax((hidden @ weight.t()).float(), dim=-1)  # [R, V]
    return log_probs.gather(-1, labels[:, None]).squeeze(-1), -(log_probs.exp() * log_probs).sum(-1)


@pytest.mark.parametrize("rows", [1, 7, 64, 1000])
def test_values_and_gradients_equal_the_unchunked_head(rows: int) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 24, generator=gen, requires_grad=True)  # [R, E], logits of std ~1.5
    weight = (0.3 * torch.randn(300, 24, generator=gen)).requires_grad_()  # [V, E]
    labels = torch.randint(0, 300, (50,), generator=gen)
    a, b = torch.randn(50, generator=gen), torch.randn(50, generator=gen)  # weights of logp and entropy

    logp, entropy = _whole(hidden, weight, labels)
    grads = torch.autograd.grad((a * logp + b * entropy).sum(), (hidden, weight))
    c_logp, c_entropy = chunked_logprobs(
        hidden, weight, labels, with_entropy=True, entropy_grad=True, rows=rows
    )
    assert c_entropy is not None
    c_grads = torch.autograd.grad((a * c_logp + b * c_entropy).sum(), (hidden, weight))

    torch.testing.assert_close(c_logp, logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(c_entropy, entropy, atol=1e-6, rtol=1e-6)
    for ours, theirs in zip(c_grads, grads, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)


def test_entropy_without_its_gradient_is_detached_and_logp_grads_are_unchanged() -> None:
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 8, generator=gen, requires_grad=True)
    weight = torch.randn(20, 8, generator=gen, requires_grad=True)
    labels = torch.randint(0, 20, (9,), generator=gen)
    logp, entropy = chunked_logprobs(hidden, weight, labels, with_entropy=True, rows=4)
    assert entropy is not None and not entropy.requires_grad
    whole, _ = _whole(hidden, weight, labels)
    for ours, theirs in zip(torch.autograd.grad(logp.sum(), (hidden, weight)),
                            torch.autograd.grad(whole.sum(), (hidden, weight)), strict=True):  # fmt: skip
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    assert chunked_logprobs(hidden, weight, labels, rows=4)[1] is None


def test_chunks_hold_a_bounded_number_of_logit_rows() -> None:
    assert chunk_rows(49_152) == 341  # 64 MiB of float32 logits
    assert chunk_rows(16) >= 1_000_000  # a small vocabulary: one chunk, as before


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=True)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _gpt2() -> torch.nn.Module:
    from entrepot.grpo import load_config
    from entrepot.grpo.engines.models import build_model

    torch.manual_seed(0)
    return build_model(
        load_config(None, ["model.max_positions=64"]).model, VOCAB, pad_token_id=0, eos_token_id=1
    )


def _run(model: torch.nn.Module, packed: bool, chunked: bool, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """logp, entropy and parameter gradients of a weighted sum of both, by the chunked or the whole head."""
    from entrepot.grpo.algo import hidden_states

    with monkeypatch.context() as patch:
        if not chunked:
            patch.setattr(hidden_states, "head_weight", lambda model: None)
        model.zero_grad(set_to_none=True)
        batch = _batch()
        logp, entropy = sequences.response_logprobs(model, batch, packed=packed, with_entropy=True,
                                                    entropy_grad=True)  # fmt: skip
        weights = torch.linspace(-1.0, 1.0, logp.numel())
        (weights * logp + weights.flip(0) * entropy).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), grads


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["hf-llama", "embedded-gpt2"])
def test_the_model_paths_through_the_chunked_head_equal_the_logits_paths(
    build: object, packed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build()  # type: ignore[operator]
    assert head_weight(model) is not None
    ours, theirs = _run(model, packed, True, monkeypatch), _run(model, packed, False, monkeypatch)
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(ours[1], theirs[1], atol=1e-6, rtol=0)
    assert ours[2].keys() == theirs[2].keys() and ours[2]
    for name, grad in ours[2].items():
        torch.testing.assert_close(grad, theirs[2][name], atol=1e-6, rtol=1e-5, msg=name)


def test_heads_that_are_not_a_plain_linear_keep_the_logits_path() -> None:
    from peft import LoraConfig, get_peft_model

    model = _llama()
    assert head_weight(model) is model.lm_head.weight
    adapted = get_peft_model(_llama(), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    assert head_weight(adapted) is None  # LoRA on the head: the whole logits
    body = get_peft_model(_llama(), LoraConfig(r=2, target_modules=["q_proj"]))
    assert head_weight(body) is body.get_base_model().lm_head.weight
