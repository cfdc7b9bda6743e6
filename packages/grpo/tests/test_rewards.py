"""Rule verifiers, weights and the registry."""

from __future__ import annotations

import pytest

from entrepot.grpo.data import rewards
from entrepot.grpo.errors import RewardError, UnknownRewardError


def test_builtin_verifiers() -> None:
    assert rewards.exact_match(" 62951413 ", "62951413") == 1.0
    assert rewards.gsm8k("so the total is\n#### 1,234", "#### 1234") == 1.0
    assert rewards.gsm8k("I think 41 or 42", "42") == 0.0  # no '####': no credit (see gsm8k_lenient)
    assert rewards.gsm8k_lenient("I think 41 or 42", "42") == 1.0
    assert rewards.gsm8k("#### 41", "42") == 0.0
    assert rewards.boxed_math(r"thus \boxed{\frac{1}{2}}", "0.5") == 1.0
    assert rewards.boxed_math(r"thus \boxed{3/6}", "1/2") == 1.0
    assert rewards.boxed_math("no box", "1") == 0.0
    assert rewards.format_reward("#### 7", "") == 1.0 and rewards.format_reward("7", "") == 0.0
    assert rewards.partial_credit("62951400", "62951413") == pytest.approx(6 / 8)
    assert rewards.partial_credit("629514130", "62951413") == pytest.approx(8 / 9)


def test_last_boxed_handles_nested_braces() -> None:
    assert rewards.last_boxed(r"\boxed{1} then \boxed{\frac{a}{b}}") == r"\frac{a}{b}"


def test_weighted_score() -> None:
    scores = rewards.score(["123", "120"], ["123", "123"], {"exact_match": 1.0, "partial_credit": 0.5})
    assert scores == pytest.approx([1.5, 0.5 * 2 / 3])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1", None])
def test_a_score_that_is_not_a_finite_number_is_refused_naming_the_verifier(bad: object) -> None:
    """Issue 58's rule for environments, for verifiers: a NaN reward would train (a str raised a bare
    ValueError)."""
    name = f"returns_{type(bad).__name__}_{bad}"
    rewards.register_verifier(name, lambda r, a: bad)  # type: ignore[arg-type, return-value]
    with pytest.raises(RewardError, match=rf"reward verifier '{name}' scored .* for the response 'ab'"):
        rewards.score(["ab", "xy"], ["ab", "ab"], {"exact_match": 1.0, name: 1.0})
    assert rewards.score(["ab"], ["ab"], {"exact_match": True}) == [1.0]  # a bool weight or score is a number


def test_registry_refuses_duplicates_and_lists_names_on_miss() -> None:
    with pytest.raises(RewardError, match="already registered"):
        rewards.register_verifier("exact_match", lambda r, a: 0.0)
    with pytest.raises(UnknownRewardError, match=r"known: .*exact_match"):
        rewards.get_verifier("nope")


def test_custom_verifier_by_dotted_path() -> None:
    rewards.resolve_custom({"length_is_three": "tests_support_rewards:length_is_three"})
    assert rewards.score(["abc"], ["x"], {"length_is_three": 2.0}) == [2.0]
    with pytest.raises(RewardError, match="cannot be imported"):
        rewards.resolve_custom({"bad": "no_such_module:fn"})
