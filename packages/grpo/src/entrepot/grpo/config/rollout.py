"""How responses are sampled each step: the `rollout` section."""

from __future__ import annotations

from dataclasses import dataclass, field

from entrepot.grpo.config.fields import check, doc

__all__ = ["RolloutConfig"]


@dataclass(kw_only=True)
class RolloutConfig:
    """How many responses are sampled per step and how."""

    prompts_per_step: int = field(default=32, metadata=doc("Prompts drawn from the dataset each step."))
    n_samples_per_prompt: int = field(
        default=8, metadata=doc("Responses sampled per prompt (the GRPO group size).")
    )
    temperature: float = field(default=1.0, metadata=doc("Sampling temperature (> 0)."))
    top_p: float = field(default=1.0, metadata=doc("Nucleus sampling mass in (0, 1]; 1 disables."))
    top_k: int = field(default=0, metadata=doc("Keep the k most likely tokens; 0 disables."))
    max_new_tokens: int | None = field(
        default=None,
        metadata=doc(
            "Response token budget; None = the fixed answer width of a synthetic task (64 for files)."
        ),
    )
    stop_on_eos: bool = field(default=True, metadata=doc("Stop a response at the tokenizer's EOS token."))
    partial_max_tokens: int | None = field(
        default=None,
        metadata=doc(
            "Partial rollout: new tokens a response gets per step; an unfinished one stays in the dock and "
            "continues next step under the new weights (each token keeps its behaviour log-prob and "
            "policy version). The step trains the groups that finished. None = whole responses."
        ),
    )
    max_age: int | None = field(
        default=None,
        metadata=doc(
            "Partial rollout: steps a response may span; in its last one it runs to the end "
            "(a forced completion). None = as many as the token budget needs."
        ),
    )

    def __post_init__(self) -> None:
        check(self.prompts_per_step >= 1, "rollout.prompts_per_step", self.prompts_per_step, ">= 1")
        if self.partial_max_tokens is not None:
            check(self.partial_max_tokens >= 1, "rollout.partial_max_tokens", self.partial_max_tokens,
                   ">= 1 or null")  # fmt: skip
        if self.max_age is not None:
            check(self.max_age >= 1 and self.partial_max_tokens is not None, "rollout.max_age", self.max_age,
                   ">= 1, with rollout.partial_max_tokens set (or null)")  # fmt: skip
        check(
            self.n_samples_per_prompt >= 2,
            "rollout.n_samples_per_prompt",
            self.n_samples_per_prompt,
            ">= 2 (the step trains prompt groups; the grpo, rloo and reinforce_pp_baseline advantages "
            "compare a response with its group: rloo's baseline is the other n - 1)",
        )
        check(self.temperature > 0, "rollout.temperature", self.temperature, "> 0")
        check(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "in (0, 1]")
        check(self.top_k >= 0, "rollout.top_k", self.top_k, ">= 0")
        if self.max_new_tokens is not None:
            check(self.max_new_tokens >= 1, "rollout.max_new_tokens", self.max_new_tokens, ">= 1 or null")

    @property
    def batch_size(self) -> int:
        """Responses per step: prompts_per_step x n_samples_per_prompt."""
        return self.prompts_per_step * self.n_samples_per_prompt
