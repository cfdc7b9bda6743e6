"""A request's context as tokens: chat messages, a text prompt or token ids, checked against its session.

Chat messages: the messages before the first assistant one are the prompt (the session's prompt when
they are its one user message, else the chat template's rendering with the generation prompt, as the
data pipeline renders prompts); then each assistant message is its recorded turn's sampled tokens
when its content is that turn's reply, and the messages after it are the chat format's
`observations_ids`. A text prompt continues a text session when it starts with the session's text;
what follows is encoded and appended. Each result is checked by `Session.check_continues` (409).
"""

from __future__ import annotations

from typing import Any

from entrepot.grpo.agents.sessions import HistoryMismatch, RequestRefused, Session
from entrepot.grpo.multiturn.chat import CharChat, ChatFormat, Message

__all__ = ["chat_ids", "encode", "parse_messages", "text_ids", "token_ids"]


def encode(tokenizer: Any, text: str, what: str) -> list[int]:
    """`text`'s tokens (no special tokens); one the tokenizer cannot encode is a 400 naming `what`."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except ValueError as exc:
        raise RequestRefused(400, "invalid_request_error", f"{what} cannot be encoded: {exc}") from None


def parse_messages(value: Any) -> list[Message]:
    """`messages` as ``{"role", "content"}`` dicts of str; anything else is a 400 naming the message."""
    if not isinstance(value, list) or not value:
        raise RequestRefused(400, "invalid_request_error", "messages must be a non-empty list of messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestRefused(400, "invalid_request_error", f"messages[{i}] must be an object with a role")
        content = message.get("content")
        if not isinstance(content, str):
            raise RequestRefused(
                400,
                "invalid_request_error",
                f"messages[{i}].content must be a string (got {type(content).__name__}): tool calls and "
                "results travel as text in the content",
            )
        out.append({"role": message["role"], "content": content})
    return out


def _prompt_ids(session: Session, prompt: list[Message], chat: ChatFormat, tokenizer: Any) -> list[int]:
    one_user = len(prompt) == 1 and prompt[0]["role"] == "user"
    if session.prompt is not None and one_user and prompt[0]["content"] == session.prompt_text:
        return list(session.prompt)
    if isinstance(chat, CharChat):
        if not one_user:
            raise RequestRefused(
                400, "invalid_request_error", "the character tokenizer's prompt is one user message"
            )
        return encode(tokenizer, prompt[0]["content"], "messages[0].content")
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def chat_ids(session: Session, messages: list[Message], chat: ChatFormat, tokenizer: Any) -> list[int]:
    """The tokens a chat request's reply continues (see the module docstring)."""
    if messages[-1]["role"] == "assistant":
        raise RequestRefused(
            400,
            "invalid_request_error",
            "the last message must not be an assistant one: a reply follows a message",
        )
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    if first == 0:
        raise RequestRefused(
            400, "invalid_request_error", "messages must start with a prompt, not an assistant one"
        )
    if session.prompt is None and not session.turns:  # a new client session: the whole request is its prompt
        if isinstance(chat, CharChat) or first == len(messages):
            return _prompt_ids(session, messages, chat, tokenizer)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    ids = _prompt_ids(session, messages[:first], chat, tokenizer)
    k, i = 0, first
    while i < len(messages):
        content = messages[i]["content"]
        j = next(
            (n for n in range(i + 1, len(messages)) if messages[n]["role"] == "assistant"), len(messages)
        )
        if k >= len(session.turns):
            raise HistoryMismatch(
                k, len(ids), f"messages[{i}], an assistant message the server did not sample,"
            )
        turn = session.turns[k]
        reply = turn.sampled if content == turn.text else _lenient(tokenizer, content)
        stopped = bool(reply) and reply[-1] in chat.stop_token_ids
        try:
            ids += reply + chat.observations_ids(messages[i + 1 : j], stopped=stopped)
        except Exception as exc:  # a template or alphabet that cannot render the message
            raise RequestRefused(
                400, "invalid_request_error", f"messages[{i + 1}:{j}] cannot be rendered: {exc}"
            ) from None
        k, i = k + 1, j
    session.check_continues(ids, "the request's messages")
    return ids


def _lenient(tokenizer: Any, text: str) -> list[int]:
    """An edited reply's tokens, for finding where it differs ([] when it does not even encode)."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except ValueError:
        return []


def text_ids(session: Session, prompt: Any, tokenizer: Any) -> list[int]:
    """The tokens a text completion continues: the session's tokens and the prompt's new text."""
    if not isinstance(prompt, str):
        raise RequestRefused(
            400, "invalid_request_error", "prompt must be a string (token ids: /v1/completions/tokens)"
        )
    if session.turns and session.text is not None and prompt.startswith(session.text):
        ids = session.recorded() + encode(tokenizer, prompt[len(session.text) :], "prompt")
    else:
        ids = encode(tokenizer, prompt, "prompt")
    session.check_continues(ids, "the prompt")
    return ids


def token_ids(session: Session, ids: Any, tokenizer: Any) -> list[int]:
    """A token request's context: `ids` checked to be token ids of the vocabulary continuing `session`."""
    vocab = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.vocab_size
    valid = isinstance(ids, list) and ids and all(isinstance(i, int) and 0 <= i < vocab for i in ids)
    if not valid:
        raise RequestRefused(
            400,
            "invalid_request_error",
            f"prompt_token_ids must be a non-empty list of token ids in [0, {vocab})",
        )
    session.check_continues(ids, "prompt_token_ids")
    return list(ids)
