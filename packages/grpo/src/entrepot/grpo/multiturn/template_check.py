"""Is a chat template append-only? Render a conversation turn by turn and whole, and compare the tokens.

A multi-turn rollout builds its trajectory by appending: the prompt's tokens, the model's sampled
tokens (ending with the stop token), the `HFChat` tokens of each environment message, and so on.
Training on that sequence is sound only if it is what the template writes for the same conversation
rendered whole; templates that rewrite earlier turns (Qwen3 dropping earlier reasoning, templates
that trim or re-wrap content) break this. `check_template` finds the first token where the two
renderings part and names the turn; `require_append_only` turns a failure into a `TemplateError`.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from entrepot.grpo.errors import DataError, TemplateError
from entrepot.grpo.multiturn.chat import Message
from entrepot.grpo.multiturn.hf_chat import HFChat, render_chat

__all__ = ["TemplateReport", "check_template", "default_conversation", "require_append_only"]

_SNIPPET_TOKENS = 6  # tokens shown on each side of the first difference


@dataclass(frozen=True, kw_only=True)
class TemplateReport:
    """What `check_template` found.

    Attributes:
        ok: the whole rendering starts with the turn-by-turn tokens.
        turns: the messages after the prompt (model and environment turns).
        tokens: the turn-by-turn tokens (prompt included) built before the check ended.
        turn: where the renderings part, 1-based over the turns (0: the prompt); None when ok.
        role: that turn's role; None when ok.
        expected: the whole rendering's tokens around the difference (``|`` marks it).
        got: the turn-by-turn tokens around the difference.
        message: one summary: the counts when ok, else the turn and the tokens where they part.
    """

    ok: bool
    turns: int
    tokens: int
    turn: int | None = None
    role: str | None = None
    expected: str = ""
    got: str = ""
    message: str = ""


def default_conversation(role: str = "tool") -> list[Message]:
    """A calculator exchange: a question, then three model turns with two environment replies (`role`)."""
    return [
        {"role": "user", "content": "What is 17 * 24 + 9? Use the calculator."},
        {"role": "assistant", "content": "First the product.\n<calc>17 * 24</calc>"},
        {"role": role, "content": "408"},
        {"role": "assistant", "content": "<calc>408 + 9</calc>"},
        {"role": role, "content": "417"},
        {"role": "assistant", "content": "17 * 24 + 9 = 417. The answer is 417."},
    ]


def check_template(tokenizer: Any, conversation: list[Message] | None = None) -> TemplateReport:
    """Compare `conversation` (default: `default_conversation()`) rendered turn by turn and whole.

    Turn by turn: the leading messages before the first assistant one rendered as the prompt (with the
    generation prompt), each assistant message's content encoded plus the EOS token (as sampled), each
    other message `HFChat.observation_ids(stopped=True)`. Whole: the template's text of the conversation,
    encoded. The template is append-only for it when the whole tokens start with the turn-by-turn ones
    (the whole may end with template text after the last stop token).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError(
            "the tokenizer has no chat template (set chat_template in tokenizer_config.json or add "
            "chat_template.jinja): multi-turn rollouts render the environment's messages with it"
        )
    if tokenizer.eos_token_id is None:
        raise DataError("the tokenizer has no EOS token: a model turn ends with it (set eos_token)")
    conversation = default_conversation() if conversation is None else conversation
    prompt, turns = _split_prompt(conversation)
    eos = tokenizer.eos_token_id
    ids = _prompt_ids(tokenizer, prompt)
    starts: list[int] = []  # where each turn's tokens begin in `ids`
    try:
        chat = HFChat(tokenizer)
        for message in turns:
            starts.append(len(ids))
            if message["role"] == "assistant":
                ids += [*tokenizer.encode(message["content"], add_special_tokens=False), eos]
            else:
                ids += chat.observation_ids(message, stopped=True)
        whole_text = render_chat(tokenizer, conversation, role=turns[-1]["role"])
    except TemplateError as exc:
        turn = len(starts) if starts else 1
        role = turns[turn - 1]["role"]
        return TemplateReport(
            ok=False, turns=len(turns), tokens=len(ids), turn=turn, role=role,
            message=f"turn {turn} of {len(turns)} ({role}): {exc}",
        )  # fmt: skip
    whole = list(tokenizer.encode(whole_text, add_special_tokens=False))
    at = _first_difference(whole, ids)
    if at is None:
        return TemplateReport(
            ok=True, turns=len(turns), tokens=len(ids),
            message=f"append-only: {len(turns)} turns, {len(ids)} tokens",
        )  # fmt: skip
    turn = bisect_right(starts, at)
    role = prompt[-1]["role"] if turn == 0 else turns[turn - 1]["role"]
    expected, got = _snippet(tokenizer, whole, at), _snippet(tokenizer, ids, at)
    where = "the prompt" if turn == 0 else f"turn {turn} of {len(turns)}"
    summary = (
        f"the chat template is not append-only: {where} ({role}) renders differently in the whole "
        f"conversation than appended turn by turn, from token {at} on\n"
        f"  whole:        {expected}\n"
        f"  turn by turn: {got}\n"
        "a multi-turn rollout appends turns, so it would train on tokens that are not the template's "
        "rendering of the same conversation"
    )
    return TemplateReport(
        ok=False, turns=len(turns), tokens=len(ids), turn=turn, role=role, expected=expected, got=got,
        message=summary,
    )  # fmt: skip


def require_append_only(tokenizer: Any) -> None:
    """Raise `TemplateError` (the report's message) unless the tokenizer's chat template is append-only."""
    report = check_template(tokenizer)
    if not report.ok:
        raise TemplateError(report.message)


def _split_prompt(conversation: list[Message]) -> tuple[list[Message], list[Message]]:
    """(prompt, turns): the messages before the first assistant one, and the alternating rest."""
    roles = [message.get("role") for message in conversation]
    if "assistant" not in roles or roles[0] == "assistant":
        raise DataError(f"a conversation to check starts with a prompt, then an assistant turn; got {roles}")
    first = roles.index("assistant")
    turns = conversation[first:]
    for index, message in enumerate(turns):
        if (message.get("role") == "assistant") != (index % 2 == 0):
            raise DataError(
                "after the prompt, a conversation to check alternates assistant and environment messages "
                f"and ends with an assistant one; got roles {roles}"
            )
    if len(turns) % 2 == 0:
        raise DataError(f"a conversation to check ends with an assistant message; got roles {roles}")
    return conversation[:first], turns


def _prompt_ids(tokenizer: Any, prompt: list[Message]) -> list[int]:
    """The prompt's tokens as the data pipeline renders them (chat template, generation prompt)."""
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def _first_difference(whole: list[int], incremental: list[int]) -> int | None:
    """The first position where `whole` does not continue `incremental`; None when it starts with it."""
    for at, (a, b) in enumerate(zip(whole, incremental, strict=False)):
        if a != b:
            return at
    return None if len(whole) >= len(incremental) else len(whole)


def _snippet(tokenizer: Any, ids: list[int], at: int) -> str:
    """The tokens of `ids` around position `at`, ``|`` before the one at `at` (``<end>`` past the end)."""
    start = max(0, at - _SNIPPET_TOKENS)
    before = tokenizer.convert_ids_to_tokens(ids[start:at])
    after = tokenizer.convert_ids_to_tokens(ids[at : at + _SNIPPET_TOKENS])
    after_text = " ".join(repr(token) for token in after) if after else "<end>"
    return f"{' '.join(repr(token) for token in before)} | {after_text}"
