"""The math verifiers on real GSM8K- and MATH-format strings: one gold reader, math-verify equality."""

from __future__ import annotations

import random
import string
import threading

import pytest

from entrepot.grpo.data import rewards
from entrepot.grpo.data.math_answers import gold_answer
from entrepot.grpo.errors import RewardError

# GSM8K's first training row: the solution, its calculator annotations stripped, ends in '#### 72'.
GSM8K_GOLD = (
    "Natalia sold 48/2 = 24 clips in May.\n"
    "Natalia sold 48+24 = 72 clips altogether in April and May.\n"
    "#### 72"
)
# A MATH-style solution: the answer is the last \boxed{}.
MATH_GOLD = r"Half of the cake is left, so the fraction is $\boxed{\frac{1}{2}}$."


@pytest.mark.parametrize(
    "reference", [GSM8K_GOLD, "#### 72", r"so $\boxed{72}$", "72", "$72$", "72.0", " 72\n"]
)
def test_one_gold_reader_for_every_format(reference: str) -> None:
    assert rewards.boxed_math(r"The answer is $\boxed{72}$.", reference) == 1.0
    assert rewards.gsm8k("48 + 24 = 72\n#### 72", reference) == 1.0


def test_boxed_math_against_gsm8k_gold() -> None:
    # Before: 0, the box was compared with the whole solution string.
    assert rewards.boxed_math(r"She sold $48 + 24 = \boxed{72}$ clips.", GSM8K_GOLD) == 1.0
    assert rewards.boxed_math(r"\boxed{71}", GSM8K_GOLD) == 0.0
    assert rewards.boxed_math("#### 72", GSM8K_GOLD) == 0.0  # no box


@pytest.mark.parametrize(
    ("response", "reference", "expected"),
    [
        (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{0.5}", MATH_GOLD, 1.0),
        (r"\boxed{\dfrac{2}{4}}", MATH_GOLD, 1.0),
        (r"\boxed{\frac{1}{3}}", MATH_GOLD, 0.0),
        (r"\boxed{72.0}", "#### 72", 1.0),
        (r"\boxed{1,000}", "1000", 1.0),
        (r"\boxed{1000}", "#### 1,000", 1.0),
        (r"\boxed{x+1}", r"\boxed{1+x}", 1.0),
        (r"\boxed{\sqrt{2}}", r"$\boxed{\sqrt 2}$", 1.0),
        (r"\boxed{2}", r"$\boxed{\sqrt 2}$", 0.0),
    ],
)
def test_boxed_math_equivalence(response: str, reference: str, expected: float) -> None:
    assert rewards.boxed_math(response, reference) == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("48/2 = 24 in May, 24 + 48 = 72 in all.\n#### 72", 1.0),
        ("#### 72 clips", 1.0),
        ("#### $72", 1.0),
        ("#### \\$72", 1.0),
        ("#### 72.0", 1.0),
        ("#### 71", 0.0),
        ("#### 71, not 72", 0.0),  # the answer line's first word
        ("#### 72. Five were left.", 1.0),
        ("#### \n", 0.0),
        ("They sold 72 clips.", 0.0),  # the number without the marker
        (r"\boxed{72}", 0.0),
    ],
)
def test_gsm8k_needs_the_marker(response: str, expected: float) -> None:
    assert rewards.gsm8k(response, GSM8K_GOLD) == expected


def test_gsm8k_commas_in_numbers() -> None:
    assert rewards.gsm8k("#### 1,000", "#### 1000") == 1.0
    assert rewards.gsm8k("#### 1000", "1,000") == 1.0


def test_random_text_scores_zero_unless_lenient() -> None:
    # A random model's text ends with some number now and then: only the lenient variant pays for that.
    rng = random.Random(0)
    texts = [
        " ".join(
            "".join(rng.choices(string.ascii_lowercase + string.digits, k=rng.randint(1, 4)))
            for _ in range(30)
        )
        + f" {rng.randint(0, 99)}"
        for _ in range(200)
    ]
    answers = [f"#### {rng.randint(0, 99)}" for _ in texts]
    assert sum(rewards.score(texts, answers, {"gsm8k": 1.0})) == 0.0
    assert rewards.gsm8k_lenient("so they sold 72", GSM8K_GOLD) == 1.0
    assert rewards.gsm8k_lenient("so they sold 71", GSM8K_GOLD) == 0.0
    assert rewards.gsm8k_lenient("#### 71, not 72", GSM8K_GOLD) == 0.0  # a marker still decides


@pytest.mark.parametrize("verifier", ["gsm8k", "gsm8k_lenient", "boxed_math"])
def test_unreadable_gold_names_verifier_and_row(verifier: str) -> None:
    answers = ["#### 72", "#### 3", "Natalia sold 48/2 = 24 clips in May."]  # row 2 has no answer
    with pytest.raises(RewardError, match=rf"reward verifier '{verifier}', row 2: gold answer 'Natalia"):
        rewards.score(["#### 72"] * 3, answers, {verifier: 1.0})
    with pytest.raises(RewardError, match=rf"'{verifier}', row 2"):
        rewards.check_gold_answers([verifier], answers)
    rewards.check_gold_answers([verifier], answers[:2])


def test_gsm8k_gold_must_be_a_number() -> None:
    with pytest.raises(RewardError, match=r"row 0: gold answer '#### x\+1' is not a number"):
        rewards.check_gold_answers(["gsm8k"], ["#### x+1"])
    rewards.check_gold_answers(["boxed_math"], ["#### x+1"])  # an expression is a MATH answer


def test_check_gold_answers_skips_other_verifiers() -> None:
    rewards.check_gold_answers({"exact_match": 1.0, "partial_credit": 1.0, "format": 0.1}, ["", "abc"])
    assert rewards.score(["abc"], ["abc"], {"exact_match": 1.0, "partial_credit": 1.0}) == [2.0]


def test_gold_is_read_once() -> None:
    gold_answer.cache_clear()
    rewards.score(["#### 72"] * 8, [GSM8K_GOLD] * 8, {"gsm8k": 1.0, "boxed_math": 1.0})
    info = gold_answer.cache_info()
    # gsm8k reads the gold once for 8 responses; boxed_math finds no box in them and reads nothing
    # (the up-front check takes "72" as a plain number without parsing it)
    assert (info.misses, info.hits) == (1, 7)


def test_scores_from_a_worker_thread() -> None:
    # math-verify's signal-based timeout raises off the main thread; the verifiers turn it off there.
    gold_answer.cache_clear()
    results: list[list[float]] = []
    thread = threading.Thread(
        target=lambda: results.append(
            rewards.score(["#### 72", r"\boxed{72}"], [GSM8K_GOLD, "72"], {"gsm8k": 1.0, "boxed_math": 1.0})
        )
    )
    thread.start()
    thread.join()
    assert results == [[1.0, 1.0]]
