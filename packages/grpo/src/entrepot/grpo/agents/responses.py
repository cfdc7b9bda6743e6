"""The OpenAI-shaped body of a completion, with the ``entrepot`` extension (sampled ids, log-probs,
policy version, session and turn): what the `openai` client parses, its extra fields kept."""

from __future__ import annotations

import secrets
import time
from typing import Any

from entrepot.grpo.agents.serving import TurnOut

__all__ = ["completion_body"]


def completion_body(
    kind: str, model: str, text: str, finish: str, prompt_tokens: int, session: str, turn: int, out: TurnOut
) -> dict[str, Any]:
    """The OpenAI-shaped body of one completion, with the ``entrepot`` extension."""
    created = int(time.time())
    extension = {
        "token_ids": out.token_ids,
        "logprobs": out.logprobs,
        "policy_version": out.version,
        "session": session,
        "turn": turn,
    }
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(out.token_ids),
        "total_tokens": prompt_tokens + len(out.token_ids),
    }
    rid = f"cmpl-{secrets.token_hex(8)}"
    if kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": None,
        }
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage,
            "entrepot": extension,
        }
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
        "entrepot": extension,
    }
