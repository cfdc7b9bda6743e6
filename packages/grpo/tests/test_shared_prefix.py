"""Prefix sharing: the rows of a prompt group run their prompt once, with per-row log-probs and gradients."""

from __future__ import annotations

import pytest
import torch

from entrepot.grpo import load_config
from entrepot.grpo.algo.sequences import ResponseBatch, response_logprobs
from entrepot.grpo.embedded.shared_prefix import cached_shared_prefix_layout, shared_prefix_layout
from entrepot.grpo.engines.models import build_model

VOCAB = 16

# Three prompt groups, their rows interleaved (a lane or micro-batch may reorder rows), one group of
# a single row, and an empty response.
PROMPTS = [[2, 3, 4], [5, 6], [2, 3, 4], [7, 8, 9, 10], [5, 6], [2, 3, 4]]
RESPONSE_LENGTHS = [4, 3, 0, 5, 2, 6]


def _batch(
    prompts: list[list[int]] = PROMPTS, response_lengths: list[int] = RESPONSE_LENGTHS
) -> ResponseBatch:
    """Rows of these prompts, each with random response tokens of its length (seeded)."""
    gen = torch.Generator().manual_seed(0)
    responses = torch.randint(2, VOCAB, (sum(response_lengths),), generator=gen)
    return ResponseBatch.from_packed(
        torch.tensor([t for p in prompts for t in p]), torch.tensor([len(p) for p in prompts]),
        responses, torch.tensor(response_lengths),
    )  # fmt: skip


def _model(architecture: str) -> torch.nn.Module:
    overrides = ["model.max_positions=64", f"model.architecture={architecture}"]
    if architecture == "qwen2":
        overrides += ["model.num_heads=4", "model.num_kv_heads=2"]  # grouped-query attention
    config = load_config(None, overrides)
    torch.manual_seed(0)
    return build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1)


def _logprobs_and_grads(model: torch.nn.Module, batch: ResponseBatch, packed: bool) -> tuple:
    model.zero_grad(set_to_none=True)
    logp, _ = response_logprobs(model, batch, packed=packed)
    weights = torch.linspace(-1.0, 1.0, logp.numel())
    (logp * weights).sum().backward()
    return logp.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_the_layout_keeps_each_prompt_once() -> None:
    batch = _batch()
    layout = shared_prefix_layout(batch.tokens, batch.prompt_lengths, batch.response_lengths)
    assert layout is not None
    distinct_prompt_tokens = 3 + 2 + 4
    assert layout.num_tokens == distinct_prompt_tokens + sum(RESPONSE_LENGTHS)
    assert layout.keep.numel() == sum(RESPONSE_LENGTHS)
    # Every row's response continues its prompt's positions.
    assert (
        layout.position_ids.max().item()
        == max(len(p) + r for p, r in zip(PROMPTS, RESPONSE_LENGTHS, strict=True)) - 1
    )


def test_rows_without_a_repeated_prompt_keep_the_plain_packed_row() -> None:
    batch = ResponseBatch.from_packed(
        torch.tensor([2, 3, 4, 5]), torch.tensor([2, 2]), torch.tensor([6, 7]), torch.tensor([1, 1])
    )
    assert shared_prefix_layout(batch.tokens, batch.prompt_lengths, batch.response_lengths) is None


@pytest.mark.parametrize("architecture", ["gpt2", "qwen2"])
def test_shared_prompts_give_the_per_row_log_probs_and_gradients(architecture: str) -> None:
    model = _model(architecture)
    batch = _batch()
    seen: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].numel()))
    shared_logp, shared_grads = _logprobs_and_grads(model, batch, packed=True)
    padded_logp, padded_grads = _logprobs_and_grads(model, batch, packed=False)
    hook.remove()
    assert seen[0] == 3 + 2 + 4 + sum(RESPONSE_LENGTHS)  # the shared row: each prompt once
    torch.testing.assert_close(shared_logp, padded_logp, atol=1e-5, rtol=0)
    assert shared_grads.keys() == padded_grads.keys()
    for name, grad in shared_grads.items():
        torch.testing.assert_close(grad, padded_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_a_batch_of_the_same_rows_reuses_its_layout() -> None:
    batch, other = _batch(), _batch()  # equal contents, other tensors (the update re-selects the rows)
    first = cached_shared_prefix_layout(batch.tokens, batch.prompt_lengths, batch.response_lengths)
    again = cached_shared_prefix_layout(other.tokens, other.prompt_lengths, other.response_lengths)
    assert first is not None and again is first
    changed = other.tokens.clone()
    changed[0] += 1  # another prompt
    assert cached_shared_prefix_layout(changed, other.prompt_lengths, other.response_lengths) is not first
