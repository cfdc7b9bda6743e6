"""LoRA adapters on the policy (torch engine, through peft): the `model.lora` section."""

from __future__ import annotations

from dataclasses import dataclass, field

from entrepot.grpo.config.fields import check, doc

__all__ = ["LoraConfig"]


@dataclass(kw_only=True)
class LoraConfig:
    """Low-rank adapters trained on a frozen policy (peft); rank 0 trains every weight."""

    rank: int = field(
        default=0,
        metadata=doc(
            "LoRA rank r (0 = off: full training). On: only the adapters get gradients and optimizer "
            "state; the rollout engine receives merged weights (W + alpha / r B A)."
        ),
    )
    alpha: float = field(
        default=16.0, metadata=doc("LoRA alpha: the adapters' update is scaled by alpha / rank.")
    )
    dropout: float = field(
        default=0.0, metadata=doc("Dropout on the adapters' input while training, in [0, 1).")
    )
    target_modules: list[str] | None = field(
        default=None,
        metadata=doc(
            "Module names the adapters wrap (e.g. [q_proj, v_proj]); None = peft's default for the "
            "architecture (GPT-2: c_attn; Qwen2: q_proj, v_proj)."
        ),
    )

    modules_to_save: list[str] = field(
        default_factory=list,
        metadata=doc(
            "Modules trained in full beside the adapters (peft's modules_to_save), e.g. [ln_f]: a model "
            "whose output scale must grow (the embedded default from random weights) needs its final norm."
        ),
    )

    def __post_init__(self) -> None:
        check(self.rank >= 0, "model.lora.rank", self.rank, ">= 0 (0 = off)")
        check(self.alpha > 0, "model.lora.alpha", self.alpha, "> 0")
        check(0 <= self.dropout < 1, "model.lora.dropout", self.dropout, "in [0, 1)")
        if self.target_modules is not None:
            check(
                bool(self.target_modules) and all(isinstance(m, str) and m for m in self.target_modules),
                "model.lora.target_modules",
                self.target_modules,
                "a non-empty list of module names, or null",
            )

    @property
    def enabled(self) -> bool:
        """Whether adapters are trained (rank > 0)."""
        return self.rank > 0
