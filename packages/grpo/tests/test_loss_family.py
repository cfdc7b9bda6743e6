"""The loss family (PPO-clip, GSPO, CISPO), Dr. GRPO's aggregation and DAPO's length treatment, each
against a formula written out here by hand (python floats, or a padded grid with masks): no code shared
with `entrepot.grpo.algo`."""

from __future__ import annotations

import math

import pytest
import torch

from entrepot.grpo import load_config
from entrepot.grpo.algo.losses import loss_normalizer, policy_loss, token_weights
from entrepot.grpo.algo.optim import build_optimizer
from entrepot.grpo.algo.sequences import ResponseBatch
from entrepot.grpo.algo.shaping import overlong_penalty, truncated, truncated_rows
from entrepot.grpo.algo.update import UpdateInputs, compute_logprobs, ppo_update
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.engines.models import build_model
from entrepot.grpo.errors import GRPOConfigError

LOSSES = ("ppo_clip", "gspo", "cispo")

# Two responses of 2 and 1 tokens; ratios 1.5, 0.6 (row 0) and 1.1 (row 1); clip [0.8, 1.2].
LOGP = [-1.0, -2.0, -0.5]
OLD = [-1.0 - math.log(1.5), -2.0 - math.log(0.6), -0.5 - math.log(1.1)]
ADV = [1.0, 1.0, -2.0]  # per token: row 0's advantage 1, row 1's -2
ROWS = [0, 0, 1]
LENGTHS = [2, 1]
LOW, HIGH = 0.2, 0.2


def _clip(x: float) -> float:
    return min(max(x, 1 - LOW), 1 + HIGH)


def _by_hand(loss: str) -> tuple[list[float], list[float]]:
    """Per-token loss l_t and d(sum_t l_t w_t)/d logp_t with w = 1 (token sums), in python floats."""
    values, grads = [], []
    for t, (lp, old, adv, row) in enumerate(zip(LOGP, OLD, ADV, ROWS, strict=True)):
        r = math.exp(lp - old)
        if loss == "ppo_clip":
            unclipped, clipped = r * adv, _clip(r) * adv
            values.append(-min(unclipped, clipped))
            grads.append(-r * adv if unclipped <= clipped else 0.0)
        elif loss == "gspo":
            tokens = [i for i, other in enumerate(ROWS) if other == row]
            s = math.exp(sum(LOGP[i] - OLD[i] for i in tokens) / len(tokens))
            unclipped, clipped = s * adv, _clip(s) * adv
            values.append(-min(unclipped, clipped))
            # every token of the row carries l_i: d/d logp_t of len(row) x l_i = len(row) x (-A s / len(row))
            grads.append(-adv * s if unclipped <= clipped else 0.0)
        else:  # cispo: -sg(clip(r)) A logp
            values.append(-_clip(r) * adv * lp)
            grads.append(-_clip(r) * adv)
        del t
    return values, grads


@pytest.mark.parametrize("loss", LOSSES)
def test_each_surrogate_matches_its_formula_by_hand(loss: str) -> None:
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    out = policy_loss(
        logp, torch.tensor(OLD, dtype=torch.float64), torch.tensor(ADV, dtype=torch.float64),
        torch.ones(3, dtype=torch.float64), response_lengths=torch.tensor(LENGTHS), loss=loss,  # type: ignore[arg-type]
        clip_low=LOW, clip_high=HIGH,
    )  # fmt: skip
    out.loss.backward()
    values, grads = _by_hand(loss)
    assert out.metrics["pg_loss"] == pytest.approx(sum(values), abs=1e-12)
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx(grads, abs=1e-12)


def test_the_three_surrogates_differ_off_policy() -> None:
    values = [sum(_by_hand(loss)[1]) for loss in LOSSES]
    assert len({round(v, 9) for v in values}) == 3, values


def test_cispo_keeps_the_gradient_of_tokens_ppo_clips() -> None:
    """Token 0 (ratio 1.5 > 1.2, A > 0) has no PPO gradient; CISPO keeps it, weighted by 1.2."""
    assert _by_hand("ppo_clip")[1][0] == 0.0
    assert _by_hand("cispo")[1][0] == pytest.approx(-1.2)


