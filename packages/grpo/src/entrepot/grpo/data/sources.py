"""Prompt sources: the built-in synthetic tasks, generated word problems and code problems, or local
jsonl / parquet files.

File datasets are read whole (prompts are small), shuffled per epoch with a seeded permutation,
and served as an endless stream indexed by position, so resuming needs only the position.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from entrepot.grpo import _install
from entrepot.grpo.data.code_functions import CODE_ALPHABET, code_split
from entrepot.grpo.data.lengths import response_budget
from entrepot.grpo.data.tasks import (
    DEFAULT_ALPHABET,
    MULTITURN_ALPHABET,
    CharTokenizer,
    PromptSource,
    Sample,
    SyntheticTask,
)
from entrepot.grpo.data.word_problems import WordProblems
from entrepot.grpo.errors import DataError

if TYPE_CHECKING:
    from entrepot.grpo.config import GRPOConfig

__all__ = ["FileDataset", "TaskSetup", "build_task", "encode_prompt", "read_records"]


def read_records(
    path: str | Path, prompt_field: str, answer_field: str, key: str | None = None
) -> list[Sample]:
    """Samples from a .jsonl or .parquet file whose records hold the two named fields.

    Raises:
        DataError: a missing or empty file, a line that is not a JSON object, a record without a
            field or with a null one; the message starts with `key` (the config key that names the
            file, e.g. ``data.train_path``), gives the file and line (a parquet file: the row) and the
            key to change (``data.prompt_field`` / ``data.answer_field``).
    """
    file, at = Path(path), f"{key}: " if key else ""
    if not file.is_file():
        raise DataError(f"{at}prompt file {str(file)!r} does not exist")
    rows: list[tuple[str, Any]]  # (where in the file, record)
    if file.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # type: ignore[import-not-found, import-untyped, unused-ignore]
        except ImportError:
            raise DataError(f"reading parquet needs pyarrow: {_install.PARQUET}") from None
        rows = [(f"{file} row {i}", r) for i, r in enumerate(pq.read_table(file).to_pylist(), start=1)]
    else:
        rows = []
        for line_no, line in enumerate(file.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append((f"{file}:{line_no}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DataError(f"{at}{file}:{line_no} is not valid JSON: {exc.msg}") from None
    if not rows:
        raise DataError(f"{at}prompt file {str(file)!r} holds no records (it is empty or blank)")
    fields = {prompt_field: "data.prompt_field", answer_field: "data.answer_field"}
    samples = []
    for where, record in rows:
        if not isinstance(record, dict):
            raise DataError(
                f"{at}{where} is a JSON {type(record).__name__}, not a record with fields "
                f"{prompt_field!r} and {answer_field!r}"
            )
        for name, setting in fields.items():
            if name not in record:
                raise DataError(
                    f"{at}{where} has no field {name!r} ({setting}); its fields: {', '.join(record)}; "
                    f"set {setting} to the one that holds it"
                )
            if record[name] is None:
                raise DataError(f"{at}{where}: field {name!r} ({setting}) is null")
        samples.append(Sample(prompt=str(record[prompt_field]), answer=_text(record[answer_field])))
    return samples


def _text(value: Any) -> str:
    """A field's text: a list or a mapping as JSON (``code_tests`` reads a ``tests`` list so), else str."""
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


class FileDataset:
    """Prompts from a local file: an endless seeded stream over epochs plus a held-out split.

    Args:
        train: training samples.
        held_out: evaluation samples; when empty, the last 10% of `train` (at least 1) is held out.
        seed: seed of the per-epoch permutations.
        shuffle: permute each epoch (False keeps file order).
    """

    def __init__(
        self, train: list[Sample], held_out: list[Sample], *, seed: int = 0, shuffle: bool = True
    ) -> None:
        if not held_out:
            cut = max(1, len(train) // 10) if len(train) > 1 else 0
            train, held_out = train[: len(train) - cut], train[len(train) - cut :] or train
        self.train, self._held_out = train, held_out
        self.seed, self.shuffle = seed, shuffle
        self._epoch_order: tuple[int, list[int]] = (-1, [])

    def _order(self, epoch: int) -> list[int]:
        if self._epoch_order[0] != epoch:  # one permutation per epoch, computed once
            order = list(range(len(self.train)))
            if self.shuffle:
                random.Random(self.seed * 7919 + epoch).shuffle(order)
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]

    def batch(self, position: int, count: int) -> list[Sample]:
        out = []
        for pos in range(position, position + count):
            epoch, offset = divmod(pos, len(self.train))
            out.append(self.train[self._order(epoch)[offset]])
        return out

    def held_out(self, count: int) -> list[Sample]:
        return self._held_out[:count]

    def samples(self) -> list[Sample]:
        """Every training and held-out sample (what a deep validation encodes)."""
        return [*self.train, *self._held_out]


