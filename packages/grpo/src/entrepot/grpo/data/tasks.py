"""Built-in synthetic tasks and the character tokenizer of the embedded default.

Both tasks have fixed-width answers, so per-position partial credit is a dense, well-defined reward:

- reverse:  ``31415926=`` -> ``62951413``
- addition: ``12345678+87654321=`` -> ``099999999`` (zero-padded to num_digits + 1 digits)

Prompt streams are deterministic functions of (seed, position), so the data position of a run is a
single integer and resuming needs no pickled sampler state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "DEFAULT_ALPHABET",
    "MULTITURN_ALPHABET",
    "SYNTHETIC_TASKS",
    "CharTokenizer",
    "GeneratedSource",
    "PromptSource",
    "Sample",
    "SyntheticTask",
    "answer_tokens",
    "distinct_prompts",
    "prompt_tokens",
]

EVAL_SEED_OFFSET = 1_000_003  # held-out prompts come from a disjoint seed stream
HELD_OUT_POOL = 4096  # held-out prompts that training never draws
SYNTHETIC_TASKS = ("reverse", "addition")


def prompt_tokens(kind: str, num_digits: int) -> int:
    """Tokens (characters) of every prompt of a synthetic task: ``d..d=`` or ``a..a+b..b=``."""
    return 2 * num_digits + 2 if kind == "addition" else num_digits + 1


def distinct_prompts(kind: str, num_digits: int) -> int:
    """How many different prompts a synthetic task has: 10^d numbers to reverse, 10^2d pairs to add."""
    return 10 ** (2 * num_digits if kind == "addition" else num_digits)


def answer_tokens(kind: str, num_digits: int) -> int:
    """Tokens (characters) of every answer of a synthetic task: the reversed digits, or the sum
    zero-padded to num_digits + 1 digits."""
    return num_digits + 1 if kind == "addition" else num_digits


@dataclass(frozen=True)
class Sample:
    """One prompt and its reference answer (text)."""

    prompt: str
    answer: str


class PromptSource(Protocol):
    """A deterministic, resumable stream of training prompts plus a fixed held-out set."""

    def batch(self, position: int, count: int) -> list[Sample]:
        """Samples `position .. position + count - 1` of the (endless) training stream."""
        ...

    def held_out(self, count: int) -> list[Sample]:
        """The first `count` held-out samples (the same on every call)."""
        ...


DEFAULT_ALPHABET = "0123456789+="
MULTITURN_ALPHABET = DEFAULT_ALPHABET + ">#?"  # the character chat format's and the calculator's


class CharTokenizer:
    """A character-level tokenizer over digits, ``+`` and ``=`` with pad (0) and eos (1) ids.

    It mirrors the small part of the HF tokenizer API the trainer uses (`encode`, `decode`,
    `pad_token_id`, `eos_token_id`, `vocab_size`), so synthetic tasks need no tokenizer files.
    """

    pad_token = "<pad>"
    eos_token = "<eos>"

    def __init__(self, alphabet: str = DEFAULT_ALPHABET) -> None:
        self.tokens = [self.pad_token, self.eos_token, *alphabet]
        self._ids = {ch: i for i, ch in enumerate(self.tokens)}
        self._visible = ["", "", *alphabet]  # what decode writes with skip_special_tokens

    @property
    def pad_token_id(self) -> int:
        return 0

    @property
    def eos_token_id(self) -> int:
        return 1

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; characters outside the alphabet are an error, never dropped."""
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(
                f"character {exc.args[0]!r} is not in the tokenizer alphabet {self.tokens[2:]}"
            ) from None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; special tokens are dropped when `skip_special_tokens`."""
        table = self._visible if skip_special_tokens else self.tokens
        return "".join([table[int(i)] for i in ids])


class GeneratedSource:
    """An endless seeded stream of generated samples plus a held-out pool that training never draws.

    Subclasses say how one sample is made from a `random.Random` (`_make`); sample `position` of the
    training stream is made from its own seeded generator, so a stream is a pure function of (seed,
    position). Training samples that happen to equal a held-out prompt are drawn again.

    Args:
        seed: seed of the training stream (held-out prompts use a disjoint stream).
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._held_out: list[Sample] = []
        self._held_out_prompts: set[str] = set()

    def _make(self, rng: random.Random) -> Sample:
        raise NotImplementedError

    def _train_sample(self, position: int) -> Sample:
        rng = random.Random(self.seed * 1_000_000_007 + position)
        sample = self._make(rng)
        self._build_held_out()
        while (
            sample.prompt in self._held_out_prompts
        ):  # keep evaluation honest: never train on a held-out prompt
            sample = self._make(rng)
        return sample

    def batch(self, position: int, count: int) -> list[Sample]:
        return [self._train_sample(position + i) for i in range(count)]

    def _build_held_out(self) -> None:
        if not self._held_out:
            rng = random.Random(self.seed + EVAL_SEED_OFFSET)
            self._held_out = [self._make(rng) for _ in range(HELD_OUT_POOL)]
            self._held_out_prompts = {s.prompt for s in self._held_out}

    def held_out(self, count: int) -> list[Sample]:
        if not 1 <= count <= HELD_OUT_POOL:
            raise ValueError(f"held-out count ({count}) must be between 1 and {HELD_OUT_POOL}")
        self._build_held_out()
        return self._held_out[:count]


class SyntheticTask(GeneratedSource):
    """Reverse a digit string or add two numbers; an endless seeded stream plus held-out prompts.

    Args:
        kind: ``"reverse"`` or ``"addition"``.
        num_digits: digits per operand.
        seed: seed of the training stream (held-out prompts use a disjoint stream and are never
            drawn for training).
    """

    def __init__(self, kind: Literal["reverse", "addition"], num_digits: int = 8, seed: int = 0) -> None:
        if kind not in ("reverse", "addition"):
            raise ValueError(f"task kind ({kind!r}) must be 'reverse' or 'addition'")
        super().__init__(seed)
        self.kind = kind
        self.num_digits = num_digits

    @property
    def answer_length(self) -> int:
        """Characters of every answer (fixed width)."""
        return answer_tokens(self.kind, self.num_digits)

    def _number(self, rng: random.Random) -> str:
        return "".join(rng.choice("0123456789") for _ in range(self.num_digits))

    def _make(self, rng: random.Random) -> Sample:
        if self.kind == "reverse":
            digits = self._number(rng)
            return Sample(prompt=f"{digits}=", answer=digits[::-1])
        a, b = self._number(rng), self._number(rng)
        total = str(int(a) + int(b)).zfill(self.answer_length)
        return Sample(prompt=f"{a}+{b}=", answer=total)
