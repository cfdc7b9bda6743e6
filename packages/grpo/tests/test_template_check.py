"""Chat templates, turn by turn and whole: `HFChat`'s environment tokens and `check_template`'s verdict.

Tokenizers are built here (byte-level, ChatML special tokens), no downloads.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests_support_models import CHATML_TEMPLATE, chatml_tokenizer

from entrepot.grpo.errors import DataError, TemplateError
from entrepot.grpo.multiturn.chat import Message, chat_format
from entrepot.grpo.multiturn.hf_chat import HFChat
from entrepot.grpo.multiturn.template_check import (
    check_template,
    default_conversation,
    require_append_only,
)

_MESSAGE = "<|im_start|>{{ m['role'] }}\n{{ CONTENT }}<|im_end|>\n"  # CONTENT: filled in per template below
_GENERATION = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

# Only the last assistant message keeps its content (earlier ones are written as "...").
LAST_ASSISTANT_ONLY = (
    "{% for m in messages %}"
    + _MESSAGE.replace(
        "{{ CONTENT }}",
        "{% if m['role'] == 'assistant' and not loop.last %}...{% else %}{{ m['content'] }}{% endif %}",
    )
    + "{% endfor %}"
    + _GENERATION
)

# Qwen3-like: earlier assistant messages lose their <think>...</think> reasoning.
STRIPS_EARLIER_REASONING = (
    "{% for m in messages %}"
    + _MESSAGE.replace(
        "{{ CONTENT }}",
        "{% if m['role'] == 'assistant' and not loop.last %}"
        "{{ m['content'].split('</think>')[-1].lstrip('\\n') }}{% else %}{{ m['content'] }}{% endif %}",
    )
    + "{% endfor %}"
    + _GENERATION
)

# A system message appears at the top once a tool has spoken: earlier turns change when one is added.
SYSTEM_ONCE_TOOLS_SPEAK = (
    "{% if messages | selectattr('role', 'equalto', 'tool') | list %}"
    "<|im_start|>system\nTools were used.<|im_end|>\n{% endif %}" + CHATML_TEMPLATE
)

# Refuses every role but user and assistant, as some templates do.
USER_ASSISTANT_ONLY = (
    "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('roles must be user or assistant') }}{% endif %}{% endfor %}" + CHATML_TEMPLATE
)


def _encode(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _whole(tok: Any, conversation: list[Message], add_generation_prompt: bool = False) -> list[int]:
    text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt)
    return _encode(tok, text)


def test_chatml_is_append_only() -> None:
    tok = chatml_tokenizer()
    report = check_template(tok)
    assert report.ok, report.message
    assert report.turns == 5 and report.turn is None and report.role is None
    # turn by turn ends with the last stop token; the whole rendering has "\n" after it
    assert report.tokens == len(_whole(tok, default_conversation())) - 1
    assert report.message == f"append-only: 5 turns, {report.tokens} tokens"
    require_append_only(tok)


def test_template_dropping_earlier_assistant_turns_fails_at_the_first_environment_turn() -> None:
    # the model's first turn is rewritten as soon as a message follows it: appending that message fails
    tok = chatml_tokenizer(LAST_ASSISTANT_ONLY)
    report = check_template(tok)
    assert not report.ok
    assert (report.turn, report.role) == (2, "tool")
    assert report.message.startswith("turn 2 of 5 (tool): ")
    assert "renders the assistant turn (" in report.message and "becomes '...<|im_end|>" in report.message
    with pytest.raises(TemplateError, match="turn 2 of 5"):
        require_append_only(tok)


def test_template_stripping_earlier_reasoning_fails_at_its_turn() -> None:
    tok = chatml_tokenizer(STRIPS_EARLIER_REASONING)
    conversation: list[Message] = [
        {"role": "user", "content": "2 + 3 + 1?"},
        {"role": "assistant", "content": "<calc>2 + 3</calc>"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "<think>one more</think>\n<calc>5 + 1</calc>"},
        {"role": "tool", "content": "6"},
        {"role": "assistant", "content": "6"},
    ]
    assert check_template(tok).ok  # no reasoning in the default conversation: nothing stripped
    report = check_template(tok, conversation)
    assert not report.ok
    assert (report.turn, report.role) == (3, "assistant")
    assert "turn 3 of 5 (assistant)" in report.message
    assert report.expected.split(" | ")[1].startswith("'c' 'a' 'l' 'c'")  # the whole skips the reasoning
    assert report.got.split(" | ")[1].startswith("'t' 'h' 'i' 'n' 'k'")
    assert report.expected in report.message and report.got in report.message


def test_observation_ids_are_the_difference_of_whole_renderings() -> None:
    tok = chatml_tokenizer()
    chat = HFChat(tok)
    assert chat.stop_token_ids == (tok.eos_token_id,)
    answer = "<calc>17 * 24</calc>"
    tool: Message = {"role": "tool", "content": "408"}
    conversation: list[Message] = [
        {"role": "user", "content": "17 * 24?"},
        {"role": "assistant", "content": answer},
    ]
    prompt = _whole(tok, conversation[:1], add_generation_prompt=True)
    extended = _whole(tok, [*conversation, tool], add_generation_prompt=True)
    content_end = len(prompt) + len(_encode(tok, answer))
    assert extended[:content_end] == prompt + _encode(tok, answer)
    assert extended[content_end] == tok.eos_token_id
    assert chat.observation_ids(tool, stopped=True) == extended[content_end + 1 :]
    assert chat.observation_ids(tool, stopped=False) == extended[content_end:]
    assert chat.action_text([*_encode(tok, answer), tok.eos_token_id]) == answer
    assert isinstance(chat_format(tok), HFChat)


def test_no_chat_template_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no chat template"):
        check_template(chatml_tokenizer(chat_template=None))


@pytest.mark.parametrize(
    ("template", "match"),
    [
        (SYSTEM_ONCE_TOOLS_SPEAK, "not append-only for a 'tool' message"),
        (USER_ASSISTANT_ONLY, "cannot render a 'tool'"),
    ],
)
def test_tool_rendering_that_does_not_extend_is_a_template_error(template: str, match: str) -> None:
    tok = chatml_tokenizer(template)
    with pytest.raises(TemplateError, match=match):
        HFChat(tok).observation_ids({"role": "tool", "content": "408"}, stopped=True)
    report = check_template(tok)
    assert not report.ok
    assert (report.turn, report.role) == (2, "tool")
    assert report.message.startswith("turn 2 of 5 (tool): ") and match in report.message


def test_user_role_environment_passes_a_template_refusing_tools() -> None:
    assert check_template(chatml_tokenizer(USER_ASSISTANT_ONLY), default_conversation("user")).ok


def test_conversation_must_alternate_and_end_with_the_model() -> None:
    tok = chatml_tokenizer()
    with pytest.raises(DataError, match="ends with an assistant message"):
        check_template(tok, default_conversation()[:-1])
    with pytest.raises(DataError, match="alternates assistant and environment"):
        check_template(tok, [*default_conversation(), default_conversation()[-1]])