@dataclass
class TaskSetup:
    """What a run needs to turn prompts into tokens and back."""

    tokenizer: Any
    source: PromptSource
    max_new_tokens: int
    use_chat_template: bool


def encode_prompt(setup: TaskSetup, prompt: str, max_tokens: int) -> list[int]:
    """Token ids of `prompt` (chat template applied when configured and available); too long is an error."""
    tok = setup.tokenizer
    if setup.use_chat_template:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = list(ids)
    else:
        ids = list(tok.encode(prompt, add_special_tokens=False))
    if len(ids) > max_tokens:
        raise DataError(
            f"prompt of {len(ids)} tokens exceeds data.max_prompt_tokens ({max_tokens}): {prompt[:40]!r}..."
        )
    return ids


def _alphabet(config: GRPOConfig) -> str:
    """The character tokenizer's alphabet: the tasks' characters, and with multi-turn rollouts the chat
    format's ``>`` and the calculator's ``#`` and ``?`` (`multiturn.chat.CharChat`)."""
    return MULTITURN_ALPHABET if config.multiturn.enabled else DEFAULT_ALPHABET


def _has_chat_template(tokenizer: Any) -> bool:
    return getattr(tokenizer, "chat_template", None) is not None


def build_task(config: GRPOConfig, tokenizer: Any | None = None) -> TaskSetup:
    """Tokenizer + prompt source for `config.data` (a loaded HF tokenizer is passed for model.path)."""
    data = config.data
    if data.task in ("reverse", "addition"):
        task = SyntheticTask(data.task, data.num_digits, seed=config.seed)
        tok = tokenizer if tokenizer is not None else CharTokenizer(_alphabet(config))
        budget = response_budget(data, config.rollout)
        return TaskSetup(tokenizer=tok, source=task, max_new_tokens=budget, use_chat_template=False)
    if data.task == "code_functions":  # a fixed set of problems with a held-out split
        train, held = code_split()
        tok = tokenizer if tokenizer is not None else CharTokenizer(CODE_ALPHABET)
        chat = tokenizer is not None and data.apply_chat_template and _has_chat_template(tokenizer)
        return TaskSetup(
            tokenizer=tok,
            source=FileDataset(train, held, seed=config.seed, shuffle=data.shuffle),
            max_new_tokens=response_budget(data, config.rollout),
            use_chat_template=chat,
        )
    if tokenizer is None:
        raise DataError(
            f"data.task={data.task!r} needs a tokenizer: set model.path to a local HF model directory"
        )
    chat = data.apply_chat_template and _has_chat_template(tokenizer)
    budget = response_budget(data, config.rollout)
    if data.task == "word_problems":
        problems = WordProblems(data.word_problems, seed=config.seed)
        return TaskSetup(tokenizer=tokenizer, source=problems, max_new_tokens=budget, use_chat_template=chat)
    assert data.train_path is not None  # checked by DataConfig
    train = read_records(data.train_path, data.prompt_field, data.answer_field, "data.train_path")
    held = (
        read_records(data.eval_path, data.prompt_field, data.answer_field, "data.eval_path")
        if data.eval_path
        else []
    )
    return TaskSetup(
        tokenizer=tokenizer,
        source=FileDataset(train, held, seed=config.seed, shuffle=data.shuffle),
        max_new_tokens=budget,
        use_chat_template=chat,
    )
