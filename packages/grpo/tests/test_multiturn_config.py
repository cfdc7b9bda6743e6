"""The `multiturn` section: what it refuses (naming the key), and the preflight's environment checks."""

from __future__ import annotations

import re

import pytest
from tests_support_envs import CALCULATOR

from entrepot.grpo import load_config
from entrepot.grpo.errors import GRPOConfigError
from entrepot.grpo.run.preflight import check_inputs

VLLM_TP2 = ["engine.rollout=vllm", "engine.train=megatron", "parallel.train.tensor=2",
            "parallel.infer.tensor=2", "resources.num_actor_workers=2"]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["rollout.partial_max_tokens=2"], "rollout.partial_max_tokens"),
        (["algorithm.dynamic_sampling=true"], "algorithm.dynamic_sampling"),
        (["algorithm.mask_truncated=true"], "algorithm.mask_truncated"),
        (["reward.models=[/somewhere]"], "reward.models"),
        (VLLM_TP2, "parallel.infer.tensor"),
        (["data.task=reverse"], "data.task"),  # the calculator answers addition questions
        (["multiturn.max_turns=0"], "multiturn.max_turns"),
        (["multiturn.max_tokens=1"], "multiturn.max_tokens"),
        (["multiturn.max_observation_tokens=0"], "multiturn.max_observation_tokens"),
        (["multiturn.env_concurrency=0"], "multiturn.env_concurrency"),
        (["multiturn.env_timeout_s=0"], "multiturn.env_timeout_s"),
        (["multiturn.environment= "], "multiturn.environment"),
        (["multiturn.env_args={a: [1]}"], "multiturn.env_args.a"),
    ],
)
def test_what_multiturn_does_not_run_with_is_refused_naming_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(GRPOConfigError, match="^" + re.escape(key) + r" \("):
        load_config(None, [*CALCULATOR, *overrides])


def test_the_calculator_config_and_the_single_turn_default_validate() -> None:
    assert load_config(None, CALCULATOR).multiturn.enabled
    assert not load_config(None, []).multiturn.enabled


def test_positions_must_hold_the_prompt_and_a_whole_trajectory() -> None:
    config = load_config(None, [*CALCULATOR, "multiturn.max_tokens=40"])  # 10 + 40 > 32
    with pytest.raises(GRPOConfigError, match=r"^model\.max_positions \(32\).*multiturn\.max_tokens"):
        check_inputs(config)


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ("no_such_module_xyz:Env", r"multiturn\.environment \('no_such_module_xyz:Env'\) cannot be imported"),
        ("entrepot.grpo.multiturn.calculator:Nope", "cannot be imported"),
        ("math:pi", "must be a class or a function"),
        ("nonsense", r"must be a built-in environment \(calculator\)"),
    ],
)
def test_an_environment_that_does_not_load_is_refused_before_the_run(environment: str, message: str) -> None:
    config = load_config(None, [*CALCULATOR, "data.task=addition", f"multiturn.environment={environment}"])
    with pytest.raises(GRPOConfigError, match=message):
        check_inputs(config)
