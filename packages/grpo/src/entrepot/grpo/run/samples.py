"""What the model generates: a few prompts, responses and rewards at step 1 and every `logging.samples_every`.

Each sample is one JSON line of `RUN/samples.jsonl`:

    {"step": 10, "prompt": "...", "response": "...", "answer": "...", "reward": 0.75,
     "parts": {"partial_credit": 0.75}, "accuracy": 0.0}

`reward` is the step's reward of the row (`rm_scores`: the verifiers' weighted sum, plus reward models
and overlong shaping when configured); `parts` is each verifier's weighted share of it, scored again
here for the few rows written. With ``code_tests`` a record also has the program's run:
``"code": {"verdict": "timeout", "passed": 1, "total": 3}`` (`entrepot.grpo.sandbox.Verdict`). With
``reward.judge`` it has the judge's, read from the dock (never judged again):
``"judge": {"verdict": "ok", "score": 0.7, "output": "Score: 7"}`` and the judge's part in `parts`.
Decoding and scoring draw no random numbers: a run that writes samples
trains exactly as one that does not. A resumed run drops the samples of the steps it repeats
(`SamplesWriter.truncate`), as `metrics.jsonl` does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from entrepot.grpo.data import code_tests, rewards

__all__ = [
    "SAMPLES_FILE",
    "SamplesWriter",
    "add_judgements",
    "build_samples",
    "pick_rows",
    "read_samples",
    "samples_due",
]

SAMPLES_FILE = "samples.jsonl"


def samples_due(step: int, every: int) -> bool:
    """Whether step `step` (1-based) writes samples: the first step, then every `every` (0 = never).

    The first step is sampled so that a short run (fewer steps than `every`) still shows what it generates.
    """
    return every > 0 and (step == 1 or step % every == 0)


def pick_rows(rows: torch.Tensor, n_samples_per_prompt: int, count: int) -> torch.Tensor:
    """Up to `count` of a step's `rows` (groups of n): the first response of each group, then the rest.

    Args:
        rows: int64 [B] the step's dock rows, group after group.
        n_samples_per_prompt: the group size n.
        count: how many to pick.

    Returns:
        int64 [min(count, B)]: distinct prompts first, in row order.
    """
    firsts = rows[::n_samples_per_prompt]  # [B / n]
    if firsts.numel() >= count:
        return firsts[:count]
    others = torch.cat([rows[i::n_samples_per_prompt] for i in range(1, n_samples_per_prompt)])
    return torch.cat([firsts, others[: count - firsts.numel()]])


def build_samples(
    step: int,
    prompts: Sequence[str],
    responses: Sequence[str],
    answers: Sequence[str],
    scores: Sequence[float],
    accuracy: Sequence[float],
    verifiers: Mapping[str, float],
) -> list[dict[str, Any]]:
    """One record per row: its texts, reward, accuracy and each verifier's weighted part of the reward
    (and the ``code_tests`` run's verdict)."""
    scored: dict[str, list[float]] = {}
    runs = []
    if code_tests.CODE_TESTS in verifiers:  # run once: its part and its verdict
        runs = code_tests.code_tests.judge(responses, answers)
        scored[code_tests.CODE_TESTS] = [code_tests.code_tests.reward(r) for r in runs]
    parts = {name: rewards.score(responses, answers, {name: w}, scored) for name, w in verifiers.items()}
    records = [
        {
            "step": step,
            "prompt": prompts[i],
            "response": responses[i],
            "answer": answers[i],
            "reward": float(scores[i]),
            "parts": {name: values[i] for name, values in parts.items()},
            "accuracy": float(accuracy[i]),
        }
        for i in range(len(prompts))
    ]
    for record, run in zip(records, runs, strict=False):
        record["code"] = {"verdict": run.verdict.value, "passed": run.passed, "total": run.total}
    return records


def add_judgements(records: Sequence[dict[str, Any]], batch: Any, weight: float) -> None:
    """Each record's judge verdict, [0, 1] score and output, and the judge's weighted part of the reward,
    from the packed dock `batch` of the records' rows (its ``judge_*`` columns)."""
    from entrepot.grpo.data.judge_verdicts import JudgeVerdict

    verdicts = list(JudgeVerdict)
    outputs = batch.columns["judge_output"].to(torch.uint8).split(batch.lengths["judge_output"].tolist())
    rows = zip(batch.columns["judge_verdict"].tolist(), batch.columns["judge_score"].tolist(), outputs,
               strict=True)  # fmt: skip
    for record, (verdict, score, output) in zip(records, rows, strict=True):
        text = bytes(output.tolist()).decode("utf-8", errors="replace").rstrip("\x00")
        record["judge"] = {"verdict": verdicts[int(verdict)].value, "score": score, "output": text}
        record["parts"]["judge"] = weight * score


class SamplesWriter:
    """Appends records of steps (each with its "step") to `run_dir/name` (created on the first write)."""

    def __init__(self, run_dir: Path, name: str = SAMPLES_FILE) -> None:
        self.path = run_dir / name

    def write(self, samples: Sequence[Mapping[str, Any]]) -> None:
        with self.path.open("a") as f:
            f.writelines(json.dumps(dict(sample)) + "\n" for sample in samples)

    def truncate(self, last_step: int) -> None:
        """Drop samples of steps after `last_step` (a resumed run repeats them)."""
        if self.path.is_file():
            kept = [s for s in read_samples(self.path) if int(s["step"]) <= last_step]
            self.path.write_text("".join(json.dumps(s) + "\n" for s in kept))


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """Every sample record of a samples.jsonl file, in order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
