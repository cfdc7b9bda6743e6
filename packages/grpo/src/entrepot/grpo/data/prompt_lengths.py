"""Every prompt of a file dataset against ``data.max_prompt_tokens``, encoded in batches.

`sources.encode_prompt` encodes the prompts a step draws, one at a time; before a run starts every
prompt is checked at once, so a too-long row is refused in seconds rather than at the step that
draws it. The chat template is rendered for a batch of prompts and the batch is tokenized in one
call (a fast tokenizer spreads it over its threads); the ids are those `encode_prompt` produces
(transformers tokenizes a rendered chat template the same way, without special tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

from entrepot.grpo.data.sources import TaskSetup
from entrepot.grpo.data.tasks import CharTokenizer
from entrepot.grpo.errors import DataError

__all__ = ["check_prompt_lengths"]

_BATCH = 2048  # prompts rendered and tokenized per call: bounds the memory of a large file


def check_prompt_lengths(setup: TaskSetup, prompts: Sequence[str], max_tokens: int) -> None:
    """Raise `DataError` naming the first prompt longer than `max_tokens` tokens, and how many are.

    Args:
        setup: the task's tokenizer and whether the chat template applies.
        prompts: every prompt of the dataset.
        max_tokens: ``data.max_prompt_tokens``.
    """
    first: tuple[int, str] | None = None
    num_over, longest = 0, 0
    for begin in range(0, len(prompts), _BATCH):
        batch = list(prompts[begin : begin + _BATCH])
        for prompt, length in zip(batch, _lengths(setup, batch), strict=True):
            if length > max_tokens:
                num_over += 1
                longest = max(longest, length)
                first = first or (length, prompt)
    if first is not None:
        length, prompt = first
        more = f" ({num_over} of {len(prompts)} prompts are too long, the longest {longest} tokens)"
        raise DataError(
            f"prompt of {length} tokens exceeds data.max_prompt_tokens ({max_tokens}): {prompt[:40]!r}..."
            + (more if num_over > 1 else "")
        )


def _lengths(setup: TaskSetup, prompts: list[str]) -> list[int]:
    """Token count of each prompt as `encode_prompt` encodes it."""
    tok = setup.tokenizer
    if isinstance(tok, CharTokenizer):  # one token a character (code_functions on the built decoder)
        return [len(tok.encode(p)) for p in prompts]
    if setup.use_chat_template:
        conversations = [[{"role": "user", "content": p}] for p in prompts]
        texts = tok.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False)
    else:
        texts = prompts
    return [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
