"""The prompts an evaluation decodes: the task's held-out split, or a jsonl / parquet file checked
against the task (its fields, its prompts' characters and widths, its gold answers) before any model
loads."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data import rewards
from entrepot.grpo.data.sources import TaskSetup, build_task, encode_prompt, read_records
from entrepot.grpo.data.tasks import SYNTHETIC_TASKS, Sample, answer_tokens, prompt_tokens
from entrepot.grpo.errors import DataError, EvalError, RewardError

__all__ = ["EvalSet", "eval_set", "task_setup"]


class EvalSet:
    """The evaluated prompts and where they came from (``eval.json`` records the file's sha256)."""

    def __init__(self, samples: list[Sample], source: str, sha256: str | None) -> None:
        self.samples, self.source, self.sha256 = samples, source, sha256

    def provenance(self) -> dict[str, Any]:
        return {"source": self.source, "sha256": self.sha256, "prompts": len(self.samples)}


def task_setup(config: GRPOConfig) -> TaskSetup:
    """The task of `config` with its tokenizer (a model directory's is loaded, not its weights)."""
    tokenizer = None
    if config.model.path is not None:
        from entrepot.grpo.engines.models import load_tokenizer

        tokenizer = load_tokenizer(config.model.path)
    return build_task(config, tokenizer)


def eval_set(
    config: GRPOConfig, setup: TaskSetup, data_file: str | Path | None, num_prompts: int | None
) -> EvalSet:
    """The first `num_prompts` (default ``eval.num_prompts``; a file: all) of the held-out split of the
    task, or of `data_file`'s records (``data.prompt_field`` / ``data.answer_field``), checked.

    Raises:
        EvalError: a record that does not fit the task (naming the file, the row and what is wrong).
    """
    if data_file is None:
        samples = setup.source.held_out(num_prompts or config.eval.num_prompts)
        return EvalSet(samples, "held_out", None)
    path = Path(data_file)
    try:
        samples = read_records(path, config.data.prompt_field, config.data.answer_field)
    except DataError as error:
        raise EvalError(f"--data {error}") from None
    samples = samples[:num_prompts] if num_prompts else samples
    _check_fits(config, setup, path, samples)
    return EvalSet(samples, str(path), hashlib.sha256(path.read_bytes()).hexdigest())


def _check_fits(config: GRPOConfig, setup: TaskSetup, path: Path, samples: list[Sample]) -> None:
    data = config.data
    for row, sample in enumerate(samples):
        try:
            ids = encode_prompt(setup, sample.prompt, data.max_prompt_tokens)
        except (ValueError, DataError) as error:
            raise EvalError(
                f"--data {path} record {row}: its prompt does not fit the task ({error})"
            ) from None
        if data.task in SYNTHETIC_TASKS:
            want = prompt_tokens(data.task, data.num_digits)
            if len(ids) != want:
                raise EvalError(
                    f"--data {path} record {row}: prompt {sample.prompt!r} is {len(ids)} tokens; the "
                    f"{data.task} task of {data.num_digits} digits has {want}"
                )
            width = answer_tokens(data.task, data.num_digits)
            if len(sample.answer) != width:
                raise EvalError(
                    f"--data {path} record {row}: answer {sample.answer!r} is {len(sample.answer)} "
                    f"characters; the {data.task} task of {data.num_digits} digits answers with {width}"
                )
    try:
        rewards.check_gold_answers(
            [*config.reward.verifiers, config.reward.accuracy_verifier], [s.answer for s in samples]
        )
    except RewardError as error:
        raise EvalError(f"--data {path}: {error}") from None
