"""Multi-turn rollouts with an environment: the `multiturn` section.

Without `environment` a response is one model turn (the default). With it, each prompt row starts a
trajectory: the model's turn, the environment's answer, the model's next turn, ... until the
environment says done or a limit ends it (`entrepot.grpo.multiturn`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from entrepot.grpo.config.fields import check, doc

__all__ = ["EnvArg", "MultiTurnConfig"]

EnvArg = int | float | str | bool


@dataclass(kw_only=True)
class MultiTurnConfig:
    """The environment of multi-turn rollouts and the limits of a trajectory."""

    environment: str | None = field(
        default=None,
        metadata=doc(
            "null: single-turn responses. A built-in environment ('calculator') or a dotted path "
            "'my_pkg.envs:MyEnv' to a class (or factory) making one environment per trajectory."
        ),
    )
    env_args: dict[str, EnvArg] = field(
        default_factory=dict, metadata=doc("Keyword arguments of the environment's constructor.")
    )
    max_turns: int = field(default=4, metadata=doc("Model turns a trajectory may take."))
    max_tokens: int = field(
        default=256,
        metadata=doc(
            "Tokens a trajectory may hold after its prompt, the model's and the environment's; a model turn "
            "gets what is left (at most rollout.max_new_tokens)."
        ),
    )
    max_observation_tokens: int = field(
        default=64,
        metadata=doc(
            "Tokens one environment message may take; a longer one ends the trajectory "
            "(reason observation_too_long), never cut."
        ),
    )
    env_timeout_s: float = field(
        default=30.0, metadata=doc("Seconds one environment call may take before its trajectory ends.")
    )
    env_concurrency: int = field(
        default=64,
        metadata=doc("Environment calls running at once (threads); 1 = one call at a time."),
    )
    fail_fast: bool = field(
        default=False,
        metadata=doc(
            "An environment that raises, times out or returns something malformed fails the step "
            "(EnvironmentFailure) instead of ending only its trajectory: for debugging an environment."
        ),
    )

    def __post_init__(self) -> None:
        for key, value, low in (
            ("max_turns", self.max_turns, 1),
            ("max_tokens", self.max_tokens, 2),
            ("max_observation_tokens", self.max_observation_tokens, 1),
            ("env_concurrency", self.env_concurrency, 1),
        ):
            check(value >= low, f"multiturn.{key}", value, f">= {low}")
        check(self.env_timeout_s > 0, "multiturn.env_timeout_s", self.env_timeout_s, "> 0")
        if self.environment is not None:
            check(bool(self.environment.strip()), "multiturn.environment", self.environment,
                  "a built-in name or 'module:attribute'")  # fmt: skip

    @property
    def enabled(self) -> bool:
        """Whether rollouts are multi-turn."""
        return self.environment is not None
