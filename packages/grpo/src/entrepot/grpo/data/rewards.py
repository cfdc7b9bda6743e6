"""Rule-based reward verifiers: a registry of `(response, answer) -> float` functions.

Built in:
- ``exact_match``: 1 if the stripped response equals the answer.
- ``gsm8k``: the number after the last ``####`` (or, failing that, the last number) equals the answer.
- ``boxed_math``: the last ``\\boxed{...}`` equals the answer; uses math-verify when installed,
  otherwise a documented fallback: both sides are compared as numbers (fractions and commas allowed)
  and, if either is not a number, as whitespace-free strings.
- ``format``: 1 if the response has a ``####`` answer line or a ``\\boxed{}``, else 0.
- ``partial_credit``: fraction of answer positions the response gets right (fixed-width answers).

User verifiers register by name (`register_verifier`) or from the config by dotted path
(``reward.custom: {mine: "my_pkg.rewards:score"}``).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction

from entrepot.grpo.errors import RewardError, UnknownRewardError

__all__ = [
    "Verifier",
    "available_verifiers",
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


def score(responses: Sequence[str], answers: Sequence[str], weights: Mapping[str, float]) -> list[float]:
    """Weighted sum of the named verifiers for each (response, answer) pair."""
    if len(responses) != len(answers):
        raise RewardError(f"{len(responses)} responses but {len(answers)} answers")
    fns = [(get_verifier(name), float(w)) for name, w in weights.items()]
    return [sum(w * float(fn(r, a)) for fn, w in fns) for r, a in zip(responses, answers, strict=True)]


# ----------------------------------------------------------------------------------------------
# built-in verifiers

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _to_number(text: str) -> Fraction | None:
    text = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def _same(a: str, b: str) -> bool:
    na, nb = _to_number(a), _to_number(b)
    if na is not None and nb is not None:
        return na == nb
    return re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b)


def exact_match(response: str, answer: str) -> float:
    return float(response.strip() == answer.strip())


def gsm8k(response: str, answer: str) -> float:
    if "####" in response:
        found = _NUMBER.findall(response.rsplit("####", 1)[1])
        candidate = found[0] if found else ""
    else:
        numbers = _NUMBER.findall(response)
        candidate = numbers[-1] if numbers else ""
    reference = answer.rsplit("####", 1)[-1]
    return float(bool(candidate) and _same(candidate, reference))


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in `text` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def boxed_math(response: str, answer: str) -> float:
    boxed = last_boxed(response)
    if boxed is None:
        return 0.0
    reference = last_boxed(answer) or answer
    try:
        from math_verify import parse, verify
    except ImportError:
        return float(_same(boxed, reference))
    return float(verify(parse(f"${reference}$"), parse(f"${boxed}$")))


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
    "boxed_math": boxed_math,
    "format": format_reward,
    "partial_credit": partial_credit,
}.items():
    register_verifier(_name, _fn)
