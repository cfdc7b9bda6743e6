"""Rule-based reward verifiers: a registry of `(response, answer) -> float` functions.

Built in:
- ``exact_match``: 1 if the stripped response equals the answer.
- ``gsm8k``: the answer after the response's last ``####`` equals the gold answer; no ``####``, 0.
- ``gsm8k_lenient``: ``gsm8k``, but a response without ``####`` is judged by its last number.
- ``boxed_math``: the response's last ``\\boxed{...}`` equals the gold answer; no box, 0.
- ``format``: 1 if the response has a ``####`` answer line or a ``\\boxed{}``, else 0.
- ``partial_credit``: fraction of answer positions the response gets right (fixed-width answers).
- ``code_tests``: the response's Python code run against the row's tests in the sandbox
  (`code_tests`: the answer is a JSON list of tests; the reward, passed / total).

The math verifiers (``gsm8k``, ``gsm8k_lenient``, ``boxed_math``) read the gold answer one way
(`math_answers.gold_answer`: ``#### 72``, ``\\boxed{72}`` or a plain ``72`` alike) and compare with
math-verify, so ``\\boxed{\\frac{1}{2}}`` earns full credit against ``0.5`` and ``\\boxed{72}`` against
a GSM8K solution ending ``#### 72``. A gold answer they cannot read is a `RewardError` naming the
verifier and the row (`check_gold_answers` finds them before a run).

User verifiers register by name (`register_verifier`) or from the config by dotted path
(``reward.custom: {mine: "my_pkg.rewards:score"}``).
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from entrepot.grpo.data import code_tests as _code
from entrepot.grpo.data.math_answers import (
    LAST_NUMBER,
    PLAIN_NUMBER,
    after_marker,
    gold_answer,
    gold_value,
    last_boxed,
    response_answer,
    same_answer,
)
from entrepot.grpo.errors import RewardError, UnknownRewardError

__all__ = [
    "Verifier",
    "available_verifiers",
    "check_gold_answers",
    "get_verifier",
    "register_verifier",
    "resolve_custom",
    "score",
]

Verifier = Callable[[str, str], float]
_REGISTRY: dict[str, Verifier] = {}


def register_verifier(name: str, fn: Verifier | None = None) -> Callable[[Verifier], Verifier] | Verifier:
    """Register `fn` under `name` (also usable as a decorator); a taken name is an error."""

    def add(f: Verifier) -> Verifier:
        if name in _REGISTRY and _REGISTRY[name] is not f:
            raise RewardError(f"reward verifier {name!r} is already registered; pick another name")
        if not callable(f):
            raise RewardError(f"reward verifier {name!r} must be callable, got {type(f).__name__}")
        _REGISTRY[name] = f
        return f

    return add(fn) if fn is not None else add


def get_verifier(name: str) -> Verifier:
    """The verifier registered as `name`; a miss lists the known names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownRewardError(
            f"unknown reward verifier {name!r}; known: {', '.join(sorted(_REGISTRY))}"
        ) from None


def available_verifiers() -> list[str]:
    """Sorted names of every registered verifier."""
    return sorted(_REGISTRY)


def resolve_custom(custom: Mapping[str, str]) -> None:
    """Import and register user verifiers given as ``name -> "pkg.module:function"`` (or dotted)."""
    for name, target in custom.items():
        module_name, _, attr = target.partition(":") if ":" in target else target.rpartition(".")
        if not module_name or not attr:
            raise RewardError(f"reward.custom.{name} ({target!r}) must look like 'package.module:function'")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise RewardError(f"reward.custom.{name} ({target!r}) cannot be imported: {exc}") from exc
        if _REGISTRY.get(name) is not fn:
            register_verifier(name, fn)


def score(
    responses: Sequence[str], answers: Sequence[str], weights: Mapping[str, float],
    scored: Mapping[str, Sequence[float]] | None = None,
) -> list[float]:  # fmt: skip
    """Weighted sum of the named verifiers for each (response, answer) pair.

    A verifier with a ``score_batch`` method (``code_tests``) scores the whole batch in one call; one in
    `scored` is not called again (its scores of these rows, e.g. from the reward worker's one run).
    """
    if len(responses) != len(answers):
        raise RewardError(f"{len(responses)} responses but {len(answers)} answers")
    check_gold_answers(weights, answers)
    totals = [0.0] * len(responses)
    for name, weight in weights.items():
        fn = get_verifier(name)
        if scored is not None and name in scored:
            values: Sequence[object] = scored[name]
        elif hasattr(fn, "score_batch"):
            values = fn.score_batch(responses, answers)
        else:
            values = [fn(r, a) for r, a in zip(responses, answers, strict=True)]
        for i, (value, response) in enumerate(zip(values, responses, strict=True)):
            totals[i] += float(weight) * _finite(name, value, response)
    return totals


