"""pass@k, the unbiased estimator of Chen et al. (2021): 1 - C(n - c, k) / C(n, k) per prompt, averaged."""

from __future__ import annotations

from collections.abc import Sequence
from math import comb

__all__ = ["mean_pass_at_k", "pass_at_k"]


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """The probability that at least one of `k` of a prompt's `num_samples` responses, drawn without
    replacement, is correct when `num_correct` of them are; exact (integer binomials), so a second
    evaluation gives the same float.

    Raises:
        ValueError: k outside [1, num_samples], or num_correct outside [0, num_samples].
    """
    if not 1 <= k <= num_samples:
        raise ValueError(f"k ({k}) must be in [1, samples per prompt ({num_samples})]")
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"correct responses ({num_correct}) must be in [0, {num_samples}]")
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - comb(num_samples - num_correct, k) / comb(num_samples, k)


def mean_pass_at_k(correct_per_prompt: Sequence[int], num_samples: int, k: int) -> float:
    """pass@k over prompts: the mean of `pass_at_k` of each prompt's count of correct responses."""
    if not correct_per_prompt:
        raise ValueError("pass@k of no prompts")
    return sum(pass_at_k(num_samples, c, k) for c in correct_per_prompt) / len(correct_per_prompt)
