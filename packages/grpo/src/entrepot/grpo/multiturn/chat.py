"""How a conversation becomes tokens one turn at a time: the chat format of a multi-turn rollout.

A trajectory is one token sequence, never re-tokenized: the prompt's tokens (rendered once, by the
data pipeline), then per turn the model's sampled tokens as they came, then the tokens a
`ChatFormat` renders for the environment's message (the end of the model's turn, the message, the
header of the next assistant turn). Only that message is tokenized here.

Two formats, chosen by the tokenizer (`chat_format`): `CharChat` for the embedded default's
character tokenizer, `HFChat` (`hf_chat`) for an HF tokenizer with a chat template, whose pieces
are the differences of the template's own renderings (`rl grpo check-template` certifies them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from entrepot.grpo.data.tasks import CharTokenizer
from entrepot.grpo.errors import DataError

__all__ = ["CharChat", "ChatFormat", "Message", "chat_format"]

Message = dict[str, str]
"""One chat message: ``{"role": "user" | "tool" | ..., "content": "..."}``."""


class ChatFormat(Protocol):
    """Renders the environment's side of a conversation into tokens, one message at a time.

    Attributes:
        stop_token_ids: the tokens that end the model's turn (sampling stops there, the token kept).
    """

    stop_token_ids: tuple[int, ...]

    def observation_ids(self, message: Message, *, stopped: bool) -> list[int]:
        """Tokens after a model turn: the template's end of that turn (after the stop token when the
        model sampled it, `stopped`), `message`, and the header of the next assistant turn."""
        ...

    def observations_ids(self, messages: Sequence[Message], *, stopped: bool) -> list[int]:
        """As `observation_ids` for several messages in a row (an agent's tool results, say)."""
        ...

    def action_text(self, ids: Sequence[int]) -> str:
        """A model turn's text (`ids` as sampled), special tokens left out: what the environment reads."""
        ...


class CharChat:
    """The chat format of the character tokenizer (`data.tasks.CharTokenizer`).

    A model turn ends with ``<eos>``; an environment message is ``>`` + its content + ``=`` (the
    cue to answer, as in the prompts ``1234+5678=``). The tokenizer's alphabet must hold those
    characters and every character an environment writes.
    """

    def __init__(self, tokenizer: CharTokenizer) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids: tuple[int, ...] = (tokenizer.eos_token_id,)

    def observation_ids(self, message: Message, *, stopped: bool) -> list[int]:
        return self.observations_ids([message], stopped=stopped)

    def observations_ids(self, messages: Sequence[Message], *, stopped: bool) -> list[int]:
        closing = [] if stopped else [self.tokenizer.eos_token_id]
        return closing + self.tokenizer.encode("".join(f">{m['content']}=" for m in messages))

    def action_text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def chat_format(tokenizer: Any, *, key: str = "multiturn.environment") -> ChatFormat:
    """The chat format for `tokenizer`: `CharChat` for the embedded tokenizer, else the HF chat
    template's (`HFChat`); a tokenizer without a chat template is a `DataError` naming `key`."""
    if isinstance(tokenizer, CharTokenizer):
        return CharChat(tokenizer)
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError(
            f"{key}: a multi-turn rollout renders the environment's messages with the tokenizer's chat "
            "template, and this tokenizer has none (set one in tokenizer_config.json)"
        )
    from entrepot.grpo.multiturn.hf_chat import HFChat

    return HFChat(tokenizer)
