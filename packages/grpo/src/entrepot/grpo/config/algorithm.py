"""The GRPO objective, optimiser and schedule: the `algorithm` section."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Literal

from entrepot.grpo.config.correction import CorrectionConfig
from entrepot.grpo.config.distill import DistillConfig
from entrepot.grpo.config.fields import check, check_choice, doc

__all__ = ["AdvantageKind", "AlgorithmConfig", "KLKind", "LossAgg", "LossKind"]

AdvantageKind = Literal["grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]

KLKind = Literal["k1", "abs", "mse", "low_var_kl", "k3", "clamped"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
LossKind = Literal["ppo_clip", "gspo", "cispo"]


@dataclass(kw_only=True)
class AlgorithmConfig:
    """GRPO objective, optimiser and schedule."""

    kl_coef: float = field(
        default=0.04,
        metadata=doc("Weight of the KL penalty to the reference model; 0 skips the reference stage."),
    )
    kl_kind: KLKind = field(
        default="low_var_kl", metadata=doc("KL estimator: k1, abs, mse, low_var_kl (= k3), clamped.")
    )
    kl_in_reward: bool = field(
        default=False, metadata=doc("Subtract the KL from the reward instead of adding it to the loss.")
    )
    clip_low: float = field(default=0.2, metadata=doc("PPO ratio clip below 1 (ratio >= 1 - clip_low)."))
    clip_high: float = field(
        default=0.2, metadata=doc("PPO ratio clip above 1 (ratio <= 1 + clip_high; DAPO clip-higher).")
    )
    loss: LossKind = field(
        default="ppo_clip",
        metadata=doc(
            "Policy loss: ppo_clip (token ratio, clipped), gspo (sequence ratio exp(mean log-ratio), "
            "clipped; use seq-mean-token-mean and small clips, e.g. 3e-4 / 4e-4) or cispo (REINFORCE "
            "with clipped stop-gradient IS weights; clip_low / clip_high bound the weight). Formulas: "
            "the loss table in the grpo package's docs/losses.md."
        ),
    )
    entropy_coef: float = field(default=0.0, metadata=doc("Entropy bonus weight (subtracted from the loss)."))
    loss_agg: LossAgg = field(
        default="token-mean",
        metadata=doc(
            "token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm (token "
            "sums over responses x loss_horizon: Dr. GRPO's constant normaliser)."
        ),
    )
    loss_horizon: int | None = field(
        default=None,
        metadata=doc(
            "The constant of seq-mean-token-sum-norm, in tokens; None = the generation budget "
            "(rollout.max_new_tokens, or what the task allows)."
        ),
    )
    mask_truncated: bool = field(
        default=False,
        metadata=doc(
            "DAPO overlong filtering: responses cut at the generation budget (no stop token) get no "
            "loss and do not count in the loss's normaliser (metric train/truncated_frac)."
        ),
    )
    advantage: AdvantageKind = field(
        default="grpo",
        metadata=doc(
            "Advantage estimator: grpo (group-normalised reward; normalize_std), rloo (leave-one-out "
            "group baseline), reinforce_pp (REINFORCE++: the reward whitened over the step's model "
            "tokens) or reinforce_pp_baseline (group mean subtracted, then whitened). Formulas: the "
            "grpo docs' advantages page. gae is refused: it needs a value model (PPO critic)."
        ),
    )
    normalize_std: bool = field(
        default=True,
        metadata=doc("grpo advantage: divide group-centred rewards by the group std (False = Dr. GRPO)."),
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata=doc(
            "DAPO dynamic sampling: after the reward stage, prompt groups whose rewards all agree "
            "(zero variance, so zero advantage) are dropped from the dock and as many new prompts are "
            "generated and scored, until the step holds rollout.prompts_per_step varied groups or "
            "max_resample_rounds extra rounds ran; then the step trains on the varied groups it has "
            "(metrics sampling/groups_dropped, sampling/rounds, sampling/groups_kept)."
        ),
    )
    max_resample_rounds: int = field(
        default=3,
        metadata=doc(
            "Extra generate + reward rounds dynamic sampling may run per step to refill dropped groups."
        ),
    )
    epochs: int = field(default=1, metadata=doc("Passes of the actor update over each step's batch."))
    mini_batch_size: int | None = field(
        default=None,
        metadata=doc(
            "Responses per optimiser step; None = the whole step batch. Multiple of n_samples_per_prompt."
        ),
    )
    lr: float = field(default=1e-3, metadata=doc("Adam learning rate."))
    adam_betas: tuple[float, float] = field(default=(0.9, 0.999), metadata=doc("Adam betas."))
    weight_decay: float = field(default=0.0, metadata=doc("AdamW weight decay."))
    warmup_steps: int = field(default=0, metadata=doc("Linear LR warm-up steps (0 = none)."))
    lr_schedule: Literal["constant", "cosine"] = field(
        default="constant", metadata=doc("LR after warm-up: constant or cosine to 0.")
    )
    grad_clip: float | None = field(
        default=1.0, metadata=doc("Clip the global grad norm to this; None disables.")
    )

    correction: CorrectionConfig = field(
        default_factory=CorrectionConfig,
        metadata=doc(
            "Off-policy correction of the train / inference mismatch: a detached weight or mask on "
            "each token's surrogate loss from rho = exp(trainer log-prob - rollout log-prob) "
            "(kind, level, cap, low, high; metrics offpolicy/*). KL and entropy are not reweighted."
        ),
    )
    distill: DistillConfig = field(
        default_factory=DistillConfig,
        metadata=doc(
            "On-policy distillation: a teacher's log-probs of the rollout's tokens give each model token "
            "the advantage reward_weight * A_seq + coef * (teacher - student log-prob), at the rollout's "
            "temperature (teacher, coef, reward_weight; metrics distill/*). The grpo docs' distillation page."
        ),
    )

    def __post_init__(self) -> None:
        check(self.kl_coef >= 0, "algorithm.kl_coef", self.kl_coef, ">= 0")
        check_choice("algorithm.kl_kind", self.kl_kind, typing.get_args(KLKind))
        check_choice("algorithm.loss", self.loss, typing.get_args(LossKind))
        check_choice("algorithm.loss_agg", self.loss_agg, typing.get_args(LossAgg))
        check(self.advantage != "gae", "algorithm.advantage", self.advantage,
              "a built estimator: gae needs a value model (PPO critic), not available yet")  # fmt: skip
        check_choice("algorithm.advantage", self.advantage, typing.get_args(AdvantageKind))
        check(self.normalize_std or self.advantage == "grpo", "algorithm.normalize_std", self.normalize_std,
              f"true unless algorithm.advantage='grpo' ({self.advantage!r} does not read it)")  # fmt: skip
        if self.loss_horizon is not None:
            check(self.loss_horizon >= 1, "algorithm.loss_horizon", self.loss_horizon, ">= 1 or null")
        check_choice("algorithm.lr_schedule", self.lr_schedule, ("constant", "cosine"))
        check(0 <= self.clip_low < 1, "algorithm.clip_low", self.clip_low, "in [0, 1)")
        check(self.clip_high >= 0, "algorithm.clip_high", self.clip_high, ">= 0")
        check(self.entropy_coef >= 0, "algorithm.entropy_coef", self.entropy_coef, ">= 0")
        check(self.epochs >= 1, "algorithm.epochs", self.epochs, ">= 1")
        check(
            self.max_resample_rounds >= 0, "algorithm.max_resample_rounds", self.max_resample_rounds, ">= 0"
        )
        check(self.lr > 0, "algorithm.lr", self.lr, "> 0")
        check(
            len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas),
            "algorithm.adam_betas",
            self.adam_betas,
            "two numbers in [0, 1)",
        )
        check(self.weight_decay >= 0, "algorithm.weight_decay", self.weight_decay, ">= 0")
        check(self.warmup_steps >= 0, "algorithm.warmup_steps", self.warmup_steps, ">= 0")
        if self.grad_clip is not None:
            check(self.grad_clip > 0, "algorithm.grad_clip", self.grad_clip, "> 0 or null")
        if self.mini_batch_size is not None:
            check(
                self.mini_batch_size >= 1, "algorithm.mini_batch_size", self.mini_batch_size, ">= 1 or null"
            )
