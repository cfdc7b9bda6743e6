"""Evaluation: one code path for the in-run evaluation (`eval.every`) and `rl eval`.

- `runner`: `evaluate_samples` decodes and scores, one `EvalRecord` per response (greedy or sampled).
- `passk`: pass@k, the unbiased estimator.
- `summary`: the figures of a set of records; the in-run metrics.
- `greedy`: `greedy_eval`, the in-run figures outside a worker.
- `target`, `dataset`: what `rl eval` evaluates, on which prompts, checked before any model loads.
- `records`: ``eval.json`` and ``eval_samples.jsonl`` with their provenance.
- `standalone`: `prepare` and `run`, what `rl eval` calls.
"""

from __future__ import annotations

from entrepot.grpo.evaluation.passk import mean_pass_at_k, pass_at_k
from entrepot.grpo.evaluation.runner import CHUNK_PROMPTS, EvalRecord, EvalSettings, evaluate_samples

__all__ = ["CHUNK_PROMPTS", "EvalRecord", "EvalSettings", "evaluate_samples", "mean_pass_at_k", "pass_at_k"]