def _finite(name: str, value: object, response: str) -> float:
    """A verifier's score as a float; `RewardError` naming the verifier, the score and the response
    when it is not a finite number (a NaN would train, and a str would fail as a bare ValueError)."""
    try:
        score = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        score = math.nan
    if isinstance(value, str) or not math.isfinite(score):
        raise RewardError(
            f"reward verifier {name!r} scored {value!r} for the response {response[:40]!r}: a score must "
            "be a finite number"
        )
    return score


# The math verifiers, and whether their gold answers must be numbers.
_GOLD_NUMERIC = {"gsm8k": True, "gsm8k_lenient": True, "boxed_math": False}


def check_gold_answers(verifiers: Iterable[str], answers: Sequence[str]) -> None:
    """Raise `RewardError` naming the verifier and the row if a math verifier in `verifiers` cannot
    read one of `answers` (rows count from 0); other verifiers take any answer. Each answer is read
    once (cached), so a scoring step after this check reads nothing again. ``code_tests`` answers must
    be JSON lists of tests (`code_tests.check_tests`)."""
    for name in verifiers:
        if name == _code.CODE_TESTS:
            _code.check_tests(answers)
        numeric = _GOLD_NUMERIC.get(name)
        if numeric is None:
            continue
        for row, answer in enumerate(answers):
            if PLAIN_NUMBER.fullmatch(gold_value(answer)):
                continue  # a plain number always reads as one: no parse (GSM8K's 7.5k answers in ms)
            try:
                gold_answer(answer, numeric=numeric)
            except RewardError as exc:
                raise RewardError(f"reward verifier {name!r}, row {row}: {exc}") from None


# ----------------------------------------------------------------------------------------------
# built-in verifiers


def exact_match(response: str, answer: str) -> float:
    return float(response.strip() == answer.strip())


def gsm8k(response: str, answer: str) -> float:
    """1 if the answer after the response's last ``####`` equals the gold answer; no ``####``, 0."""
    span = after_marker(response)
    return _math_score(span, answer) if span is not None else 0.0


def gsm8k_lenient(response: str, answer: str) -> float:
    """`gsm8k`, but a response without ``####`` is judged by its last number (a random model scores a
    few percent this way: use it for eval of models not trained on the ``####`` format, not as a reward)."""
    span = after_marker(response)
    if span is None:
        numbers = LAST_NUMBER.findall(response)
        span = numbers[-1] if numbers else ""
    return _math_score(span, answer)


def _math_score(span: str, answer: str) -> float:
    return float(same_answer(gold_answer(answer, numeric=True), response_answer(span)))


def boxed_math(response: str, answer: str) -> float:
    """1 if the response's last ``\\boxed{...}`` equals the gold answer (math-verify); no box, 0."""
    boxed = last_boxed(response)
    if boxed is None:
        return 0.0
    return float(same_answer(gold_answer(answer), response_answer(boxed, latex=True)))


def format_reward(response: str, answer: str) -> float:
    return float(bool(re.search(r"####\s*\S", response)) or last_boxed(response) is not None)


def partial_credit(response: str, answer: str) -> float:
    """Fraction of answer positions matched; extra characters past the answer cost as misses."""
    if not answer:
        return float(not response)
    hits = sum(1 for r, a in zip(response, answer, strict=False) if r == a)
    return hits / max(len(answer), len(response))


for _name, _fn in {
    "exact_match": exact_match,
    "gsm8k": gsm8k,
    "gsm8k_lenient": gsm8k_lenient,
    "boxed_math": boxed_math,
    "format": format_reward,
    "partial_credit": partial_credit,
}.items():
    register_verifier(_name, _fn)
register_verifier(_code.CODE_TESTS, _code.code_tests)
