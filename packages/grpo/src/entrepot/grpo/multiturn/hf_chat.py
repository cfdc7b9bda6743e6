"""The chat format of an HF tokenizer with a chat template: environment turns as template differences.

A multi-turn trajectory is never re-tokenized, so the tokens after a model turn must be exactly what
the template adds when the environment's message is appended. `HFChat` asks the template itself:
it renders a fixed placeholder exchange (user, assistant) with and without the new message, and
tokenizes what the second rendering adds, preceded by the template's end of the assistant turn
(less the stop token, when the model sampled it). This holds for append-only templates (ChatML and
most others); `check_template` certifies a template before a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from entrepot.grpo.errors import TemplateError
from entrepot.grpo.multiturn.chat import Message

__all__ = ["HFChat", "render_chat"]

# Placeholders no template writes itself, so that their position in a rendering is unambiguous.
_USER_PLACEHOLDER = "ENTREPOT-USER-PLACEHOLDER-5c1e"
_ASSISTANT_PLACEHOLDER = "ENTREPOT-ASSISTANT-PLACEHOLDER-5c1e"


def render_chat(
    tokenizer: Any, conversation: list[Message], *, role: str, add_generation_prompt: bool = False
) -> str:
    """`conversation` rendered as text by the tokenizer's chat template.

    A template that refuses the conversation (many raise on a role they do not know) is a
    `TemplateError` naming `role`, the role of the message being added.
    """
    from jinja2 import TemplateError as JinjaTemplateError

    try:
        text = tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except JinjaTemplateError as exc:
        raise TemplateError(f"the chat template cannot render a {role!r} message: {exc}") from None
    return str(text)


class HFChat:
    """`ChatFormat` of an HF tokenizer with a chat template; the model's turn ends with its EOS token.

    Attributes:
        tokenizer: the HF tokenizer (its ``chat_template`` set).
        stop_token_ids: ``(tokenizer.eos_token_id,)``.
        turn_end: the text the template writes after an assistant message's content (e.g.
            ``"<|im_end|>\\n"`` for ChatML).
        stop_text: the stop token's text (e.g. ``"<|im_end|>"``).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids: tuple[int, ...] = (tokenizer.eos_token_id,)
        self.stop_text: str = tokenizer.decode([tokenizer.eos_token_id])
        self._base: list[Message] = [
            {"role": "user", "content": _USER_PLACEHOLDER},
            {"role": "assistant", "content": _ASSISTANT_PLACEHOLDER},
        ]
        self._base_text = render_chat(tokenizer, self._base, role="assistant")
        at = self._base_text.rfind(_ASSISTANT_PLACEHOLDER)
        if at < 0:
            raise TemplateError(
                "the chat template does not write an assistant message's content as given (rendering "
                f"{_ASSISTANT_PLACEHOLDER!r} gave {self._base_text!r}), so a model turn cannot be appended"
            )
        self.turn_end: str = self._base_text[at + len(_ASSISTANT_PLACEHOLDER) :]

    def observation_ids(self, message: Message, *, stopped: bool) -> list[int]:
        """The end of the model's turn, `message` and the next assistant header, as tokens.

        When `stopped` the model already sampled the stop token, so the turn's end starts after it.
        """
        return self.observations_ids([message], stopped=stopped)

    def observations_ids(self, messages: Sequence[Message], *, stopped: bool) -> list[int]:
        """As `observation_ids` for several messages in a row (each checked to append)."""
        role = messages[-1].get("role", "?") if messages else "?"
        extended = render_chat(
            self.tokenizer, [*self._base, *messages], role=role, add_generation_prompt=True
        )
        if not extended.startswith(self._base_text):
            raise TemplateError(
                f"the chat template is not append-only for a {role!r} message: adding it after an "
                f"assistant turn renders {self._changed_part(extended)} differently, so the message "
                "cannot be appended to the tokens the model sampled"
            )
        turn_end = self.turn_end
        if stopped and turn_end.startswith(self.stop_text):
            turn_end = turn_end[len(self.stop_text) :]
        text = turn_end + extended[len(self._base_text) :]
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _changed_part(self, extended: str) -> str:
        """Which part of the base exchange `extended` rewrites, with the texts where they part."""
        at = next(
            (i for i, (a, b) in enumerate(zip(self._base_text, extended, strict=False)) if a != b),
            min(len(self._base_text), len(extended)),
        )
        base = self._base_text
        if at < base.find(_USER_PLACEHOLDER):
            part = "the start of the conversation"
        elif at < base.find(_USER_PLACEHOLDER) + len(_USER_PLACEHOLDER):
            part = "the user turn"
        elif at < base.rfind(_ASSISTANT_PLACEHOLDER) + len(_ASSISTANT_PLACEHOLDER):
            part = "the assistant turn"
        else:
            part = "the end of the assistant turn"
        return f"{part} ({base[at : at + 20]!r} becomes {extended[at : at + 20]!r})"

    def action_text(self, ids: Sequence[int]) -> str:
        """The text of a model turn (`ids` as sampled), special tokens left out."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))
