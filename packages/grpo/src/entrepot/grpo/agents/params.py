"""A completion request's parameters, checked: every bad one is a `RequestRefused` (HTTP 4xx) naming it.

The server samples with the run's sampling (`rollout.temperature`, `top_p`, `top_k`): the trainer's
log-probs and the off-policy correction assume it, so a request may restate it but not change it.
`max_tokens` caps the reply (within the trajectory's budget); `stop` adds stop texts, each one token,
kept in the reply as sampled (as vLLM's ``include_stop_str_in_output``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from entrepot.grpo.agents.sessions import RequestRefused
from entrepot.grpo.engines.base import SamplingParams

__all__ = ["TurnRequest", "parse_request"]

_UNSUPPORTED = {"tools": "tool calls travel as text in the content", "logit_bias": "", "response_format": ""}


@dataclass(frozen=True)
class TurnRequest:
    """What a request asks of the next turn: a token cap and extra stop tokens."""

    max_tokens: int | None
    stops: tuple[int, ...]


def _bad(message: str, param: str) -> RequestRefused:
    return RequestRefused(400, "invalid_request_error", message, param=param)


def _number(body: dict[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"{key} ({value!r}) must be a finite number", key)
    return float(value)


def parse_request(body: Any, *, model: str, sampling: SamplingParams, tokenizer: Any) -> TurnRequest:
    """Check a completion request's body against the served `model` and the run's `sampling`."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", "body")
    if body.get("model") != model:
        raise RequestRefused(
            404,
            "model_not_found",
            f"model {body.get('model')!r} is not served; it is {model!r}",
            param="model",
        )
    if body.get("stream"):
        raise _bad("stream=true is not supported: this endpoint answers whole completions", "stream")
    if body.get("n", 1) != 1:
        raise _bad(f"n ({body.get('n')!r}) must be 1: one episode samples one reply a turn", "n")
    for key, why in _UNSUPPORTED.items():
        if body.get(key):
            raise _bad(f"{key} is not supported{': ' + why if why else ''}", key)
    temperature = _number(body, "temperature")
    if temperature is not None and temperature <= 0:
        raise _bad(f"temperature ({temperature:g}) must be > 0", "temperature")
    top_p = _number(body, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise _bad(f"top_p ({top_p:g}) must be in (0, 1]", "top_p")
    for key, given, run in (
        ("temperature", temperature, sampling.temperature),
        ("top_p", top_p, sampling.top_p),
    ):
        if given is not None and given != run:
            raise _bad(
                f"{key} ({given:g}) differs from the run's rollout.{key} ({run:g}), which the trainer's "
                f"log-probs assume: leave it out or pass {run:g}",
                key,
            )
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise _bad(f"max_tokens ({limit!r}) must be an integer >= 1", "max_tokens")
    return TurnRequest(limit, _stops(body, tokenizer))


def _stops(body: dict[str, Any], tokenizer: Any) -> tuple[int, ...]:
    stop = body.get("stop")
    texts = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise _bad("stop must be a string or a list of strings", "stop")
    ids = []
    for text in texts:
        try:
            encoded = list(tokenizer.encode(text, add_special_tokens=False))
        except ValueError:
            encoded = []
        if len(encoded) != 1:
            raise _bad(f"stop text {text!r} must be one token of the policy's tokenizer", "stop")
        ids.append(encoded[0])
    token_ids = body.get("stop_token_ids", [])
    if not isinstance(token_ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in token_ids
    ):
        raise _bad("stop_token_ids must be a list of token ids", "stop_token_ids")
    return tuple(dict.fromkeys((*ids, *token_ids)))
