"""Sessions: one episode's turns exactly as sampled, and the check that a request continues them.

A session records each model turn: the context it continued (every token before it) and the tokens it
sampled. A request continues a session when its rendering starts with everything recorded (the last
context and its reply) and adds the environment's part after it. Rendering is token-exact: an
assistant message whose content is a recorded reply's text stands for that reply's sampled tokens,
and the messages after it are the chat format's `observations_ids` (`multiturn.chat`), as in a
multi-turn rollout. A request whose earlier messages render otherwise (an edited history, a dropped
turn) is refused with `HistoryMismatch` (HTTP 409) naming the turn and the first differing token:
refusing keeps every trajectory a sequence the policy sampled, never a re-tokenized guess.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from entrepot.grpo.config.multiturn import MultiTurnConfig
from entrepot.grpo.multiturn.trajectory import EndReason

__all__ = ["HistoryMismatch", "RequestRefused", "Session", "Turn", "first_difference"]


class RequestRefused(Exception):
    """A request the server answers with a JSON error: HTTP `status`, OpenAI's ``type`` and a message."""

    def __init__(self, status: int, kind: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.extra = status, kind, message, extra

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.kind, "message": self.message, **self.extra}}


class HistoryMismatch(RequestRefused):
    """The request's history does not render to the recorded tokens (HTTP 409)."""

    def __init__(self, turn: int, token: int, what: str) -> None:
        super().__init__(
            409,
            "history_mismatch",
            f"turn {turn}: {what} renders differently from the tokens recorded for this session from token "
            f"{token} on; send the history as the server answered it (edited histories are refused)",
            turn=turn,
            first_differing_token=token,
        )


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where `a` and `b` differ (the shorter one's length if one starts the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class Turn:
    """One sampled model turn: the context it continued, its tokens and log-probs, and its text."""

    context: list[int]
    sampled: list[int]
    logprobs: list[float]
    text: str  # the reply's text as answered (chat content; a completion's text)
    version: int


@dataclass
class Session:
    """One episode's turns (see the module docstring).

    Attributes:
        prompt: the tokens the first turn must continue (the dock row's prompt), or None: whatever the
            first request renders to (a session the server opened for a client).
        prompt_text: the prompt's text as one user message, which stands for `prompt` in a chat request.
        kind: "chat", "text" or "tokens": the route of the first request (one route per session).
        text: a text session's text so far (the last prompt and its completion).
        limit: the limit a request was refused at (max_turns, max_tokens, observation_too_long), if any.
        closed: the episode ended; later requests are refused.
    """

    prompt: list[int] | None = None
    prompt_text: str | None = None
    turns: list[Turn] = field(default_factory=list)
    kind: str | None = None
    text: str | None = None
    limit: EndReason | None = None
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def recorded(self) -> list[int]:
        """Every token of the session so far: the last turn's context and reply (or the prompt)."""
        if self.turns:
            return [*self.turns[-1].context, *self.turns[-1].sampled]
        return list(self.prompt or [])

    def turn_of(self, token: int) -> int:
        """The recorded turn whose context or reply holds position `token` (the next turn past them)."""
        for i, turn in enumerate(self.turns):
            if token < len(turn.context) + len(turn.sampled):
                return i
        return len(self.turns)

    def start_prompt(self) -> list[int]:
        return self.turns[0].context if self.turns else list(self.prompt or [])

    def check_continues(self, ids: list[int], what: str) -> None:
        """Refuse `ids` unless they are the recorded tokens (exactly, before the first turn) and more."""
        recorded = self.recorded()
        if self.turns:  # the recorded tokens, then at least one more (the new messages)
            at = first_difference(recorded, ids[: len(recorded)])
            at = len(ids) if at is None and len(ids) <= len(recorded) else at
        elif self.prompt is not None:
            at = first_difference(recorded, ids)
        else:
            at = None
        if at is not None:
            raise HistoryMismatch(self.turn_of(at), at, what)

    def check_limits(self, ids: list[int], config: MultiTurnConfig) -> int:
        """The tokens the next turn may take after `ids`; a limit reached is refused (HTTP 400) and kept
        as the episode's end reason."""
        used = len(ids) - len(self.start_prompt())
        new = len(ids) - len(self.recorded()) if self.turns else 0
        if len(self.turns) >= config.max_turns:
            self._refuse(EndReason.MAX_TURNS, f"{len(self.turns)} model turns: multiturn.max_turns reached")
        if new > config.max_observation_tokens:
            self._refuse(
                EndReason.OBSERVATION_TOO_LONG,
                f"the new messages are {new} tokens > "
                f"multiturn.max_observation_tokens ({config.max_observation_tokens})",
            )
        if used >= config.max_tokens:
            self._refuse(
                EndReason.MAX_TOKENS,
                f"{used} tokens after the prompt leave no room for a reply: "
                f"multiturn.max_tokens ({config.max_tokens})",
            )
        return config.max_tokens - used

    def _refuse(self, reason: EndReason, message: str) -> None:
        self.limit = reason
        raise RequestRefused(400, "context_length_exceeded", message, limit=reason.label)

    def record(self, turn: Turn) -> None:
        if self.closed:
            raise RequestRefused(409, "session_closed", "the episode of this session has ended")
        self.turns.append(turn)
