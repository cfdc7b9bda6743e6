"""The actor's passes on tensors: packed == padded, each aggregation against an independent formula,
the DP=2 gradient against the single-process one on a skewed split, entropy in the gradient."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
from queue import Empty
from typing import Any

import pytest
import torch

from entrepot.grpo import load_config
from entrepot.grpo.algo.optim import build_optimizer
from entrepot.grpo.algo.sequences import ResponseBatch, response_logprobs
from entrepot.grpo.algo.update import UpdateInputs, compute_logprobs, ppo_update
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.engines.models import build_model

VOCAB = 16
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def _config(*overrides: str) -> GRPOConfig:
    return load_config(None, ["model.max_positions=64", "algorithm.grad_clip=null", *overrides])


def _model(config: GRPOConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1)


def _rows(prompt_lengths: list[int], response_lengths: list[int], seed: int = 0) -> ResponseBatch:
    gen = torch.Generator().manual_seed(seed)
    p, r = torch.tensor(prompt_lengths), torch.tensor(response_lengths)
    return ResponseBatch.from_packed(
        torch.randint(2, VOCAB, (int(p.sum()),), generator=gen), p,
        torch.randint(2, VOCAB, (int(r.sum()),), generator=gen), r,
    )  # fmt: skip


# A skewed batch: one long response, three short ones (a 1-vs-3 DP split is 67% off with per-rank means).
SKEWED = dict(prompt_lengths=[5, 4, 6, 5], response_lengths=[40, 2, 3, 2])
ADVANTAGES = torch.tensor([1.0, -0.5, 0.25, -1.0])


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _update(config: GRPOConfig, batch: ResponseBatch, advantages: torch.Tensor, dp: Any = None) -> tuple:
    model = _model(config)
    optimizer, scheduler = build_optimizer(model, config.algorithm, total_steps=10)
    inputs = UpdateInputs(batch, advantages, None, None, [torch.arange(batch.num_rows)])
    metrics = ppo_update(model, optimizer, scheduler, inputs, config.algorithm, config.batching, dp=dp)
    return _grads(model), metrics


def test_response_batch_interleaves_prompts_and_responses() -> None:
    batch = ResponseBatch.from_packed(
        torch.tensor([10, 11, 20]), torch.tensor([2, 1]), torch.tensor([12, 21, 22, 23]), torch.tensor([1, 3])
    )
    assert batch.tokens.tolist() == [10, 11, 12, 20, 21, 22, 23]
    assert batch.predicting_positions().tolist() == [1, 3, 4, 5]  # the token before each response token
    assert batch.select(torch.tensor([1])).tokens.tolist() == [20, 21, 22, 23]
    ids, mask = batch.padded(pad_token_id=0)
    assert ids.tolist() == [[10, 11, 12, 0], [20, 21, 22, 23]] and mask.sum().item() == 7


def test_packed_and_padded_log_probs_agree_on_long_tail_lengths() -> None:
    config = _config()
    model = _model(config)
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 50, (12,), generator=gen).tolist()
    batch = _rows([3] * 12, lengths)
    packed, packed_entropy = response_logprobs(model, batch, packed=True, with_entropy=True)
    padded, padded_entropy = response_logprobs(model, batch, packed=False, with_entropy=True)
    assert packed.shape == (sum(lengths),)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed_entropy, padded_entropy, atol=1e-5, rtol=0)
    assert model.config._attn_implementation == "eager"  # restored after the packed call


def test_packed_training_feeds_no_pad_token() -> None:
    """remove_padding is real: the embedding sees exactly the valid tokens (padded: many more)."""
    seen: list[int] = []
    for packed in (True, False):
        config = _config(f"batching.remove_padding={str(packed).lower()}")
        model = _model(config)
        hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].numel()))
        batch = _rows(**SKEWED)  # type: ignore[arg-type]
        compute_logprobs(model, batch, config.batching, "ref_log_prob")
        hook.remove()
    assert seen[0] == int(batch.lengths.sum())  # packed: 67 real tokens
    assert seen[1] == batch.num_rows * int(batch.lengths.max())  # padded: 4 x 45


def _reference_loss(
    model: torch.nn.Module, batch: ResponseBatch, advantages: torch.Tensor, mode: str
) -> torch.Tensor:
    """The GRPO loss at ratio 1 written out on a padded grid with masks (no code shared with losses.py)."""
    ids, mask = batch.padded(0)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # [B, L-1, V]
    logp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    response = torch.zeros_like(logp)
    for row in range(batch.num_rows):
        start = int(batch.prompt_lengths[row]) - 1
        response[row, start : start + int(batch.response_lengths[row])] = 1.0
    ratio = torch.exp(logp - logp.detach())
    per_token = -ratio * advantages[:, None] * response  # [B, L-1]
    if mode == "token-mean":
        return per_token.sum() / response.sum()
    per_row = per_token.sum(-1)
    if mode == "seq-mean-token-mean":
        per_row = per_row / response.sum(-1)
    return per_row.mean()


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("packed", [True, False])
def test_each_aggregation_matches_the_formula(mode: str, packed: bool) -> None:
    packing = f"batching.remove_padding={str(packed).lower()}"
    config = _config(f"algorithm.loss_agg={mode}", "algorithm.kl_coef=0", packing,
                     "batching.max_tokens_per_micro_batch=64")  # fmt: skip
    batch = _rows(**SKEWED)  # type: ignore[arg-type]
    grads, _ = _update(config, batch, ADVANTAGES)  # micro-batched: 67 tokens under a 64-token budget
    model = _model(config)
    _reference_loss(model, batch, ADVANTAGES, mode).backward()
    for name, expected in _grads(model).items():
        torch.testing.assert_close(grads[name], expected, atol=1e-6, rtol=1e-4, msg=name)


def test_aggregations_give_different_gradients() -> None:
    batch = _rows(**SKEWED)  # type: ignore[arg-type]
    norms = []
    for mode in AGGREGATIONS:
        grads, _ = _update(_config(f"algorithm.loss_agg={mode}", "algorithm.kl_coef=0"), batch, ADVANTAGES)
        norms.append(float(torch.cat([g.flatten() for g in grads.values()]).norm()))
    assert len({round(n, 6) for n in norms}) == 3, norms


def test_entropy_bonus_changes_the_gradient() -> None:
    batch = _rows(**SKEWED)  # type: ignore[arg-type]
    without, m0 = _update(_config("algorithm.kl_coef=0"), batch, ADVANTAGES)
    with_bonus, m1 = _update(_config("algorithm.kl_coef=0", "algorithm.entropy_coef=0.1"), batch, ADVANTAGES)
    assert m0["entropy"] == pytest.approx(m1["entropy"])  # the same policy: the metric is there either way
    diff = max(float((without[n] - with_bonus[n]).abs().max()) for n in without)
    assert diff > 1e-4


@pytest.fixture(scope="module")
def dp2_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, tuple[Any, Any]]]:
    """mode -> rank -> (grads, metrics) of two spawned gloo ranks that run every aggregation mode in
    turn (a fresh process group per mode): the ranks start, and import torch, once for all three."""
    from tests_support_dp import dp_rank_per_mode

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    rendezvous = tmp_path_factory.mktemp("dp2")
    modes = list(AGGREGATIONS)
    init_files = [str(rendezvous / f"{mode}.rendezvous") for mode in modes]
    procs = [ctx.Process(target=dp_rank_per_mode, args=(rank, init_files, modes, queue)) for rank in range(2)]
    for proc in procs:
        proc.start()
    results: dict[str, dict[int, tuple[Any, Any]]] = {mode: {} for mode in modes}
    while sum(len(r) for r in results.values()) < 2 * len(modes):
        try:
            mode, rank, grads, metrics = queue.get(timeout=5)
            results[mode][rank] = (grads, metrics)
        except Empty:
            assert all(p.is_alive() for p in procs), [p.exitcode for p in procs]  # a rank died: fail now
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return results


@pytest.mark.integration  # two spawned gloo ranks
@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_dp2_gradient_equals_single_process_on_a_skewed_split(
    mode: str, dp2_results: dict[str, dict[int, tuple[Any, Any]]]
) -> None:
    results = dp2_results[mode]
    config = _config(
        f"algorithm.loss_agg={mode}", "algorithm.kl_coef=0", "batching.max_tokens_per_micro_batch=48"
    )
    single, single_metrics = _update(config, _rows(**SKEWED), ADVANTAGES)  # type: ignore[arg-type]
    for rank in (0, 1):
        grads, metrics = results[rank]
        for name, expected in single.items():
            torch.testing.assert_close(
                torch.from_numpy(grads[name]), expected, atol=1e-5, rtol=1e-5, msg=f"rank {rank} {name}"
            )
        assert metrics["pg_loss"] == pytest.approx(single_metrics["pg_loss"], abs=1e-6)
    # rank 0 alone needs 1 micro-batch, rank 1 needs fewer than its share would: they agree on a count
    assert results[0][1]["micro_batches"] == results[1][1]["micro_batches"]


def test_a_mean_of_rank_means_would_be_far_off() -> None:
    """Why the global normalizer matters: the per-rank-mean gradient on the same split is >= 50% off."""
    config = _config("algorithm.kl_coef=0")
    batch = _rows(**SKEWED)  # type: ignore[arg-type]
    whole, _ = _update(config, batch, ADVANTAGES)
    parts = [
        _update(config, batch.select(r), ADVANTAGES[r])[0]
        for r in (torch.tensor([0]), torch.tensor([1, 2, 3]))
    ]
    flat = torch.cat([g.flatten() for g in whole.values()])
    naive = torch.cat([((parts[0][n] + parts[1][n]) / 2).flatten() for n in whole])
    assert float((naive - flat).norm() / flat.norm()) > 0.5


def test_config_refuses_a_budget_below_the_longest_sequence() -> None:
    from entrepot.grpo import GRPOConfigError
    from entrepot.grpo.data.checks import check_task_fits

    with pytest.raises(GRPOConfigError, match=r"batching.update.max_tokens \(4\) must be >= 17"):
        check_task_fits(load_config(None, ["batching.update.max_tokens=4"]))
    assert dataclasses.replace(load_config(None, []).batching).limits("update") == (8192, None)
