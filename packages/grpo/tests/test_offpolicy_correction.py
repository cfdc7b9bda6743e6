"""Off-policy correction of the train / inference mismatch: each kind x level against numbers written
out by hand, no gradient through the weights, the loss reweighted on the surrogate only, the
diagnostics, the `algorithm.correction` section (checks, `resolve`, YAML and overrides)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from entrepot.grpo import GRPOConfigError, load_config
from entrepot.grpo.algo.correction import CorrectionOutput, correction_metrics, correction_weights
from entrepot.grpo.algo.losses import policy_loss
from entrepot.grpo.algo.optim import build_optimizer
from entrepot.grpo.algo.sequences import ResponseBatch
from entrepot.grpo.algo.update import UpdateInputs, compute_logprobs, micro_batch_loss, ppo_update
from entrepot.grpo.config import AlgorithmConfig, CorrectionConfig
from entrepot.grpo.config.correction import resolve
from entrepot.grpo.engines.models import build_model

# Three rows of 3, 2 and 1 tokens; token ratios rho_t = exp(old - behaviour) written out, the
# sequence ratios are their products per row: 0.25 * 1 * 3 = 0.75, 1.5 * 0.8 = 1.2, 3.0.
LENGTHS = torch.tensor([3, 2, 1])
RHO = torch.tensor([0.25, 1.0, 3.0, 1.5, 0.8, 3.0])
OLD = torch.tensor([-1.0, -0.5, -2.0, -0.1, -3.0, -0.7])
BEHAVIOUR = OLD - RHO.log()
F, T = False, True

CASES = [
    # kind, level, expected weights, expected masked (cap 2, bounds [0.5, 2])
    ("none", "token", [1.0] * 6, [F] * 6),
    ("none", "sequence", [1.0] * 6, [F] * 6),
    ("tis", "token", [0.25, 1.0, 2.0, 1.5, 0.8, 2.0], [F] * 6),
    ("tis", "sequence", [0.75, 0.75, 0.75, 1.2, 1.2, 2.0], [F] * 6),
    ("mis", "token", [0.0, 1.0, 0.0, 1.0, 1.0, 0.0], [T, F, T, F, F, T]),
    ("mis", "sequence", [1.0, 1.0, 1.0, 1.0, 1.0, 0.0], [F, F, F, F, F, T]),
    ("icepop", "token", [0.0, 1.0, 0.0, 1.5, 0.8, 0.0], [T, F, T, F, F, T]),
]


@pytest.mark.parametrize(("kind", "level", "weights", "masked"), CASES)
def test_weights_match_the_hand_computed_formula(
    kind: str, level: str, weights: list[float], masked: list[bool]
) -> None:
    config = CorrectionConfig(kind=kind, level=level, cap=2.0, low=0.5, high=2.0)  # type: ignore[arg-type]
    out = correction_weights(OLD, BEHAVIOUR, LENGTHS, config)
    torch.testing.assert_close(out.weights, torch.tensor(weights), rtol=1e-5, atol=1e-6)
    assert out.masked.tolist() == masked


def test_log_ratio_is_clamped_to_20_before_exp() -> None:
    # A row of two tokens each 15 nats less likely to the trainer: log rho_i = -30, clamped to -20.
    old = torch.tensor([-16.0, -16.0, -1.0])
    behaviour = torch.tensor([-1.0, -1.0, -31.0])  # the last token: log rho_t = +30, clamped to +20
    lengths = torch.tensor([2, 1])
    seq = correction_weights(old, behaviour, lengths, CorrectionConfig(kind="tis", level="sequence"))
    torch.testing.assert_close(seq.weights, torch.tensor([math.exp(-20.0), math.exp(-20.0), 2.0]))
    icepop = correction_weights(old, behaviour, lengths, CorrectionConfig(kind="icepop", high=1e9))
    torch.testing.assert_close(icepop.weights, torch.tensor([0.0, 0.0, math.exp(20.0)]))
    assert torch.isfinite(icepop.weights).all()


def test_weights_carry_no_gradient() -> None:
    old = OLD.clone().requires_grad_(True)
    behaviour = BEHAVIOUR.clone().requires_grad_(True)
    for kind, level, _, _ in CASES:
        config = CorrectionConfig(kind=kind, level=level)  # type: ignore[arg-type]
        out = correction_weights(old, behaviour, LENGTHS, config)
        assert not out.weights.requires_grad and not out.masked.requires_grad


def test_unresolved_kind_and_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="must be resolved"):
        correction_weights(OLD, BEHAVIOUR, LENGTHS, CorrectionConfig())
    with pytest.raises(ValueError, match="must both be"):
        correction_weights(OLD, BEHAVIOUR[:5], LENGTHS, CorrectionConfig(kind="tis"))
    with pytest.raises(ValueError, match="response_lengths sum"):
        correction_weights(OLD, BEHAVIOUR, torch.tensor([3, 2]), CorrectionConfig(kind="tis"))


def test_metrics_mean_max_and_masked_fraction() -> None:
    tis = correction_weights(OLD, BEHAVIOUR, LENGTHS, CorrectionConfig(kind="tis"))
    metrics = correction_metrics(tis, num_tokens=6)
    assert metrics["offpolicy/is_weight_mean"] == pytest.approx((0.25 + 1 + 2 + 1.5 + 0.8 + 2) / 6)
    assert metrics["offpolicy/is_weight_max"] == pytest.approx(2.0)
    assert metrics["offpolicy/masked_frac"] == 0.0
    mis = correction_weights(OLD, BEHAVIOUR, LENGTHS, CorrectionConfig(kind="mis"))
    metrics = correction_metrics(mis, num_tokens=6)
    assert metrics["offpolicy/is_weight_mean"] == pytest.approx(3 / 6)
    assert metrics["offpolicy/masked_frac"] == pytest.approx(3 / 6)
    assert metrics["offpolicy/is_weight_max"] == 1.0


def test_metrics_of_micro_batches_add_up_to_the_whole() -> None:
    out = correction_weights(OLD, BEHAVIOUR, LENGTHS, CorrectionConfig(kind="icepop"))
    whole = correction_metrics(out, num_tokens=6)
    parts = [
        correction_metrics(CorrectionOutput(out.weights[s], out.masked[s]), num_tokens=6)
        for s in (slice(0, 3), slice(3, 6))
    ]
    for key in ("offpolicy/is_weight_mean", "offpolicy/masked_frac"):
        assert sum(p[key] for p in parts) == pytest.approx(whole[key])
    # exp(log 1.5) need not round back to 1.5 exactly (it gave 1.5000001 on one CPU)
    assert max(p["offpolicy/is_weight_max"] for p in parts) == whole["offpolicy/is_weight_max"]
    assert whole["offpolicy/is_weight_max"] == pytest.approx(1.5)
    # Only the counted tokens (kept rows) enter: the first row alone, weights 0, 1, 0.
    counted = torch.tensor([T, T, T, F, F, F])
    first = correction_metrics(out, num_tokens=3, counted=counted)
    assert first == {
        "offpolicy/is_weight_mean": pytest.approx(1 / 3),
        "offpolicy/masked_frac": pytest.approx(2 / 3),
        "offpolicy/is_weight_max": 1.0,
    }


def test_policy_loss_reweights_the_surrogate_only() -> None:
    # ratio 1.1 everywhere (inside the clip): ppo_clip's l_t = -1.1 A_t; token-mean weights 1/3.
    old = torch.tensor([-1.0, -2.0, -0.5])
    logp = (old + math.log(1.1)).requires_grad_(True)
    advantages = torch.tensor([1.0, -2.0, 0.5])
    weights = torch.full((3,), 1 / 3)
    correction = torch.tensor([0.5, 1.0, 2.0])
    out = policy_loss(logp, old, advantages, weights, correction=correction)
    expected = -(1.1 * 1.0 * 0.5 + 1.1 * -2.0 * 1.0 + 1.1 * 0.5 * 2.0) / 3  # = 0.55 / 3
    assert float(out.loss.detach()) == pytest.approx(expected) == pytest.approx(0.55 / 3)
    assert out.metrics["pg_loss"] == pytest.approx(expected)
    (grad,) = torch.autograd.grad(out.loss, logp)  # d l_t / d logp_t = -r_t A_t, times w_t c_t
    torch.testing.assert_close(grad, torch.tensor([-0.55, 2.2, -1.1]) / 3)

    # The KL and entropy terms keep the plain weights: the difference is the surrogate's alone.
    ref = old - 0.3
    entropy = torch.tensor([0.2, 0.4, 0.6])
    kwargs = dict(ref_logp=ref, kl_coef=0.5, entropy=entropy, entropy_coef=0.1)
    plain = policy_loss(logp, old, advantages, weights, **kwargs)  # type: ignore[arg-type]
    corrected = policy_loss(logp, old, advantages, weights, correction=correction, **kwargs)  # type: ignore[arg-type]
    assert corrected.metrics["kl"] == pytest.approx(plain.metrics["kl"])
    assert corrected.metrics["entropy"] == pytest.approx(plain.metrics["entropy"])
    surrogate_gap = corrected.metrics["pg_loss"] - plain.metrics["pg_loss"]
    assert float((corrected.loss - plain.loss).detach()) == pytest.approx(surrogate_gap)


def _two_rows() -> ResponseBatch:
    return ResponseBatch.from_packed(
        torch.tensor([5, 6, 7]), torch.tensor([2, 1]), torch.tensor([8, 9, 10]), torch.tensor([2, 1])
    )


def _inputs(correction: CorrectionConfig | None, keep: torch.Tensor | None = None) -> UpdateInputs:
    # Row 0: tokens rho 0.25 and 3.0, advantage 1; row 1: one token rho 1.5, advantage -2.
    old = torch.tensor([-1.0, -2.0, -0.5])
    behaviour = old - torch.tensor([0.25, 3.0, 1.5]).log()
    batch = _two_rows()
    return UpdateInputs(
        batch, torch.tensor([1.0, -2.0]), old, None, [torch.arange(2)],
        keep=keep, behaviour_logp=behaviour, correction=correction,
    )  # fmt: skip


def _micro_loss(inputs: UpdateInputs, normalizer: float, num_tokens: float) -> tuple[float, dict[str, float]]:
    picked = torch.tensor([1, 0])  # out of order: the behaviour log-probs must follow the rows
    sub = inputs.batch.select(picked)
    logp = torch.tensor([-0.5, -1.0, -2.0], requires_grad=True)  # = old: ratio 1, l_t = -A_t
    algo = AlgorithmConfig(kl_coef=0.0)
    out = micro_batch_loss(inputs, picked, sub, logp, None, algo, normalizer, num_tokens)
    return float(out.loss.detach()), out.metrics


def test_micro_batch_loss_is_the_uncorrected_per_token_loss_times_w() -> None:
    # Sub-batch tokens (rows 1, 0): l = [2, -1, -1], token-mean weights 1/3, tis w = [1.5, 0.25, 2].
    loss, metrics = _micro_loss(_inputs(CorrectionConfig(kind="tis")), normalizer=3, num_tokens=3)
    assert loss == pytest.approx((2 * 1.5 - 1 * 0.25 - 1 * 2.0) / 3)  # 0.25; uncorrected: 0
    assert metrics["offpolicy/is_weight_mean"] == pytest.approx((1.5 + 0.25 + 2.0) / 3)
    assert metrics["offpolicy/is_weight_max"] == pytest.approx(2.0)
    assert metrics["offpolicy/masked_frac"] == 0.0
    plain, plain_metrics = _micro_loss(_inputs(None), normalizer=3, num_tokens=3)
    assert plain == pytest.approx(0.0)
    assert not any(k.startswith("offpolicy/") for k in plain_metrics)
    none, none_metrics = _micro_loss(_inputs(CorrectionConfig(kind="none")), normalizer=3, num_tokens=3)
    assert none == pytest.approx(0.0) and not any(k.startswith("offpolicy/") for k in none_metrics)


def test_micro_batch_loss_sequence_mask_and_kept_rows() -> None:
    # mis sequence: row 0's product 0.75 is kept, row 1's 1.5 too -> no change; with high = 1.2
    # row 1 (1.5) is dropped: l = [2, -1, -1] x w [0, 1, 1] / 3.
    config = CorrectionConfig(kind="mis", level="sequence", high=1.2)
    loss, metrics = _micro_loss(_inputs(config), normalizer=3, num_tokens=3)
    assert loss == pytest.approx((0 * 2 - 1 - 1) / 3)
    assert metrics["offpolicy/masked_frac"] == pytest.approx(1 / 3)
    assert metrics["offpolicy/is_weight_mean"] == pytest.approx(2 / 3)
    # Row 1 outside `keep`: no loss, and its token counts in no diagnostic (2 kept tokens).
    loss, metrics = _micro_loss(_inputs(config, keep=torch.tensor([T, F])), normalizer=2, num_tokens=2)
    assert loss == pytest.approx((-1 - 1) / 2)
    assert metrics["offpolicy/masked_frac"] == 0.0
    assert metrics["offpolicy/is_weight_mean"] == pytest.approx(1.0)


def test_inputs_are_corrected_only_with_both_behaviour_logp_and_a_kind() -> None:
    assert _inputs(CorrectionConfig(kind="icepop")).corrected
    assert not _inputs(CorrectionConfig(kind="none")).corrected
    assert not _inputs(None).corrected
    inputs = _inputs(CorrectionConfig(kind="tis"))
    inputs.behaviour_logp = None
    assert not inputs.corrected


@pytest.mark.parametrize("kind", ["none", "mis"])
def test_torch_update_reports_the_metrics_only_when_corrected(kind: str) -> None:
    config = load_config(
        None, ["model.max_positions=64", "algorithm.kl_coef=0", "batching.micro_batch_size=1"]
    )
    torch.manual_seed(0)
    model = build_model(config.model, 16, pad_token_id=0, eos_token_id=1)
    optimizer, scheduler = build_optimizer(model, config.algorithm, total_steps=1)
    batch = ResponseBatch.from_packed(
        torch.tensor([5, 6, 7]), torch.tensor([2, 1]), torch.tensor([8, 9, 10]), torch.tensor([2, 1])
    )
    # The rollout sampled tokens 1 and 3 two nats less likely than the policy: rho_t = [e^2, 1, e^2],
    # so mis at token level keeps only the second token.
    behaviour = compute_logprobs(model, batch, config.batching, "old_log_prob") - torch.tensor([2.0, 0, 2])
    inputs = UpdateInputs(
        batch, torch.tensor([1.0, -1.0]), None, None, [torch.arange(2)],
        behaviour_logp=behaviour, correction=CorrectionConfig(kind=kind),  # type: ignore[arg-type]
    )  # fmt: skip
    metrics = ppo_update(model, optimizer, scheduler, inputs, config.algorithm, config.batching)
    offpolicy = {k: v for k, v in metrics.items() if k.startswith("offpolicy/")}
    if kind == "none":
        assert offpolicy == {}
        return
    assert set(offpolicy) == {"offpolicy/is_weight_mean", "offpolicy/masked_frac", "offpolicy/is_weight_max"}
    assert offpolicy["offpolicy/masked_frac"] == pytest.approx(2 / 3)  # summed over two micro-batches
    assert offpolicy["offpolicy/is_weight_mean"] == pytest.approx(1 / 3)
    assert offpolicy["offpolicy/is_weight_max"] == 1.0  # the max of the micro-batches' maxima


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.correction.cap=0.5", r"algorithm.correction.cap \(0.5\) must be >= 1"),
        ("algorithm.correction.low=1.5", r"algorithm.correction.low \(1.5\) must be in \(0, 1\]"),
        ("algorithm.correction.low=0", r"algorithm.correction.low \(0.0\) must be in \(0, 1\]"),
        ("algorithm.correction.high=0.9", r"algorithm.correction.high \(0.9\) must be >= 1"),
        ("algorithm.correction.kind=bogus", r"algorithm.correction.kind \('bogus'\) must be one of"),
        ("algorithm.correction.level=row", r"algorithm.correction.level \('row'\) must be one of"),
        ("algorithm.correction.typo=1", "unknown key 'algorithm.correction.typo'"),
    ],
)
def test_config_refuses_bad_values_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(GRPOConfigError, match=message):
        load_config(None, [override])


def test_config_refuses_icepop_at_sequence_level_and_unknown_kinds() -> None:
    with pytest.raises(GRPOConfigError, match=r"algorithm.correction.level \('sequence'\) must be 'token'"):
        CorrectionConfig(kind="icepop", level="sequence")
    with pytest.raises(GRPOConfigError, match=r"algorithm.correction.kind \('bogus'\)"):
        CorrectionConfig(kind="bogus")  # type: ignore[arg-type]
    with pytest.raises(GRPOConfigError, match=r"algorithm.correction.cap \(0.9\)"):
        CorrectionConfig(cap=0.9)


def test_resolve_picks_none_when_sync_and_token_tis_when_async() -> None:
    auto = CorrectionConfig()
    assert auto.kind is None
    assert resolve(auto, asynchronous=False).kind == "none"
    picked = resolve(auto, asynchronous=True)
    assert (picked.kind, picked.level, picked.cap) == ("tis", "token", 2.0)
    explicit = CorrectionConfig(kind="mis", level="sequence", low=0.8, high=1.25)
    assert resolve(explicit, asynchronous=True) == explicit
    assert resolve(explicit, asynchronous=False) == explicit
    assert resolve(CorrectionConfig(kind="none"), asynchronous=True).kind == "none"


def test_overrides_and_yaml_load_the_nested_section(tmp_path: Path) -> None:
    config = load_config(None, ["algorithm.correction.kind=mis"])
    assert config.algorithm.correction == CorrectionConfig(kind="mis")
    assert load_config().algorithm.correction == CorrectionConfig()
    path = tmp_path / "c.yaml"
    path.write_text("algorithm:\n  correction:\n    kind: tis\n    level: sequence\n    cap: 3\n")
    config = load_config(path, ["algorithm.correction.high=1.5"])
    assert config.algorithm.correction == CorrectionConfig(kind="tis", level="sequence", cap=3.0, high=1.5)
    assert load_config(path, ["algorithm.correction.kind=null"]).algorithm.correction.kind is None
