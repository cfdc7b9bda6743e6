"""Synchronous or asynchronous training: the `trainer` section.

Synchronous (the default): a step rolls out, scores and trains its own prompts, lockstep. Asynchronous:
rollout runs all the time on a thread of its own with its own copy of the weights, training takes a
step's worth of finished groups as soon as they are ready, and each update's weights reach the
rollout between two of its chunks (`entrepot.grpo.asynchronous`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from entrepot.grpo.config.fields import check, check_choice, doc

__all__ = ["StalenessPolicy", "TrainerConfig", "TrainerMode"]

TrainerMode = Literal["sync", "async"]
StalenessPolicy = Literal["wait", "drop"]
ASYNC_MAX_STALENESS = 1  # async's bound when trainer.max_staleness is null; partial rollout's is none


@dataclass(kw_only=True)
class TrainerConfig:
    """How rollout and training take turns."""

    mode: TrainerMode = field(
        default="sync",
        metadata=doc(
            "sync: rollout, reward, update, one after another each step. async: rollout runs "
            "continuously beside training (one process: a thread of its own), a step trains the "
            "oldest finished groups, new weights reach the rollout between its chunks (the grpo "
            "package's docs/training-modes.md)."
        ),
    )
    max_staleness: int | None = field(
        default=None,
        metadata=doc(
            "Policy versions (steps) the oldest token of a trained group may lag the policy it trains; "
            "0 = every token sampled by the policy being updated. One bound for both schedules that "
            "train stale tokens: async (staleness_policy holds the rollout back or drops groups) and "
            "partial rollout (rollout.partial_max_tokens: the dock drops older groups, dock/rows_stale). "
            "null = each one's default: 1 for async, no bound for partial rollout."
        ),
    )
    staleness_policy: StalenessPolicy = field(
        default="wait",
        metadata=doc(
            "async: wait = the rollout starts a prompt only when it will be trained within "
            "max_staleness versions, and steps train groups in the order their prompts were drawn "
            "(no prompt is ever dropped); drop = the rollout runs ahead, steps train whichever "
            "groups finish first and drop those past max_staleness (metric async/groups_dropped)."
        ),
    )
    chunk_tokens: int = field(
        default=64,
        metadata=doc(
            "async: tokens the rollout decodes per response between two looks at new weights and "
            "free slots; an unfinished response continues under the newest weights, each token "
            "tagged with the version that sampled it. Smaller: fresher tokens, more re-encoding of "
            "what a response has (no KV cache is kept between chunks; bench_async.py's sweep)."
        ),
    )
    rollout_slots: int | None = field(
        default=None,
        metadata=doc(
            "async: responses the rollout decodes at once (finished ones are replaced by new "
            "prompts' at the next chunk); null = every response the staleness bound lets it have "
            "going: (max_staleness + 1) x prompts_per_step x n_samples_per_prompt."
        ),
    )
    rollout_resources: dict[str, float] = field(
        default_factory=dict,
        metadata=doc(
            "async on Ray: custom resources the rollout rank reserves, e.g. {rollout_node: 1} to put it "
            "on the nodes started with --resources='{\"rollout_node\": 1}' (rollout and training on "
            "different nodes). Empty: wherever Ray has room."
        ),
    )
    weight_sync_timeout_s: float = field(
        default=300.0,
        metadata=doc(
            "async: longest the rollout may take to load published weights, and a step may wait for "
            "the rollout's groups beyond resources.stage_timeout_s; past it the run fails naming "
            "the rollout rank."
        ),
    )

    def __post_init__(self) -> None:
        check_choice("trainer.mode", self.mode, ("sync", "async"))
        check_choice("trainer.staleness_policy", self.staleness_policy, ("wait", "drop"))
        if self.max_staleness is not None:
            check(self.max_staleness >= 0, "trainer.max_staleness", self.max_staleness, ">= 0 or null")
        check(self.chunk_tokens >= 1, "trainer.chunk_tokens", self.chunk_tokens, ">= 1")
        if self.rollout_slots is not None:
            check(self.rollout_slots >= 1, "trainer.rollout_slots", self.rollout_slots, ">= 1 or null")
        for name, amount in self.rollout_resources.items():
            check(bool(name.strip()) and name not in ("CPU", "GPU") and amount > 0,
                  f"trainer.rollout_resources.{name}", amount,
                  "a positive amount of a custom resource (CPUs, GPUs: resources, engine)")  # fmt: skip
        check(self.weight_sync_timeout_s > 0, "trainer.weight_sync_timeout_s", self.weight_sync_timeout_s,
              "> 0")  # fmt: skip

    @property
    def asynchronous(self) -> bool:
        return self.mode == "async"

    @property
    def async_max_staleness(self) -> int:
        """The bound async training enforces: `max_staleness`, or 1 when it is null (the async default)."""
        return ASYNC_MAX_STALENESS if self.max_staleness is None else self.max_staleness
