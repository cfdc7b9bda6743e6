"""Arithmetic word problems with a checkable final answer: the ``word_problems`` task.

Templated sentences about a person and a kind of thing, with a starting amount and 1-3 operations
(buys more, gives away, times as many), small operands and a non-negative whole answer, e.g.::

    Mia has 7 apples. She gives 3 apples to Tom. How many apples does Mia have now?
    Give the final answer on the last line as: #### <number>                       -> 4

The gold answer is the plain number, read by the math verifiers (``gsm8k``, ``gsm8k_lenient``), so
a response is scored by the number after its last ``####`` (or, leniently, its last number).
Like the character tasks the stream is a pure function of (seed, position), with a disjoint held-out
pool (`tasks.GeneratedSource`). The prompts are English: they need a real tokenizer (model.path).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from entrepot.grpo.config.word_problems import WordProblemsConfig
from entrepot.grpo.data.tasks import GeneratedSource, Sample

__all__ = ["INSTRUCTION", "WordProblems", "distinct_word_problems"]

INSTRUCTION = "Give the final answer on the last line as: #### <number>"
"""What every prompt ends with: the GSM8K answer line the ``gsm8k`` verifier reads."""

_PEOPLE = (
    ("Mia", "She"), ("Tom", "He"), ("Ana", "She"), ("Sam", "He"), ("Lily", "She"), ("Ben", "He"),
    ("Zoe", "She"), ("Max", "He"), ("Emma", "She"), ("Leo", "He"),
)  # fmt: skip
_FRIENDS = ("Noah", "Ella", "Jack", "Ivy", "Owen", "Ruby")
_THINGS = (
    "apples", "pencils", "marbles", "stickers", "cookies", "books", "coins", "shells", "cards", "eggs",
)  # fmt: skip
_MAX_FACTOR = 5  # multipliers stay small: 'x' problems answer in the tens, not the thousands

# Sentences per operation, formatted with the pronoun (he, he_lower, him), the friend, the things, n.
_SENTENCES: dict[str, tuple[str, ...]] = {
    "+": ("{he} buys {n} more {things}.", "{friend} gives {him} {n} more {things}."),
    "-": ("{he} gives {n} {things} to {friend}.", "{he} loses {n} {things}."),
    "x": ("Then {he_lower} has {n} times as many {things} as before.",),
}
_OBJECT = {"She": "her", "He": "him"}


def distinct_word_problems(config: WordProblemsConfig) -> int:
    """A lower bound on the distinct problems `config` allows (people x things x first operands):
    what the preflight compares with the held-out pool."""
    return len(_PEOPLE) * len(_THINGS) * config.max_operand ** (1 + config.steps)


class WordProblems(GeneratedSource):
    """Generated one- to three-step word problems: an endless seeded stream plus a held-out pool.

    Args:
        config: the difficulty (`data.word_problems`).
        seed: seed of the training stream (held-out problems come from a disjoint stream).
    """

    def __init__(self, config: WordProblemsConfig, seed: int = 0) -> None:
        super().__init__(seed)
        self.config = config

    def _operand(self, rng: random.Random, op: str, total: int) -> int | None:
        """An operand of `op` applied to `total` that keeps the answer a whole number >= 0, or None."""
        top = self.config.max_operand
        if op == "+":
            return rng.randint(1, top)
        if op == "-":
            return rng.randint(1, min(top, total)) if total >= 1 else None
        return rng.randint(2, min(_MAX_FACTOR, top))

    def _make(self, rng: random.Random) -> Sample:
        name, he = rng.choice(_PEOPLE)
        friend, things = rng.choice(_FRIENDS), rng.choice(_THINGS)
        total = rng.randint(1, self.config.max_operand)
        sentences = [f"{name} has {total} {things}."]
        for _ in range(self.config.steps):
            ops = list(self.config.operations)
            rng.shuffle(ops)
            for op in ops:  # the first operation that fits the total ('-' needs something to give)
                n = self._operand(rng, op, total)
                if n is not None:
                    break
            assert n is not None  # '+' and 'x' always fit; '-' alone is one step (the config's check)
            total = _APPLY[op](total, n)
            template = rng.choice(_SENTENCES[op])
            words = {"he": he, "he_lower": he.lower(), "him": _OBJECT[he], "friend": friend, "things": things}
            sentences.append(template.format(n=n, **words))
        question = f"How many {things} does {name} have now?"
        return Sample(prompt=" ".join([*sentences, question, INSTRUCTION]), answer=str(total))


_APPLY: dict[str, Callable[[int, int], int]] = {
    "+": lambda total, n: total + n,
    "-": lambda total, n: total - n,
    "x": lambda total, n: total * n,
}
