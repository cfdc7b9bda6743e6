"""Small Python function-writing problems with hidden tests: the ``code_functions`` task.

Templates (add a constant, reverse a string, the largest of a list, count vowels, ...) with
parametrised function names and constants make a fixed set of a few hundred problems, e.g.::

    Write a Python function add_7(x) that returns x plus 7.
    -> ["assert add_7(0) == 7", "assert add_7(-3) == 4", "assert add_7(100) == 107"]

Each problem has 2-4 hidden tests, MBPP ``test_list`` style: the gold answer is their JSON list, read by
the ``code_tests`` verifier, which runs the response's program against them in the sandbox. The
expected values are computed from a reference solution per template (`CodeProblem.solution`), so the
reference passes its own tests by construction. The set is fixed (not seeded by the run): every 8th
problem of a fixed shuffle is held out for evaluation and never trained on. The prompts are printable
ASCII: a local model's tokenizer reads them, and the built decoder reads them with a character
tokenizer over `CODE_ALPHABET`.
"""

from __future__ import annotations

import functools
import json
import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from entrepot.grpo.data.tasks import Sample

__all__ = ["CODE_ALPHABET", "HELD_OUT_EVERY", "CodeProblem", "code_problems", "code_split"]

CODE_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \t\n"
"""The character tokenizer's alphabet for this task on the built decoder: what a program is written in."""
HELD_OUT_EVERY = 8  # every 8th problem of the fixed shuffle is held out
_SPLIT_SEED = 54  # the shuffle is the task's, not the run's: the held-out set is the same for every seed


@dataclass(frozen=True)
class CodeProblem:
    """One problem: its prompt, its hidden tests (Python ``assert`` sources) and a reference solution."""

    prompt: str
    tests: tuple[str, ...]
    solution: str

    def sample(self) -> Sample:
        """The problem as a prompt and its gold answer: the tests as a JSON list (what code_tests reads)."""
        return Sample(prompt=self.prompt, answer=json.dumps(list(self.tests)))


@dataclass(frozen=True)
class _Template:
    """Problems of one kind: names (formatted with {k}), constants k, what to write, the reference
    body (formatted with {name} and {k}) and the test inputs (a function of k)."""

    names: tuple[str, ...]
    ks: Sequence[Any]
    signature: str  # the arguments, e.g. "x" or "a, b"
    task: str  # what the function returns, formatted with {k}
    body: str
    inputs: Callable[[Any], list[tuple[Any, ...]]]


def _fixed(*inputs: tuple[Any, ...]) -> Callable[[Any], list[tuple[Any, ...]]]:
    return lambda k: list(inputs)


