"""Sequence lengths for `rl batching plan`: read from a file, or drawn from a named distribution."""

from __future__ import annotations

import math
import random
import re
from enum import StrEnum
from pathlib import Path

from entrepot.cli._errors import CLIUsageError


class Distribution(StrEnum):
    """Shapes of generated lengths (response lengths of RL rollouts are usually long-tailed)."""

    uniform = "uniform"
    normal = "normal"
    lognormal = "lognormal"
    exponential = "exponential"


def read_lengths(path: Path) -> list[int]:
    """Positive integers from a text file, separated by whitespace, commas or newlines (JSON lists work)."""
    text = path.read_text()
    tokens = [t for t in re.split(r"[\s,\[\]]+", text) if t]
    lengths: list[int] = []
    for position, token in enumerate(tokens):
        if not token.isdigit() or int(token) < 1:
            raise CLIUsageError(f"{path}: entry {position} ({token!r}) must be a positive integer length")
        lengths.append(int(token))
    if not lengths:
        raise CLIUsageError(f"{path}: holds no lengths (expected positive integers)")
    return lengths


def generate_lengths(
    distribution: Distribution, count: int, mean: float, min_length: int, max_length: int, seed: int
) -> list[int]:
    """`count` lengths drawn with `seed`, clamped to [min_length, max_length] (the clamp is the point:
    real rollouts stop at the response budget)."""
    if not 1 <= min_length <= max_length:
        raise CLIUsageError(f"--min-length ({min_length}) must be >= 1 and <= --max-length ({max_length})")
    if not min_length <= mean <= max_length:
        raise CLIUsageError(
            f"--mean-length ({mean}) must lie in [--min-length, --max-length] = [{min_length}, {max_length}]"
        )
    rng = random.Random(seed)
    sigma = 0.6
    draw = {
        Distribution.uniform: lambda: rng.uniform(min_length, max_length),
        Distribution.normal: lambda: rng.gauss(mean, mean / 3),
        Distribution.lognormal: lambda: rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma),
        Distribution.exponential: lambda: rng.expovariate(1 / mean),
    }[distribution]
    return [min(max_length, max(min_length, round(draw()))) for _ in range(count)]
