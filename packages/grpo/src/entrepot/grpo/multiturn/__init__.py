"""Multi-turn rollouts: an environment answers each model turn, token in, token out.

- `environment`: the `Environment` interface (`reset`, `step` -> `Step`) and how a run loads one.
- `tools`: tool calling on top (`ToolEnvironment`, a call parsed, a function run with a timeout).
- `chat`, `hf_chat`: the environment's messages as tokens, appended, never re-tokenized.
- `runner`: `MultiTurnRollout`, trajectories in flight over any rollout engine.
- `template_check`: whether a chat template is append-only (`rl grpo check-template`).
- `calculator`: the built-in task, addition with a calculator tool.
"""

from __future__ import annotations

from typing import Any

from entrepot.grpo.config.multiturn import MultiTurnConfig
from entrepot.grpo.multiturn.environment import Environment, Row, Step, load_environment, register_environment
from entrepot.grpo.multiturn.runner import MultiTurnRollout
from entrepot.grpo.multiturn.tools import ToolCall, ToolEnvironment
from entrepot.grpo.multiturn.trajectory import EndReason, Trajectory

__all__ = [
    "EndReason",
    "Environment",
    "MultiTurnRollout",
    "Row",
    "Step",
    "ToolCall",
    "ToolEnvironment",
    "Trajectory",
    "build_multiturn",
    "load_environment",
    "register_environment",
    "stop_token_ids",
]


def build_multiturn(config: MultiTurnConfig, tokenizer: Any) -> MultiTurnRollout | None:
    """The multi-turn rollout of `config` with `tokenizer`'s chat format (None: single-turn)."""
    if config.environment is None:
        return None
    from entrepot.grpo.multiturn.chat import chat_format

    factory = load_environment(config.environment)
    return MultiTurnRollout(config, chat_format(tokenizer), factory, stop_token_ids(factory, tokenizer))


def stop_token_ids(factory: Any, tokenizer: Any, key: str = "multiturn.environment") -> tuple[int, ...]:
    """The token of each of the environment class's `stop` texts; one that is not a single token is a
    `GRPOConfigError` naming `key`."""
    from entrepot.grpo.errors import GRPOConfigError

    ids = []
    for text in getattr(factory, "stop", ()):
        try:
            encoded = list(tokenizer.encode(text, add_special_tokens=False))
        except ValueError as exc:
            raise GRPOConfigError(f"{key}: its stop text {text!r} cannot be encoded: {exc}") from None
        if len(encoded) != 1:
            raise GRPOConfigError(
                f"{key}: its stop text {text!r} is {len(encoded)} tokens of this tokenizer, not one"
            )
        ids.append(encoded[0])
    return tuple(ids)
