"""The environment interface of multi-turn rollouts, and how a run finds its environment.

One `Environment` per trajectory: `reset(row)` once with the data row (its prompt is the first user
message, already in the trajectory), then `step(action)` after every model turn with the turn's
text, answering a `Step`: the next message (or none, when done) and a reward. Either method may be
``async def``; plain ones run on the rollout's environment threads. Many trajectories are in flight at
once, so a slow call holds up only its own trajectory (`runner`).

A run names its environment in ``multiturn.environment``: a built-in name (`register_environment`)
or a dotted path ``"my_pkg.envs:MyEnv"`` to a class or factory taking ``multiturn.env_args`` as
keyword arguments, loaded like ``reward.custom``'s verifiers.
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from entrepot.grpo.errors import GRPOConfigError

__all__ = [
    "EnvFactory",
    "Environment",
    "Row",
    "Step",
    "available_environments",
    "load_environment",
    "register_environment",
    "step_problem",
]


@dataclass(frozen=True)
class Row:
    """The data row a trajectory starts from.

    Attributes:
        prompt: the prompt's text (the first user message).
        answer: the reference answer's text.
        index: the trajectory's dock row (unique within a step).
    """

    prompt: str
    answer: str
    index: int


@dataclass(frozen=True)
class Step:
    """What the environment answers to a model turn.

    Every field is checked when the rollout receives it (`step_problem`); a Step that breaks this
    contract ends its trajectory as ``env_malformed`` (counted in ``multiturn/end_env_malformed`` and
    ``multiturn/env_failures``, shown as the sample's ``end``), never the run.

    Attributes:
        observation: the next message's text, a str (None with `done`: nothing more to say).
        reward: added to the trajectory's reward (its sum is what GRPO normalises per group); a finite
            number.
        done: the trajectory ends here (a bool).
        role: the next message's chat role, a str ("user" for feedback, "tool" for a tool's result).
        info: numbers to report, averaged over trajectories as ``env/<key>`` metrics: str keys and
            finite numbers (a bool counts as 0 or 1); text has no mean, so a str value is malformed
            (put text in the observation). ``correct`` in the last step's says whether the trajectory
            counts as accurate (default: reward >= 1) and must be 0 or 1 (or a bool).
    """

    observation: str | None = None
    reward: float = 0.0
    done: bool = False
    role: str = "user"
    info: Mapping[str, float] = field(default_factory=dict)


def step_problem(step: Any) -> str:
    """What is wrong with a `step()` answer ("" when it keeps the `Step` contract)."""
    if not isinstance(step, Step):
        return f"a {type(step).__name__}, not a Step"
    if not _finite(step.reward):
        return f"reward {step.reward!r}, not a finite number"
    if not isinstance(step.done, bool):
        return f"done {step.done!r}, not a bool"
    if not step.done and not isinstance(step.observation, str):
        return f"observation {step.observation!r} without done (a message is a str)"
    if not isinstance(step.role, str):
        return f"role {step.role!r}, not a str"
    if not isinstance(step.info, Mapping):
        return f"info of type {type(step.info).__name__}, not a mapping of str to numbers"
    for key, value in step.info.items():
        if not isinstance(key, str):
            return f"info key {key!r}, not a str"
        if not _finite(value):
            return f"info[{key!r}] {value!r}, not a finite number"
    if "correct" in step.info and float(step.info["correct"]) not in (0.0, 1.0):
        return f"info['correct'] {step.info['correct']!r}, not 0 or 1"
    return ""


def _finite(value: Any) -> bool:
    """Whether `value` is a real number (a bool included) and finite."""
    return isinstance(value, numbers.Real) and math.isfinite(float(value))


class Environment:
    """Base class of an environment (subclass it, or give any object with these two methods).

    Attributes:
        stop: texts that end a model turn besides the chat format's end of turn, as generation stops
            at a tool call's closing tag (each must be one token of the run's tokenizer); the
            environment's message then begins with the end of turn the model did not write.
    """

    stop: tuple[str, ...] = ()

    def reset(self, row: Row) -> Awaitable[None] | None:
        """Start a trajectory for `row` (read its prompt and answer)."""

    def step(self, action: str) -> Step | Awaitable[Step]:
        """Answer the model's turn `action` (its text, special tokens left out)."""
        raise NotImplementedError


EnvFactory = Callable[..., Any]
"""Makes one environment (an object with `reset` and `step`) from keyword arguments."""

_BUILT_IN: dict[str, Callable[[], EnvFactory]] = {}


def register_environment(name: str, factory: Callable[[], EnvFactory]) -> None:
    """Register a built-in environment: `factory()` returns its class (imported when a run uses it)."""
    _BUILT_IN[name] = factory


def available_environments() -> list[str]:
    """The built-in environments' names."""
    return sorted(_BUILT_IN)


def load_environment(spec: str, key: str = "multiturn.environment") -> EnvFactory:
    """The class or factory `spec` names: a built-in name or ``"package.module:attribute"``.

    A name that is neither, or a path that does not import or is not callable, is a
    `GRPOConfigError` naming `key`.
    """
    if spec in _BUILT_IN:
        return _BUILT_IN[spec]()
    module_name, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module_name or not attr:
        known = ", ".join(available_environments())
        raise GRPOConfigError(
            f"{key} ({spec!r}) must be a built-in environment ({known}) or 'module:attribute'"
        )
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise GRPOConfigError(f"{key} ({spec!r}) cannot be imported: {exc}") from exc
    if not callable(factory):
        raise GRPOConfigError(f"{key} ({spec!r}) must be a class or a function, got {type(factory).__name__}")
    return factory


def _calculator() -> EnvFactory:
    from entrepot.grpo.multiturn.calculator import CalculatorEnv

    return CalculatorEnv


register_environment("calculator", _calculator)
