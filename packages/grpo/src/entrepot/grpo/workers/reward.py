"""The rule-reward worker: decodes responses, scores them with the configured verifiers, adds the models'.

Its output is the reward stage's whatever the mix: `rm_scores` (the verifiers' weighted sum plus the
reward models' `model_scores` when `reward.models` is set) and `accuracy` (the accuracy verifier).
With ``code_tests`` the programs run once per row (the weighted sum and the accuracy share the run),
and the stage's metrics count the verdicts (`code_tests.verdict_metrics`). With ``reward.judge`` a
local judge model scores each row's prompt text and response (`engines.judge`): its weighted [0, 1]
score adds to the sum, its verdict, score and output go into the dock (`JUDGE_COLUMNS`, for the
samples) and the stage's metrics count the verdicts (`reward/judge_<verdict>`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

import torch

from entrepot.dock import Batch, DockClient
from entrepot.grpo.algo.shaping import overlong_penalty
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data import code_tests, rewards
from entrepot.grpo.data.judge_verdicts import JudgeVerdict
from entrepot.grpo.data.sources import build_task
from entrepot.grpo.embedded.threads import configure_threads
from entrepot.grpo.workers._model_rewards import MODEL_SCORES
from entrepot.grpo.workers._stage import DockReader, stage
from entrepot.grpo.workers.ranks import RankInfo

__all__ = [
    "JUDGE_COLUMNS",
    "JUDGE_OUTPUT_BYTES",
    "RewardWorker",
    "prompt_extras",
    "tensor_text",
    "text_tensor",
    "wants_prompt_text",
]

# the judge's columns: verdict (index in JudgeVerdict), [0, 1] score, output text (UTF-8, cut)
JUDGE_COLUMNS = ("judge_verdict", "judge_score", "judge_output")
JUDGE_OUTPUT_BYTES = 512  # of the judge's output kept for the samples


def wants_prompt_text(config: GRPOConfig) -> bool:
    """Whether the dock carries each prompt's text: a multi-turn environment's `reset`, or the judge."""
    return config.multiturn.enabled or config.reward.judge.enabled


def text_tensor(text: str) -> torch.Tensor:
    """UTF-8 bytes of `text` as a uint8 tensor (how answers travel through the dock)."""
    return torch.tensor(list(text.encode("utf-8")) or [0], dtype=torch.uint8)


def prompt_extras(samples: Sequence[Any], *, with_prompt_text: bool) -> dict[str, list[torch.Tensor]]:
    """The per-prompt dock columns beside the tokens: each answer's text, and the prompt's text for a
    multi-turn environment's `reset` (`with_prompt_text`)."""
    extra = {"answer": [text_tensor(s.answer) for s in samples]}
    if with_prompt_text:
        extra["prompt_text"] = [text_tensor(s.prompt) for s in samples]
    return extra


def tensor_text(tensor: torch.Tensor) -> str:
    return _text(bytes(tensor.tolist()))


def _text(raw: bytes) -> str:
    """An answer's text from its UTF-8 bytes (an empty answer travels as one zero byte)."""
    return raw.decode("utf-8").rstrip("\x00")


