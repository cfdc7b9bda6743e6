"""The names of a config that registries resolve later, each checked before a run starts.

Most names in a config are closed sets its own fields check as it loads (``Literal`` fields: the
loss, the KL estimator, the engines, the task, the architecture, the correction). The open sets live
in registries that user code extends, and were only looked up once the workers ran: the reward
verifiers (the keys of ``reward.verifiers`` and ``reward.accuracy_verifier``, after ``reward.custom``
registered its own) and the multi-turn environments (``multiturn.environment``, checked where
`preflight.check_inputs` imports it). A miss names the key and lists the known names.
"""

from __future__ import annotations

from entrepot.grpo.config.reward import RewardConfig
from entrepot.grpo.data import rewards
from entrepot.grpo.errors import UnknownRewardError

__all__ = ["check_reward_names"]


def check_reward_names(reward: RewardConfig, format_check: str | None = None) -> None:
    """Raise `UnknownRewardError` naming the key when a verifier `reward` names is not registered.

    Call it after `rewards.resolve_custom(reward.custom)`, which registers the run's own verifiers.
    `format_check` is ``audit.format_check`` (a verifier the audit uses as its format-only check).
    """
    named = [(f"reward.verifiers.{name}", name) for name in reward.verifiers]
    named += [("audit.format_check", format_check)] if format_check is not None else []
    for key, name in [*named, ("reward.accuracy_verifier", reward.accuracy_verifier)]:
        if name not in rewards.available_verifiers():
            known = ", ".join(rewards.available_verifiers())
            raise UnknownRewardError(
                f"{key} ({name!r}) is not a known verifier; known: {known} (reward.custom registers more)"
            )
