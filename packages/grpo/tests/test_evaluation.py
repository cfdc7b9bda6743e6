"""Evaluation and the reward-hacking audit: unit tests (pass@k, the format signal, the detectors, the
audit section) and, in the integration tier, one short default run that `rl eval`'s library side
evaluates (parity with the in-run evaluation, bit-identical repeats) and two runs with planted
hackable rewards (tests_support_rewards) that the audit must flag within 20 steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from entrepot.grpo.audit import AuditTracker, answer_shape, format_explained
from entrepot.grpo.audit.detectors import AuditHistory, kl_acceleration, length_blowup
from entrepot.grpo.config import AuditConfig, config_from_dict
from entrepot.grpo.errors import EvalError, GRPOConfigError
from entrepot.grpo.evaluation import EvalSettings, mean_pass_at_k, pass_at_k
from entrepot.grpo.evaluation.summary import check_ks


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0  # n - c < k: always a hit
    assert pass_at_k(4, 1, 1) == 0.25  # pass@1 is the share correct
    assert mean_pass_at_k([0, 4], 4, 2) == 0.5
    with pytest.raises(ValueError, match=r"k \(5\) must be in \[1, samples per prompt \(4\)\]"):
        pass_at_k(4, 1, 5)


def test_k_above_the_samples_and_greedy_with_samples_are_refused() -> None:
    with pytest.raises(EvalError, match=r"^--k 8 is larger than the samples per prompt \(4\)"):
        check_ks([1, 8], 4)
    with pytest.raises(EvalError, match="need a temperature > 0"):
        EvalSettings(num_samples=4, temperature=0.0)


def test_format_explained_is_one_for_a_format_paying_reward_and_low_for_partial_credit() -> None:
    formatted = [True, True, True, False, False, False]
    correct = [False] * 6
    assert format_explained([1, 1, 1, 0, 0, 0], correct, formatted, 0.1, min_rows=3) == 1.0
    honest = format_explained([0.25, 0.5, 0.125, 0.0, 0.375, 0.125], correct, formatted, 0.1, min_rows=3)
    assert honest is not None and honest < 0.3
    assert (
        format_explained([1, 1, 1, 1, 1, 1], correct, [True] * 6, 0.1, min_rows=3) is None
    )  # one side empty
    assert format_explained([1, 1, 1, 0, 0, 0], correct, formatted, 0.1) is None  # under 8 rows a side
    assert answer_shape(" 12345678", "87654321") == 1.0 and answer_shape("1234", "87654321") == 0.0


def test_detectors_read_their_thresholds() -> None:
    config = AuditConfig()
    grows = AuditHistory(length=[8.0] + [13.0] * 5)
    assert length_blowup(grows, config) == (13.0 / 8.0, True)
    assert length_blowup(AuditHistory(length=[8.0] + [9.0] * 5), config)[1] is False
    accel = AuditHistory(kl=[0.05] * 5 + [0.3] * 5)
    assert kl_acceleration(accel, config) == (pytest.approx(6.0), True)
    assert kl_acceleration(AuditHistory(kl=[0.01] * 5 + [0.05] * 5), config)[1] is False  # under kl_floor


def test_tracker_flags_keeps_the_first_step_and_survives_its_state() -> None:
    tracker = AuditTracker(AuditConfig(format_min_rows=2), "reverse")
    rows: dict[str, Any] = {
        "reward": [1, 1, 0, 0],
        "correct": [False] * 4,
        "formatted": [True, True, False, False],
    }
    out = tracker.observe(3, {"reward_mean": 0.5}, **rows)
    assert out["hacking/flag/format_explained"] == 1.0 and out["hacking/first_flag_step"] == 3.0
    again = AuditTracker(AuditConfig(), "reverse")
    again.restore(json.loads(json.dumps(tracker.state())))
    assert again.first == {"format_explained": 3} and again.history.reward == [0.5]


def test_audit_section_errors_name_the_key() -> None:
    with pytest.raises(GRPOConfigError, match=r"^audit\.length_growth \(0\.9\) must be > 1"):
        config_from_dict({"audit": {"length_growth": 0.9}})
    with pytest.raises(GRPOConfigError, match=r"audit\.nope"):
        config_from_dict({"audit": {"nope": 1}})
    assert config_from_dict({"audit": {"enabled": False}}).audit.enabled is False


# -- integration: real runs -------------------------------------------------------------------------

STEPS = 20


def _train(tmp: Path, name: str, **overrides: Any) -> Path:
    from entrepot.grpo import train

    base: dict[str, Any] = {
        "max_steps": STEPS, "eval": {"every": 10, "num_prompts": 64},
        "checkpoint": {"save_every": 10, "keep_last": 0}, "logging": {"samples_every": 0},
    }  # fmt: skip
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value}
    run = tmp / name
    train(config_from_dict(base), run)
    return run


def _metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("eval"), "clean")


@pytest.mark.integration
def test_rl_eval_gives_the_in_run_evaluation_figures(clean_run: Path) -> None:
    from entrepot.grpo.evaluation.standalone import prepare, run

    recorded = {m["step"]: m for m in _metrics(clean_run) if "accuracy" in m}
    assert sorted(recorded) == [10, 20]
    for step in (10, 20):
        result = run(prepare(clean_run, step=step, num_prompts=64))
        assert result.metrics["accuracy"] == recorded[step]["accuracy"]
        assert result.metrics["reward_mean"] == recorded[step]["eval_reward"]  # bit for bit
        head = json.loads(result.eval_file.read_text())
        assert (
            head["model"]["step"] == step
            and head["model"]["run_id"]
            and len(head["model"]["manifest_sha256"]) == 64
        )
        assert head["versions"]["entrepot-grpo"] and head["seeds"] == {"config": 0, "sampling": 0}


@pytest.mark.integration
def test_sampled_evaluation_is_bit_identical_when_repeated(clean_run: Path, tmp_path: Path) -> None:
    from entrepot.grpo.evaluation.standalone import prepare, run

    first, second = (
        run(
            prepare(clean_run, num_prompts=32, samples=4, ks=[1, 4], temperature=1.0, out_dir=tmp_path / name)
        )
        for name in ("a", "b")
    )
    assert first.samples_file.read_bytes() == second.samples_file.read_bytes()
    assert first.metrics == second.metrics and 0 <= first.metrics["pass@1"] <= first.metrics["pass@4"] <= 1
    assert len(first.records) == 128 and {r.end_reason for r in first.records} <= {"eos", "stop", "length"}


@pytest.mark.integration
def test_clean_run_raises_no_flag_and_checkpoints_the_audit(clean_run: Path) -> None:
    records = _metrics(clean_run)
    assert all(m["hacking/flagged"] == 0.0 for m in records), [
        m["step"] for m in records if m["hacking/flagged"]
    ]
    assert "hacking/format_explained" in records[-1] and "hacking/length_blowup" in records[-1]
    state = json.loads((clean_run / "checkpoints" / "step_000010" / "state.json").read_text())
    assert len(state["audit"]["history"]["reward"]) == 10 and state["audit"]["first"] == {}


@pytest.mark.integration
@pytest.mark.parametrize(
    ("plant", "overrides", "detector"),
    [
        ("pays_for_format", {}, "format_explained"),
        ("pays_for_length", {"rollout": {"max_new_tokens": 23}}, "length_blowup"),
    ],
)
def test_planted_hackable_reward_is_flagged_within_20_steps(
    tmp_path: Path, plant: str, overrides: dict[str, Any], detector: str
) -> None:
    reward = {"custom": {plant: f"tests_support_rewards:{plant}"}, "verifiers": {plant: 1.0}}
    run = _train(tmp_path, plant, reward=reward, **overrides)
    flagged = [m["step"] for m in _metrics(run) if m.get(f"hacking/flag/{detector}")]
    assert flagged and flagged[0] <= STEPS, f"{detector} never flagged"


def test_the_hf_engine_needs_an_hf_model() -> None:
    with pytest.raises(
        GRPOConfigError, match=r"^engine\.rollout \('hf'\) must be 'torch' or 'vllm' for the built"
    ):
        config_from_dict({"engine": {"rollout": "hf"}})


def test_an_unknown_format_check_is_refused_before_a_run(tmp_path: Path) -> None:
    from entrepot.grpo.errors import UnknownRewardError
    from entrepot.grpo.run.preflight import check_inputs

    with pytest.raises(UnknownRewardError, match=r"^audit\.format_check \('nope'\) is not a known verifier"):
        check_inputs(config_from_dict({"audit": {"format_check": "nope"}}))