def test_dr_grpo_aggregation_divides_token_sums_by_a_constant() -> None:
    lengths = torch.tensor([3, 1, 2])
    normalizer = loss_normalizer(lengths, "seq-mean-token-sum-norm", horizon=8)
    assert normalizer == 3 * 8
    weights = token_weights(lengths, "seq-mean-token-sum-norm", normalizer)
    assert weights.tolist() == pytest.approx([1 / 24] * 6)


def test_dapo_overlong_penalty_by_hand() -> None:
    # budget 20, buffer 5: free up to 15 tokens, then -penalty x (len - 15) / 5
    got = overlong_penalty(torch.tensor([10, 15, 16, 18, 20]), budget=20, buffer=5, penalty=0.5)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.1, -0.3, -0.5])
    assert overlong_penalty(torch.tensor([20]), budget=20, buffer=0, penalty=1.0).tolist() == [0.0]


def test_truncated_means_at_the_budget_without_a_stop_token() -> None:
    lengths, last = torch.tensor([4, 4, 3]), torch.tensor([7, 1, 7])  # EOS = 1
    assert truncated(lengths, last, budget=4, stop_token_ids=(1,)).tolist() == [True, False, False]
    batch = ResponseBatch.from_packed(torch.tensor([5, 5, 6]), torch.tensor([2, 1]),
                                      torch.tensor([9, 9, 7, 3, 1]), torch.tensor([3, 2]))  # fmt: skip
    assert truncated_rows(batch, budget=3, stop_token_ids=(1,)).tolist() == [True, False]


# -- the torch engine's update against the loss written out on a padded grid ----------------------------

VOCAB = 16
PROMPTS, RESPONSES = [5, 4, 6, 5], [7, 2, 3, 2]
ADVANTAGES = torch.tensor([1.0, -0.5, 0.25, -1.0])
HORIZON = 9


def _config(*overrides: str) -> GRPOConfig:
    return load_config(None, ["model.max_positions=64", "algorithm.grad_clip=null", "algorithm.kl_coef=0",
                              "algorithm.clip_low=0.1", "algorithm.clip_high=0.1", *overrides])  # fmt: skip


def _model(config: GRPOConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1)


def _batch() -> ResponseBatch:
    gen = torch.Generator().manual_seed(0)
    p, r = torch.tensor(PROMPTS), torch.tensor(RESPONSES)
    return ResponseBatch.from_packed(torch.randint(2, VOCAB, (int(p.sum()),), generator=gen), p,
                                     torch.randint(2, VOCAB, (int(r.sum()),), generator=gen), r)  # fmt: skip


def _old_shift() -> torch.Tensor:
    """A fixed per-token shift of the old log-probs, so ratios spread over [0.7, 1.4] and some clip."""
    return torch.linspace(-0.35, 0.35, sum(RESPONSES))


def _written_out(
    model: torch.nn.Module, batch: ResponseBatch, loss: str, agg: str, keep: list[bool]
) -> torch.Tensor:
    """The loss on a padded [B, L] grid with a response mask, every formula spelled out."""
    ids, mask = batch.padded(0)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    logp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    response = torch.zeros_like(logp)
    old = torch.zeros_like(logp)
    shift, at = _old_shift(), 0
    for row in range(batch.num_rows):
        start, n = int(batch.prompt_lengths[row]) - 1, int(batch.response_lengths[row])
        response[row, start : start + n] = 1.0 if keep[row] else 0.0
        old[row, start : start + n] = logp[row, start : start + n].detach() - shift[at : at + n]
        at += n
    adv = ADVANTAGES[:, None]
    log_ratio = (logp - old) * (response > 0)
    if loss == "ppo_clip":
        r = log_ratio.exp()
        per_token = -torch.minimum(r * adv, r.clamp(0.9, 1.1) * adv)
    elif loss == "gspo":
        s = (log_ratio.sum(-1) / torch.tensor(RESPONSES)).exp()[:, None]  # [B, 1]
        per_token = -torch.minimum(s * adv, s.clamp(0.9, 1.1) * adv).expand_as(logp)
    else:
        r = log_ratio.detach().exp()
        per_token = -r.clamp(0.9, 1.1) * adv * logp
    per_token = per_token * response
    kept = torch.tensor(keep)
    if agg == "token-mean":
        return per_token.sum() / response.sum()
    per_row = per_token.sum(-1)
    if agg == "seq-mean-token-mean":
        return (per_row / torch.tensor(RESPONSES))[kept].sum() / kept.sum()
    return per_row.sum() / (kept.sum() * HORIZON)  # seq-mean-token-sum-norm