def _bounds(lengths: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each row in a flat column with these [B] lengths."""
    return list(itertools.pairwise(itertools.accumulate(lengths.tolist(), initial=0)))


class RewardWorker:
    """Scores responses with the configured rule verifiers (one rank of the reward group).

    Args:
        config: the run's config.
        rank: this worker's place in the reward group.
    """

    role = "reward"

    def __init__(self, config: GRPOConfig, rank: RankInfo | None = None) -> None:
        configure_threads(config.threads, interop=True)
        self.config = config
        self.rank = rank or RankInfo(rank=0, world_size=1)
        self.reader = DockReader(self.rank, config.resources.stage_timeout_s)
        rewards.resolve_custom(config.reward.custom)
        code_tests.configure(config.reward.code)
        tokenizer = None
        if config.model.path is not None:
            from entrepot.grpo.engines.models import load_tokenizer

            tokenizer = load_tokenizer(config.model.path)
        setup = build_task(config, tokenizer)
        self.tokenizer, self.budget = setup.tokenizer, setup.max_new_tokens
        self.judge = None
        if config.reward.judge.enabled:
            from entrepot.grpo.engines.judge import build_judge

            self.judge = build_judge(config, tokenizer)

    def ready(self) -> bool:
        """Nothing: answering at all means the worker finished starting (Ray queues calls until then)."""
        return True

    @stage("rule_reward")
    def score(self, dock: DockClient, count: int) -> dict[str, float]:
        """Score unscored responses, up to `count` rows at a time; put `rm_scores` and `accuracy`."""
        t0 = time.perf_counter()
        n = self.config.rollout.n_samples_per_prompt
        stats: dict[str, float] = {}
        for batch in self.reader.batches(dock, "rule_reward", self._columns, count, min_count=n):
            for key, value in self._score(dock, batch).items():
                stats[key] = stats.get(key, 0.0) + value
        return {"time/reward": time.perf_counter() - t0, **stats}

    @stage("rule_reward")
    def score_rows(self, dock: DockClient, rows: Sequence[int]) -> dict[str, float]:
        """Score exactly `rows` (asynchronous training: the rollout scores each group as it finishes)."""
        t0 = time.perf_counter()
        stats = self._score(dock, self.reader.take(dock, "rule_reward", self._columns, rows))
        return {"time/reward": time.perf_counter() - t0, **stats}

    @property
    def _columns(self) -> list[str]:
        if self.config.multiturn.enabled:  # the environment scored the trajectory: its reward, its verdict
            return ["env_reward", "env_accuracy"]
        with_models = bool(self.config.reward.models)  # the reward-model stage's column
        with_judge = self.judge is not None  # the prompt as the data wrote it, for the rubric
        return ["responses", "response_length", "answer", *([MODEL_SCORES] if with_models else []),
                *(["prompt_text"] if with_judge else [])]  # fmt: skip

    def _score(self, dock: DockClient, batch: Batch) -> dict[str, float]:
        """Put the batch's scores; returns its verdict counts (``code_tests``), else nothing."""
        if self.config.multiturn.enabled:
            self._score_trajectories(dock, batch)
            return {}
        reward = self.config.reward
        ids = batch.columns["responses"].tolist()
        texts = [
            self.tokenizer.decode(ids[start:end], skip_special_tokens=True)
            for start, end in _bounds(batch.lengths["responses"])
        ]
        raw = batch.columns["answer"].to(torch.uint8).numpy().tobytes()
        answers = [_text(raw[start:end]) for start, end in _bounds(batch.lengths["answer"])]
        scored: dict[str, list[float]] = {}
        stats: dict[str, float] = {}
        if code_tests.CODE_TESTS in (*reward.verifiers, reward.accuracy_verifier):
            results = code_tests.code_tests.judge(texts, answers)
            scored[code_tests.CODE_TESTS] = [code_tests.code_tests.reward(r) for r in results]
            stats = code_tests.verdict_metrics(results)
        scores = torch.tensor(rewards.score(texts, answers, reward.verifiers, scored), dtype=torch.float32)
        if reward.models:
            scores += batch.columns[MODEL_SCORES].float()
        if reward.overlong_buffer:  # DAPO's soft overlong punishment
            scores += overlong_penalty(
                batch.lengths["responses"], self.budget, reward.overlong_buffer, reward.overlong_penalty
            )
        correct = rewards.score(texts, answers, {reward.accuracy_verifier: 1.0}, scored)
        columns: dict[str, Any] = {
            "rm_scores": scores,
            "accuracy": torch.tensor([float(c >= 1.0) for c in correct], dtype=torch.float32),
        }
        if self.judge is not None:
            raw = batch.columns["prompt_text"].to(torch.uint8).numpy().tobytes()
            prompts = [_text(raw[start:end]) for start, end in _bounds(batch.lengths["prompt_text"])]
            judged, judge_stats = self.judge.judge(prompts, texts, answers)
            stats.update(judge_stats)
            judge_scores = torch.tensor([j.score for j in judged], dtype=torch.float32)
            scores += reward.judge.weight * judge_scores
            codes = [list(JudgeVerdict).index(j.verdict) for j in judged]
            outputs = [j.output.encode()[:JUDGE_OUTPUT_BYTES].decode(errors="ignore") for j in judged]
            columns.update({
                "judge_verdict": torch.tensor(codes, dtype=torch.float32), "judge_score": judge_scores,
                "judge_output": [text_tensor(output) for output in outputs],
            })  # fmt: skip
        dock.put(columns, batch.indexes)
        return stats

    def _score_trajectories(self, dock: DockClient, batch: Batch) -> None:
        """Multi-turn rows: the environment's reward is the reward (the config refuses reward models
        beside it), its verdict the accuracy (`Trajectory.correct`)."""
        scores, accuracy = batch.columns["env_reward"].float(), batch.columns["env_accuracy"].float()
        dock.put({"rm_scores": scores, "accuracy": accuracy}, batch.indexes)

    def shutdown(self) -> None:
        """Nothing to release (the group's close ends the process)."""
