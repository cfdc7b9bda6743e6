"""How responses are scored: the `reward` section (rule verifiers and learned reward models)."""

from __future__ import annotations

from dataclasses import dataclass, field

from entrepot.grpo.config.fields import check, doc

__all__ = ["RewardConfig"]


@dataclass(kw_only=True)
class RewardConfig:
    """Rule verifiers and their weights; user verifiers are imported by dotted path."""

    verifiers: dict[str, float] = field(
        default_factory=lambda: {"partial_credit": 1.0},
        metadata=doc(
            "Verifier name -> weight. Built in: exact_match, gsm8k (the number after '####'; none, 0), "
            "gsm8k_lenient (gsm8k, or the last number without '####'), boxed_math (the last \\boxed{}), "
            "format, partial_credit. The math ones compare with math-verify against the gold answer's "
            "'#### 72', \\boxed{72} or plain 72."
        ),
    )
    custom: dict[str, str] = field(
        default_factory=dict,
        metadata=doc(
            "Extra verifiers to register: name -> 'package.module:function' (or 'package.module.function')."
        ),
    )
    accuracy_verifier: str = field(
        default="exact_match", metadata=doc("Verifier whose score >= 1 counts as a correct answer.")
    )
    models: dict[str, float] = field(
        default_factory=dict,
        metadata=doc(
            "Learned reward models: local HF directory -> weight. A sequence-classification model "
            "(num_labels 1) or a causal LM with a TRL value head; each scores prompt + response with "
            "its own tokenizer, and the weighted scores add to the verifiers'."
        ),
    )
    model_micro_batch: int = field(default=16, metadata=doc("Sequences per forward pass of a reward model."))
    overlong_buffer: int = field(
        default=0,
        metadata=doc(
            "DAPO overlong shaping: responses longer than (generation budget - overlong_buffer) tokens "
            "lose overlong_penalty x (excess / overlong_buffer) reward (up to overlong_penalty at the "
            "budget); 0 = off."
        ),
    )
    overlong_penalty: float = field(
        default=1.0,
        metadata=doc("Reward a response of the full budget loses (with overlong_buffer)."),
    )

    def __post_init__(self) -> None:
        check(
            bool(self.verifiers or self.models),
            "reward.verifiers",
            self.verifiers,
            "at least one verifier (or a reward model in reward.models)",
        )
        check(self.model_micro_batch >= 1, "reward.model_micro_batch", self.model_micro_batch, ">= 1")
        check(self.overlong_buffer >= 0, "reward.overlong_buffer", self.overlong_buffer, ">= 0 (0 = off)")
        check(self.overlong_penalty >= 0, "reward.overlong_penalty", self.overlong_penalty, ">= 0")
        for path, weight in self.models.items():
            check(bool(path), "reward.models", self.models, "local directory -> weight, no empty path")
            check(isinstance(weight, (int, float)), f"reward.models.{path}", weight, "a number")
