"""Math answers read and compared with Hugging Face's math-verify, for the math reward verifiers.

One reader for every gold answer (`gold_answer`): the word after the last GSM8K ``####`` marker, else
the last ``\\boxed{...}``, else the whole reference, parsed as LaTeX (so ``72``, ``$72$``, ``1,000``,
``\\frac{1}{2}`` and ``0.5`` all read as numbers). A model's answer is parsed by math-verify from the
span its verifier picks (`response_answer`), and `same_answer` asks math-verify whether the two are
equal (numeric and symbolic equivalence: ``0.5`` = ``\\frac{1}{2}``, ``72.0`` = ``72``).

math-verify bounds each parse and comparison with ``signal.alarm``, which only works on the main
thread; elsewhere (rewards scored in worker threads) the bound is off, since asking for it there
raises instead of scoring. math-verify is imported on first use: it imports sympy (about a second),
which runs without a math verifier do not need.
"""

from __future__ import annotations

import re
import threading
from functools import cache, lru_cache
from typing import Any

from entrepot.grpo.errors import RewardError

__all__ = [
    "LAST_NUMBER",
    "PLAIN_NUMBER",
    "MathAnswer",
    "after_marker",
    "gold_answer",
    "gold_value",
    "last_boxed",
    "response_answer",
    "same_answer",
]

MathAnswer = tuple[Any, ...]
"""What math-verify parsed: sympy expressions (empty when nothing could be read)."""

_TIMEOUT_S = 5  # math-verify's own default, per parse and per comparison


@cache
def _extraction(latex_only: bool) -> list[Any]:
    """math-verify's extraction targets: LaTeX only, or LaTeX and plain expressions (``72 clips``)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig()] if latex_only else [LatexExtractionConfig(), ExprExtractionConfig()]


def _parse(text: str, *, latex_only: bool) -> MathAnswer:
    from math_verify import parse

    return tuple(
        parse(text, _extraction(latex_only), fallback_mode="no_fallback", parsing_timeout=_timeout())
    )


def _timeout() -> int | None:
    """math-verify's signal-based time bound: on the main thread only (see the module docstring)."""
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


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


def after_marker(text: str) -> str | None:
    """The answer after the last GSM8K ``####`` marker in `text`: its first word, since GSM8K's answer
    line holds one number and a model's may go on (``#### 71, not 72`` answers 71); None without a
    marker, "" with nothing after it. A dollar sign before the number is dropped (``#### $72``)."""
    if "####" not in text:
        return None
    words = text.rsplit("####", 1)[1].replace("\\$", "$").lstrip("$ \t\n").split()
    return words[0] if words else ""


def gold_value(reference: str) -> str:
    """The text of the gold answer in `reference`: after GSM8K's ``####``, else the last ``\\boxed{}``,
    else the whole reference (dollar signs and spaces stripped)."""
    marked = after_marker(reference)
    value = marked if marked is not None else last_boxed(reference)
    return (value if value is not None else reference).strip().strip("$").strip()


PLAIN_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
"""A gold value math-verify always reads as a number (``72``, ``1,000``, ``-3.5``): checks skip its parse."""


@lru_cache(maxsize=2**16)  # each answer is scored once per sample of its prompt, every epoch
def gold_answer(reference: str, *, numeric: bool = False) -> MathAnswer:
    """The gold answer in `reference`, read the same way for every math verifier.

    Args:
        reference: a dataset answer: a GSM8K solution ending in ``#### 72``, a MATH solution with a
            ``\\boxed{...}``, or a plain value (``72``, ``$\\frac{1}{2}$``, ``1,000``).
        numeric: also require a number (the GSM8K verifiers).

    Raises:
        RewardError: nothing math-verify can read (or, with `numeric`, not a number); the message
            quotes the reference.
    """
    try:
        return _gold_parsed(gold_value(reference), numeric)
    except RewardError as exc:
        raise RewardError(f"gold answer {reference!r} {exc}") from None


@lru_cache(maxsize=2**16)  # one parse per distinct value: a dataset's answers repeat (GSM8K: ~1 in 3)
def _gold_parsed(value: str, numeric: bool) -> MathAnswer:
    parsed = _parse(f"${value}$", latex_only=True)
    if not parsed:
        raise RewardError(f"has no math answer math-verify can read ({value!r})")
    if numeric and not any(getattr(expr, "is_number", False) for expr in parsed):
        raise RewardError(f"is not a number ({value!r} reads as {parsed[0]})")
    return parsed


@lru_cache(maxsize=2**16)  # the samples of a prompt often give the same answer
def response_answer(span: str, *, latex: bool = False) -> MathAnswer:
    """A model's answer in `span` (the text its verifier picked), parsed by math-verify.

    `latex`: `span` is LaTeX (a ``\\boxed{}``'s content); otherwise it is text that may hold LaTeX
    (``$\\frac{1}{2}$``) or a plain expression (``72``, ``1,234``, ``72.``).
    """
    return _parse(f"${span}$", latex_only=True) if latex else _parse(span, latex_only=False)


def same_answer(gold: MathAnswer, answer: MathAnswer) -> bool:
    """Whether math-verify finds `answer` equal to `gold` (False when `answer` is empty)."""
    from math_verify import verify

    return bool(answer) and verify(list(gold), list(answer), timeout_seconds=_timeout())


LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
"""A number as GSM8K writes it (``1,234``, ``-3.5``, ``3/4``): the lenient verifier's fallback."""
