"""Multi-turn rollouts with an environment: the `multiturn` section.

Without `environment` or `agent` a response is one model turn (the default). With `environment`, each
prompt row starts a trajectory: the model's turn, the environment's answer, the model's next turn, ...
until the environment says done or a limit ends it (`entrepot.grpo.multiturn`). With `agent`, user
code drives each trajectory through an OpenAI-compatible endpoint serving the policy
(`entrepot.grpo.agents`).
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
    agent: str | None = field(
        default=None,
        metadata=doc(
            "null: no agent. A dotted path 'my_pkg.agents:solve' to an async function (client: "
            "openai.AsyncOpenAI, row: dict) -> float (the reward), run once per trajectory against the "
            "policy served over HTTP; exclusive with multiturn.environment."
        ),
    )
    agent_concurrency: int = field(default=32, metadata=doc("Agent episodes running at once."))
    agent_timeout_s: float = field(
        default=120.0,
        metadata=doc("Seconds one agent episode may take before its trajectory ends (agent_timeout)."),
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
            ("agent_concurrency", self.agent_concurrency, 1),
        ):
            check(value >= low, f"multiturn.{key}", value, f">= {low}")
        check(self.env_timeout_s > 0, "multiturn.env_timeout_s", self.env_timeout_s, "> 0")
        check(self.agent_timeout_s > 0, "multiturn.agent_timeout_s", self.agent_timeout_s, "> 0")
        if self.agent is not None:
            check(":" in self.agent and all(self.agent.partition(":")[::2]), "multiturn.agent", self.agent,
                  "'module:function' (an async function (client, row) -> float)")  # fmt: skip
            check(self.environment is None, "multiturn.agent", self.agent,
                  f"null with multiturn.environment set ({self.environment!r}): a trajectory is driven by an "
                  "environment or by an agent, not both")  # fmt: skip
        if self.environment is not None:
            check(bool(self.environment.strip()), "multiturn.environment", self.environment,
                  "a built-in name or 'module:attribute'")  # fmt: skip

    @property
    def enabled(self) -> bool:
        """Whether rollouts are multi-turn (an environment or an agent)."""
        return self.environment is not None or self.agent is not None
