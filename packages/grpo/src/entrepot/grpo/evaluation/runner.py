"""Decode held-out prompts and score every response: one record per (prompt, sample).

The in-run evaluation (`eval.every`, `ActorWorker.evaluate`) and the standalone one (`rl eval`,
`evaluation.standalone`) both call `evaluate_samples`, so at the same checkpoint and settings they
give the same numbers. Prompts go to the engine in fixed chunks of `CHUNK_PROMPTS` (each repeated
`num_samples` times, one after another), whatever displays the progress: the batch shapes, and so the
floating-point sums, never depend on who asks. Sampling draws from one `torch.Generator` seeded with
`EvalSettings.seed`, in chunk order, so a second evaluation is bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from entrepot.grpo.data import code_tests, rewards
from entrepot.grpo.data.sources import TaskSetup, encode_prompt
from entrepot.grpo.engines.base import RolloutEngine, SamplingParams
from entrepot.grpo.errors import EvalError
from entrepot.grpo.multiturn import Row
from entrepot.grpo.multiturn.runner import TrajectoryRollout

if TYPE_CHECKING:
    from entrepot.grpo.config import RewardConfig
    from entrepot.grpo.data.tasks import Sample

__all__ = ["CHUNK_PROMPTS", "EvalRecord", "EvalSettings", "evaluate_samples"]

CHUNK_PROMPTS = 64  # prompts per engine call (times the samples per prompt)


@dataclass(frozen=True)
class EvalSettings:
    """How an evaluation decodes: greedy (temperature 0, one response per prompt) or sampled.

    Attributes:
        num_samples: responses per prompt (pass@k needs k <= num_samples).
        temperature: 0 is greedy; above 0 samples with `top_p` and `top_k` (0 = off).
        seed: seed of the sampling generator (unused when greedy).
    """

    num_samples: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise EvalError(f"samples per prompt ({self.num_samples}) must be >= 1")
        if self.temperature < 0:
            raise EvalError(f"temperature ({self.temperature}) must be >= 0 (0 = greedy)")
        if self.temperature == 0 and self.num_samples > 1:
            raise EvalError(
                f"greedy decoding gives one response per prompt: {self.num_samples} samples need a "
                "temperature > 0"
            )
        if not 0 < self.top_p <= 1:
            raise EvalError(f"top_p ({self.top_p}) must be in (0, 1]")
        if self.top_k < 0:
            raise EvalError(f"top_k ({self.top_k}) must be >= 0 (0 = off)")


@dataclass(frozen=True)
class EvalRecord:
    """One evaluated response (a line of ``eval_samples.jsonl``).

    Attributes:
        prompt_index: the prompt's position in the evaluated set (what pairs two evaluations).
        sample_index: which of the prompt's `num_samples` responses.
        end_reason: ``eos``, ``stop`` (another stop token) or ``length`` (the budget); a multi-turn
            trajectory's own end (``done``, ``max_turns``, ...).
        turns: model turns (1 but for multi-turn trajectories).
    """

    prompt_index: int
    sample_index: int
    prompt: str
    answer: str
    response: str
    reward: float
    correct: bool
    response_length: int
    end_reason: str
    turns: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_samples(
    engine: RolloutEngine, setup: TaskSetup, reward: RewardConfig, samples: Sequence[Sample],
    settings: EvalSettings, *, max_prompt_tokens: int, multiturn: TrajectoryRollout | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> list[EvalRecord]:  # fmt: skip
    """Decode `settings.num_samples` responses to each of `samples` with `engine` and score them.

    The reward is `reward.verifiers`' weighted sum (a multi-turn trajectory: its environment's); a
    response is correct when `reward.accuracy_verifier` scores it >= 1 (multi-turn: the environment's
    verdict). `on_progress` is called with the prompts done after each chunk.
    """
    tok = setup.tokenizer
    params = SamplingParams(
        temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
        max_new_tokens=setup.max_new_tokens, stop_token_ids=(tok.eos_token_id,),
    )  # fmt: skip
    generator = None if settings.temperature == 0 else torch.Generator().manual_seed(settings.seed)
    records: list[EvalRecord] = []
    for start in range(0, len(samples), CHUNK_PROMPTS):
        chunk = list(enumerate(samples))[start : start + CHUNK_PROMPTS]
        jobs = [(i, j, s) for i, s in chunk for j in range(settings.num_samples)]
        prompts = [encode_prompt(setup, s.prompt, max_prompt_tokens) for _, _, s in jobs]
        if multiturn is not None:
            records.extend(_trajectories(multiturn, engine, jobs, prompts, params, tok, generator))
        else:
            records.extend(_responses(engine, jobs, prompts, params, tok, reward, generator))
        if on_progress is not None:
            on_progress(min(start + CHUNK_PROMPTS, len(samples)))
    return records


def _responses(
    engine: RolloutEngine, jobs: list[tuple[int, int, Sample]], prompts: list[list[int]],
    params: SamplingParams, tok: Any, reward: RewardConfig, generator: torch.Generator | None,
) -> list[EvalRecord]:  # fmt: skip
    out = engine.generate(prompts, params, pad_token_id=tok.pad_token_id, generator=generator)
    ids = [r.tolist() for r in out.responses()]
    texts = [tok.decode(r, skip_special_tokens=True) for r in ids]
    answers = [s.answer for _, _, s in jobs]
    code_tests.configure(reward.code)  # this process's sandbox limits (the actor's, evaluating)
    scored: dict[str, list[float]] = {}
    if code_tests.CODE_TESTS in (*reward.verifiers, reward.accuracy_verifier):  # the programs run once
        scored[code_tests.CODE_TESTS] = code_tests.code_tests.score_batch(texts, answers)
    scores = rewards.score(texts, answers, reward.verifiers, scored)
    correct = rewards.score(texts, answers, {reward.accuracy_verifier: 1.0}, scored)
    return [
        EvalRecord(i, j, s.prompt, s.answer, text, float(score), bool(c >= 1.0), len(r),
                   _end_reason(r, tok.eos_token_id, params.stop_token_ids))
        for (i, j, s), text, score, c, r in zip(jobs, texts, scores, correct, ids, strict=True)
    ]  # fmt: skip


def _trajectories(
    multiturn: TrajectoryRollout, engine: RolloutEngine, jobs: list[tuple[int, int, Sample]],
    prompts: list[list[int]], params: SamplingParams, tok: Any, generator: torch.Generator | None,
) -> list[EvalRecord]:  # fmt: skip
    starts = [
        (Row(s.prompt, s.answer, n), p) for n, ((_, _, s), p) in enumerate(zip(jobs, prompts, strict=True))
    ]
    trajectories, _ = multiturn.run(
        engine, starts, params, pad_token_id=tok.pad_token_id, generator=generator
    )
    return [
        EvalRecord(i, j, s.prompt, s.answer, tok.decode(t.tokens, skip_special_tokens=True), float(t.reward),
                   bool(t.correct), sum(t.model_mask), t.end.label, t.turns)
        for (i, j, s), t in zip(jobs, trajectories, strict=True)
    ]  # fmt: skip


def _end_reason(ids: Sequence[int], eos: int, stops: Sequence[int]) -> str:
    """Why a single-turn response ended: its last token is the EOS, another stop token, or neither."""
    if ids and ids[-1] == eos:
        return "eos"
    if ids and ids[-1] in stops:
        return "stop"
    return "length"