def _engine_grads(
    config: GRPOConfig, batch: ResponseBatch, keep: list[bool] | None
) -> dict[str, torch.Tensor]:
    model = _model(config)
    old = compute_logprobs(model, batch, config.batching, "old_log_prob") - _old_shift()
    optimizer, scheduler = build_optimizer(model, config.algorithm, total_steps=10)
    inputs = UpdateInputs(batch, ADVANTAGES, old, None, [torch.arange(batch.num_rows)], horizon=HORIZON,
                          keep=None if keep is None else torch.tensor(keep))  # fmt: skip
    ppo_update(model, optimizer, scheduler, inputs, config.algorithm, config.batching)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize(
    ("loss", "agg"),
    [("ppo_clip", "token-mean"), ("gspo", "seq-mean-token-mean"), ("cispo", "token-mean"),
     ("ppo_clip", "seq-mean-token-sum-norm")],
    ids=["ppo_clip", "gspo", "cispo", "dr_grpo"],
)  # fmt: skip
def test_the_torch_engine_update_matches_the_written_out_loss(loss: str, agg: str, packed: bool) -> None:
    packing = f"batching.remove_padding={str(packed).lower()}"
    config = _config(f"algorithm.loss={loss}", f"algorithm.loss_agg={agg}", packing,
                     "batching.max_tokens_per_micro_batch=20")  # fmt: skip
    batch = _batch()
    grads = _engine_grads(config, batch, None)  # micro-batched: 37 tokens under a 20-token budget
    model = _model(config)
    _written_out(model, batch, loss, agg, [True] * batch.num_rows).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None
        torch.testing.assert_close(grads[name], param.grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_masked_rows_have_no_loss_and_leave_the_normaliser(agg: str) -> None:
    """DAPO overlong filtering: a kept-out row neither trains nor counts in the mean."""
    config = _config(f"algorithm.loss_agg={agg}")
    batch, keep = _batch(), [True, False, True, True]
    grads = _engine_grads(config, batch, keep)
    model = _model(config)
    _written_out(model, batch, "ppo_clip", agg, keep).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None
        torch.testing.assert_close(grads[name], param.grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["algorithm.loss=reinforce"], "algorithm.loss"),
        (["algorithm.loss_agg=seq-sum"], "algorithm.loss_agg"),
        (["algorithm.loss_horizon=0"], "algorithm.loss_horizon"),
        (["algorithm.mask_truncated=true", "rollout.stop_on_eos=false"], "algorithm.mask_truncated"),
        (["reward.overlong_buffer=-1"], "reward.overlong_buffer"),
        (["reward.overlong_penalty=-1"], "reward.overlong_penalty"),
    ],
)
def test_bad_loss_settings_are_refused_naming_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(GRPOConfigError, match=key):
        load_config(None, overrides)


def test_an_overlong_buffer_as_long_as_the_budget_is_refused() -> None:
    from entrepot.grpo.data.checks import check_task_fits

    with pytest.raises(GRPOConfigError, match=r"reward\.overlong_buffer"):
        check_task_fits(load_config(None, ["rollout.max_new_tokens=8", "reward.overlong_buffer=8"]))
    check_task_fits(load_config(None, ["rollout.max_new_tokens=8", "reward.overlong_buffer=4"]))