_LISTS = _fixed(([3, 1, 2],), ([5],), ([-4, -9, -1],), ([7, 7, 2, 10],))
_TEXTS = _fixed(("hello",), ("",), ("Banana split",), ("racecar",))
_TEMPLATES = (
    _Template(("add_{k}", "plus_{k}", "increment_by_{k}"), range(1, 31), "x", "x plus {k}",
              "return x + {k}", _fixed((0,), (5,), (-3,), (100,))),
    _Template(("times_{k}", "multiply_by_{k}"), range(2, 21), "x", "x multiplied by {k}",
              "return x * {k}", _fixed((0,), (3,), (-2,), (11,))),
    _Template(("power_{k}", "raise_to_{k}"), range(2, 7), "x", "x raised to the power {k}",
              "return x ** {k}", _fixed((2,), (3,), (-2,), (0,))),
    _Template(("divisible_by_{k}", "is_multiple_of_{k}"), range(2, 16), "n",
              "True if the integer n is divisible by {k}, else False", "return n % {k} == 0",
              lambda k: [(3 * k,), (3 * k + 1,), (0,), (7 * k - 1,)]),
    _Template(("mod_{k}", "remainder_{k}"), range(2, 13), "n", "the remainder of n divided by {k}",
              "return n % {k}", lambda k: [(k + 1,), (5 * k,), (17,), (2 * k - 1,)]),
    _Template(("clamp_{k}", "cap_at_{k}"), range(5, 55, 5), "n",
              "n limited to the range 0 to {k} (below 0 gives 0, above {k} gives {k})",
              "return max(0, min({k}, n))", lambda k: [(-3,), (k + 4,), (k // 2,), (k,)]),
    _Template(("add", "add_numbers", "sum_two", "plus", "total"), (0,), "a, b", "the sum of a and b",
              "return a + b", _fixed((2, 3), (-1, 1), (0, 0), (10, 32))),
    _Template(("distance", "abs_diff"), (0,), "a, b", "the absolute difference of a and b",
              "return abs(a - b)", _fixed((2, 9), (9, 2), (-3, 3), (4, 4))),
    _Template(("reverse", "reverse_string", "backwards", "flip_text"), (0,), "s", "the string s reversed",
              "return s[::-1]", _TEXTS),
    _Template(("is_palindrome", "palindrome"), (0,), "s", "True if the string s reads the same backwards",
              "return s == s[::-1]", _fixed(("racecar",), ("hello",), ("",), ("abba",))),
    _Template(("to_upper", "shout"), (0,), "s", "the string s in upper case", "return s.upper()", _TEXTS),
    _Template(("count_vowels", "vowel_count", "num_vowels"), (0,), "s",
              "how many vowels (a, e, i, o, u, either case) the string s has",
              "return sum(c in 'aeiouAEIOU' for c in s)", _TEXTS),
    _Template(("count_words", "word_count"), (0,), "s", "how many words (split on spaces) the string s has",
              "return len(s.split())", _fixed(("one two three",), ("",), ("hi",), ("a  b",))),
    _Template(("count_{k}", "occurrences_of_{k}"), string.ascii_lowercase, "s",
              "how many times the letter '{k}' appears in the string s", "return s.count('{k}')",
              lambda k: [(f"{k}b{k}",), (k * 3,), ("xyz" + k,), ("",)]),
    _Template(("first_{k}", "head_{k}"), range(1, 11), "s", "the first {k} characters of the string s",
              "return s[:{k}]", _fixed(("abcdefghijkl",), ("hi",), ("",), ("entrepot grpo",))),
    _Template(("repeat_{k}_times", "copies_{k}"), range(2, 7), "s", "the string s repeated {k} times",
              "return s * {k}", _fixed(("ab",), ("",), ("x",))),
    _Template(("largest", "max_of_list", "biggest", "list_max"), (0,), "xs",
              "the largest number in the non-empty list xs", "return max(xs)", _LISTS),
    _Template(("smallest", "min_of_list", "list_min", "lowest"), (0,), "xs",
              "the smallest number in the non-empty list xs", "return min(xs)", _LISTS),
    _Template(("sum_list", "list_total", "add_all"), (0,), "xs", "the sum of the numbers in the list xs",
              "return sum(xs)", _fixed(([1, 2, 3],), ([],), ([-5, 5, 10],))),
    _Template(("last", "last_item"), (0,), "xs", "the last element of the non-empty list xs",
              "return xs[-1]", _LISTS),
    _Template(("squares", "square_all"), (0,), "xs", "a list of the squares of the numbers in xs",
              "return [x * x for x in xs]", _fixed(([1, 2, 3],), ([],), ([-4],))),
    _Template(("count_above_{k}", "num_greater_than_{k}"), range(0, 21), "xs",
              "how many numbers in the list xs are greater than {k}", "return sum(x > {k} for x in xs)",
              lambda k: [([k - 1, k, k + 1],), ([],), ([k + 5, k + 9, 0],)]),
    _Template(("keep_above_{k}", "filter_above_{k}"), range(0, 11), "xs",
              "a list of the numbers in xs greater than {k}, in order", "return [x for x in xs if x > {k}]",
              lambda k: [([k + 2, k, k + 1],), ([],), ([k - 3],)]),
    _Template(("factorial", "fact"), (0,), "n", "the factorial of the integer n >= 0",
              "return 1 if n < 2 else n * {name}(n - 1)", _fixed((0,), (1,), (5,), (7,))),
)  # fmt: skip


def _problem(template: _Template, name: str, k: Any) -> CodeProblem:
    """One problem of `template`; the expected values come from running the reference (our code)."""
    signature = f"{name}({template.signature})"
    solution = f"def {signature}:\n    {template.body.format(name=name, k=k)}\n"
    namespace: dict[str, Any] = {}
    exec(solution, namespace)  # the reference solution, written above: trusted
    cases = [(args, namespace[name](*args)) for args in template.inputs(k)]
    rng = random.Random(f"{name}:{k}")
    while True:  # tests that a constant answer cannot pass: at least two different expected values
        chosen = rng.sample(cases, rng.randint(2, min(4, len(cases))))
        if len({repr(expected) for _, expected in chosen}) >= 2:
            break
    tests = tuple(f"assert {name}({', '.join(map(repr, args))}) == {expected!r}" for args, expected in chosen)
    prompt = f"Write a Python function {signature} that returns {template.task.format(k=k)}."
    return CodeProblem(prompt=prompt, tests=tests, solution=solution)


@functools.cache
def code_problems() -> tuple[CodeProblem, ...]:
    """Every problem of the task (a few hundred), in a fixed order."""
    return tuple(
        _problem(template, name.format(k=k), k) for template in _TEMPLATES for k in template.ks
        for name in template.names
    )  # fmt: skip


def code_split() -> tuple[list[Sample], list[Sample]]:
    """(training samples, held-out samples): every `HELD_OUT_EVERY`-th of a fixed shuffle is held out."""
    order = list(code_problems())
    random.Random(_SPLIT_SEED).shuffle(order)
    held = [p.sample() for i, p in enumerate(order) if i % HELD_OUT_EVERY == 0]
    train = [p.sample() for i, p in enumerate(order) if i % HELD_OUT_EVERY != 0]
    return train, held
