"""The figures of an evaluation from its records: accuracy, pass@k, reward, lengths, end reasons."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from entrepot.grpo.errors import EvalError
from entrepot.grpo.evaluation.passk import mean_pass_at_k
from entrepot.grpo.evaluation.runner import EvalRecord

__all__ = ["check_ks", "in_run_metrics", "per_prompt_accuracy", "summarize"]


def check_ks(ks: Sequence[int], num_samples: int) -> None:
    """Refuse a k that pass@k cannot estimate from `num_samples` responses per prompt."""
    for k in ks:
        if not 1 <= k <= num_samples:
            raise EvalError(
                f"--k {k} is larger than the samples per prompt ({num_samples}): pass@k needs k <= samples"
                if k > num_samples else f"--k ({k}) must be >= 1"
            )  # fmt: skip


def per_prompt_accuracy(records: Sequence[EvalRecord]) -> dict[int, float]:
    """Each prompt's share of correct responses (what a paired comparison differences)."""
    hits: Counter[int] = Counter()
    counts: Counter[int] = Counter()
    for r in records:
        counts[r.prompt_index] += 1
        hits[r.prompt_index] += int(r.correct)
    return {i: hits[i] / counts[i] for i in sorted(counts)}


def summarize(records: Sequence[EvalRecord], num_samples: int, ks: Sequence[int]) -> dict[str, float]:
    """Accuracy (the mean over responses: pass@1's unbiased estimate), ``pass@k`` for each of `ks`,
    mean and std of the reward, mean and max response length, and the share of each end reason."""
    if not records:
        raise EvalError("the evaluation set holds no prompts")
    check_ks(ks, num_samples)
    correct: Counter[int] = Counter()
    for r in records:
        correct[r.prompt_index] += int(r.correct)
    prompts = sorted({r.prompt_index for r in records})
    per_prompt = [correct[i] for i in prompts]
    reward = torch.tensor([r.reward for r in records])  # float32, as the in-run evaluation's mean
    lengths = torch.tensor([r.response_length for r in records], dtype=torch.float64)
    out = {
        "accuracy": float(torch.tensor([float(r.correct) for r in records]).mean()),
        **{f"pass@{k}": mean_pass_at_k(per_prompt, num_samples, k) for k in ks},
        "reward_mean": float(reward.mean()),
        "reward_std": float(reward.std()) if len(records) > 1 else 0.0,
        "response_length": float(lengths.mean()),
        "response_length_max": float(lengths.max()),
        "turns": sum(r.turns for r in records) / len(records),
        "prompts": float(len(prompts)),
        "samples": float(len(records)),
    }
    ends = Counter(r.end_reason for r in records)
    out.update({f"end_reason/{name}": ends[name] / len(records) for name in sorted(ends)})
    return out


def in_run_metrics(records: Sequence[EvalRecord], *, multiturn: bool) -> dict[str, float]:
    """The in-run evaluation's metrics (``accuracy``, ``eval_reward``, ``eval_prompts``; multi-turn also
    ``eval_turns``), as `metrics.jsonl` has recorded them since before `evaluate_samples` existed."""
    n = len(records)
    correct = [float(r.correct) for r in records]
    out = {  # float32 means as before, but for multi-turn's accuracy (a Python mean then too)
        "accuracy": sum(correct) / n if multiturn else float(torch.tensor(correct).mean()),
        "eval_reward": float(torch.tensor([r.reward for r in records]).mean()),
    }
    if multiturn:
        out["eval_turns"] = sum(r.turns for r in records) / n
    out["eval_prompts"] = float(len({r.prompt_index for r in records}))
    return out
